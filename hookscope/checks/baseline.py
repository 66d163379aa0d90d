"""The baseline of ``hookscope check``: a ``hookscope stats --format json`` document read back
as its per-call rows. A missing, unreadable or foreign document is a
:class:`~hookscope.core.errors.HookscopeError` naming it, raised before the model runs.
Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookscope.checks.rulefile import Rules, describe
from hookscope.core.errors import HookscopeError

__all__ = ["Baseline", "drift_percentiles", "load_baseline", "read_stats"]


@dataclass(frozen=True)
class Baseline:
    """The per-call rows of a stats document by (name, call), and the percentiles its rows
    hold (their JSON keys, in order; empty without)."""

    path: str
    model: str | None
    rows: Mapping[tuple[str, int], Mapping[str, Any]]
    percentiles: tuple[str, ...] = ()
    #: The rules' ``max_drift`` is set: the run takes these percentiles too.
    drift: bool = False


def drift_percentiles(baseline: Baseline | None) -> tuple[float, ...] | None:
    """The percentiles a run takes for ``max_drift``: the baseline's (None when not asked)."""
    if baseline is None or not baseline.drift:
        return None
    return tuple(float(key) for key in baseline.percentiles)


def _read_json(path: Path, subject: str) -> Any:
    shown = f"{subject} {str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HookscopeError(f"{shown} not found; write one with `hookscope stats MODEL "
                             f"INPUT... --format json -o {path.name}`.") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise HookscopeError(f"{shown} cannot be read: {reason}.") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise HookscopeError(f"{shown} is not JSON (line {exc.lineno}: {exc.msg}); give a "
                             "`hookscope stats --format json` document.") from None


def _baseline_rows(doc: Any) -> dict[tuple[str, int], Mapping[str, Any]] | str:
    """The rows by call, or why ``doc`` is not a stats document."""
    if not isinstance(doc, dict):
        return f"it holds {describe(doc)}"
    if doc.get("command") != "stats":
        return f"its command is {doc.get('command')!r}"
    layers = doc.get("layers")
    if not isinstance(layers, list):
        return "it has no layers list"
    rows: dict[tuple[str, int], Mapping[str, Any]] = {}
    for i, row in enumerate(layers):
        if not (isinstance(row, dict) and isinstance(row.get("name"), str)
                and isinstance(row.get("call"), int) and "mean" in row and "std" in row):
            return f"its layer {i} lacks name, call, mean or std"
        rows[(row["name"], row["call"])] = row
    return rows


def read_stats(path: Path, subject: str) -> tuple[dict[tuple[str, int], Mapping[str, Any]],
                                                  tuple[str, ...], dict[str, Any]]:
    """A stats document's rows by call, the percentiles its rows hold, and the document;
    HookscopeError, naming it as ``subject``, when it is missing, unreadable or not one."""
    doc = _read_json(path, subject)
    rows = _baseline_rows(doc)
    if isinstance(rows, str):
        raise HookscopeError(f"{subject} {str(path)!r} is not a `hookscope stats --format json` "
                             f"document: {rows}.")
    found: Mapping[str, Any] = next((row["percentiles"] for row in rows.values()
                                     if isinstance(row.get("percentiles"), dict)
                                     and row["percentiles"]), {})
    return rows, tuple(found), doc


def load_baseline(rules: Rules) -> Baseline | None:
    """Read the rules' baseline, when they have one (errors as :func:`read_stats`'s)."""
    if rules.baseline is None:
        return None
    rows, found, doc = read_stats(rules.baseline, rules.subject("baseline"))
    if rules.max_drift is not None and not found:
        raise HookscopeError(f"{rules.subject('max_drift')} needs percentiles in the baseline "
                             f"{str(rules.baseline)!r}: write it with `hookscope stats MODEL "
                             f"INPUT... --percentiles 1,5,25,50,75,95,99 --format json`.")
    return Baseline(str(rules.baseline), doc.get("model"), rows, found,
                    drift=rules.max_drift is not None)
