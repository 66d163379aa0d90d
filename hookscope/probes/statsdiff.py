"""``hookscope diff a.json b.json``: two saved ``stats`` documents compared call by call.

Calls are paired by (name, call index); :func:`hookscope.checks.baseline.read_stats` reads the
documents. Torch-free: an offline diff never imports torch (nor does the command that runs it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hookscope.core.errors import CheckFailed
from hookscope.core.files import envelope
from hookscope.core.mergeable import Row
from hookscope.numerics.drift import finite, quantile_drift

__all__ = ["DEFAULT_TOLERANCE", "STATS", "CallRef", "Comparison", "StatsDelta", "StatsDiffReport",
           "diff_stats"]

#: A call whose output's relative L2 error exceeds this is where two runs part: above float32
#: noise (at most 1.3e-6), below float16 and bfloat16 error (see the README).
DEFAULT_TOLERANCE = 1e-3
Key = tuple[str, int]


@dataclass(frozen=True)
class CallRef(Row):
    """A module call seen on one side only."""

    name: str
    type: str
    call: int


@dataclass(frozen=True)
class Comparison:
    """Two runs compared call by call: ``layers`` in A's execution order (with ``excess``,
    ``relative`` and ``to_dict``) and the calls seen on one side only."""

    tolerance: float
    layers: list[Any]
    unmatched_a: list[CallRef]
    unmatched_b: list[CallRef]
    #: The name of a row's relative difference in ``first_divergence``.
    measure: ClassVar[str] = "rel"
    #: ``failure``'s message when only the top-1 predictions differ (for how many, of how many).
    predictions_differ: ClassVar[str] = "the saved top-1 predictions differ for {} of {} inputs."

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        """The first call that exceeds the tolerance, as JSON."""
        for row in self.layers:
            if (reason := row.excess(self.tolerance)) is not None:
                return {"name": row.name, "type": row.type, "call": row.call,
                        self.measure: row.relative, "reason": reason}
        return None

    @property
    def agreement(self) -> tuple[int, int] | None:
        """(inputs whose top-1 predictions agree, inputs), when both sides have them."""
        return None

    @property
    def failed(self) -> bool:
        """A call exceeds the tolerance, or the top-1 predictions differ for some input."""
        agree, n = self.agreement or (0, 0)
        return self.first_divergence is not None or agree < n

    def failure(self) -> CheckFailed:
        """The error for ``fail``: where the runs part."""
        first = self.first_divergence
        if first is None:
            agree, n = self.agreement or (0, 0)
            return CheckFailed(self.predictions_differ.format(n - agree, n))
        call = f" (call {first['call']})" if first["call"] else ""
        what = {"shape": "the output shapes differ", "nonfinite": "the non-finite counts differ",
                "null": "a statistic is null (non-finite) on one side only"}
        detail = what.get(first["reason"]) or f"relative error {first[self.measure]:.3g}"
        return CheckFailed(f"the runs part at {first['name']}{call}: {detail} (tolerance "
                           f"{self.tolerance:g}).")

    def _document(self, outputs: dict[str, Any] | None) -> dict[str, Any]:
        """The JSON fields both kinds of diff share, in order."""
        return {"tolerance": self.tolerance, "first_divergence": self.first_divergence,
                "outputs": outputs, "layers": [row.to_dict(self.tolerance) for row in self.layers],
                "unmatched_a": [r.to_dict() for r in self.unmatched_a],
                "unmatched_b": [r.to_dict() for r in self.unmatched_b]}


#: The statistics an offline diff compares.
STATS = ("mean", "std", "zero_fraction", "nonfinite")


def _number(value: Any) -> float:
    number = finite(value)  # the documents write non-finite values as null
    return math.nan if number is None else number


@dataclass(frozen=True)
class StatsDelta:
    """One call's statistics on both sides: each as a, b, b − a and a relative change: the
    mean's relative to max(|mean_a|, std_a) (a mean near zero is measured against its
    spread), the others' to their A value."""

    name: str
    type: str
    call: int
    shape: list[int] | None
    shape_b: list[int] | None
    a: dict[str, float]
    b: dict[str, float]
    #: :func:`~hookscope.numerics.drift.quantile_drift`; None without percentiles in common.
    drift: float | None = None

    def change(self, stat: str) -> tuple[float, float]:
        """(b − a, relative change) of one statistic."""
        delta = self.b[stat] - self.a[stat]
        scale = max(abs(self.a["mean"]), self.a["std"]) if stat == "mean" else abs(self.a[stat])
        if delta == 0:
            return delta, 0.0
        return delta, abs(delta) / scale if scale else math.inf

    @property
    def relative(self) -> float:
        """The larger relative change of the mean and the std."""
        return max(self.change("mean")[1], self.change("std")[1])

    def excess(self, tolerance: float) -> str | None:
        if self.shape_b != self.shape:
            return "shape"
        if self.a["nonfinite"] != self.b["nonfinite"]:
            return "nonfinite"
        if any(math.isnan(self.a[s]) != math.isnan(self.b[s]) for s in STATS):
            return "null"  # a statistic non-finite on one side only: no tolerance covers it
        return "rel" if self.relative > tolerance else None

    def to_dict(self, tolerance: float) -> dict[str, Any]:
        row: dict[str, Any] = {"name": self.name, "type": self.type, "call": self.call,
                               "shape": self.shape, "shape_b": self.shape_b}
        for stat in STATS:
            delta, rel = self.change(stat)
            row |= {f"{stat}_a": self.a[stat], f"{stat}_b": self.b[stat],
                    f"{stat}_delta": delta, f"{stat}_rel": rel}
        return row | {"rel": self.relative, "exceeds": self.excess(tolerance) is not None,
                      "drift": self.drift}


def _top1(doc: Mapping[str, Any]) -> list[int | None]:
    return [preds[0]["index"] if preds else None for preds in doc.get("predictions") or []]


@dataclass(frozen=True)
class StatsDiffReport(Comparison):
    """Two saved ``stats`` documents compared call by call."""

    envelope: dict[str, Any]
    top1: tuple[list[int | None], list[int | None]] = ([], [])

    @property
    def agreement(self) -> tuple[int, int] | None:
        a, b = self.top1
        if not a or len(a) != len(b):
            return None
        return sum(x == y for x, y in zip(a, b, strict=True)), len(a)

    def to_dict(self) -> dict[str, Any]:
        """The whole JSON document, envelope included."""
        agreement = self.agreement
        outputs = None if agreement is None else {
            "inputs": agreement[1], "top1_agree": agreement[0],
            "top1_agreement": agreement[0] / agreement[1] if agreement[1] else math.nan,
            "max_abs_logit": None, "kl_mean": None, "kl_max": None}
        return self.envelope | self._document(outputs)


def _rows(doc: Mapping[str, Any]) -> dict[Key, Mapping[str, Any]]:
    return {(str(row["name"]), int(row.get("call") or 0)): row for row in doc["layers"]}


def _envelope(a: Mapping[str, Any], b: Mapping[str, Any], files: tuple[Path, Path]
              ) -> dict[str, Any]:
    """An offline document's envelope: A's, and B's under ``against``."""
    keys = ("model", "weights", "device", "source", "precision", "inputs")
    return envelope("diff", model=a.get("model"), weights=a.get("weights"),
                    device=a.get("device"), inputs=a.get("inputs") or [], offline=True,
                    files=[str(files[0]), str(files[1])],
                    against={k: b.get(k) for k in keys}, input_shape=a.get("input_shape"))


def diff_stats(a: Mapping[str, Any], b: Mapping[str, Any], *,
               tolerance: float = DEFAULT_TOLERANCE,
               files: tuple[Path, Path] = (Path("a.json"), Path("b.json"))) -> StatsDiffReport:
    """Compare two ``stats`` documents call by call, paired by (name, call)."""
    rows_a, rows_b = _rows(a), _rows(b)

    def only(rows: dict[Key, Mapping[str, Any]], other: dict[Key, Mapping[str, Any]]) -> list[CallRef]:
        return [CallRef(k[0], str(r.get("type")), k[1]) for k, r in rows.items() if k not in other]

    layers = [StatsDelta(key[0], str(row.get("type")), key[1], row.get("output_shape"),
                         other.get("output_shape"), {s: _number(row.get(s)) for s in STATS},
                         {s: _number(other.get(s)) for s in STATS},
                         quantile_drift(row.get("percentiles"), other.get("percentiles"),
                                        row.get("std"), row.get("mean")))
              for key, row in rows_a.items() if (other := rows_b.get(key)) is not None]
    return StatsDiffReport(tolerance, layers, only(rows_a, rows_b), only(rows_b, rows_a),
                           _envelope(a, b, files), (_top1(a), _top1(b)))
