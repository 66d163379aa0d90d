"""What a logging step records: the ``stats`` and ``grads`` probes' rows, parameters, drift.

A logging step attaches the existing probes for one step; their reports are the mergeable
ones, so ranks merge exactly as ``stats`` and ``grads`` do under torchrun. A layer row is a
``stats`` row plus the gradient at the call's output.
"""

from __future__ import annotations

import fnmatch
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookscope.checks.baseline import read_stats
from hookscope.core.errors import param
from hookscope.core.hooks import Call, Hooks
from hookscope.core.mergeable import Merges, state
from hookscope.core.select import Selection, Site
from hookscope.numerics.drift import quantile_drift, stat_drift
from hookscope.numerics.health import DEAD, grad_flags, sensitivity
from hookscope.numerics.sketch import parse_percentiles
from hookscope.probes.grads import GradReport, GradsProbe
from hookscope.probes.stats import StatsProbe, StatsReport

__all__ = ["DEAD", "Drift", "Health", "LoggingStep", "ParamTracker", "layer_rows", "number", "step_line"]

#: Autograd's execution engine (for callbacks at the end of a backward pass).
_ENGINE = torch.autograd.Variable._execution_engine


@dataclass(frozen=True)
class _Chosen(Selection):
    """A selection already made, once per watch: its ``sites``, not walked again each
    logging step (the watch's tracer calls the probes, which hook nothing themselves)."""

    chosen: tuple[Site, ...] = ()

    def sites(self, model: nn.Module) -> list[Site]:
        return list(self.chosen)


class LoggingStep:
    """The probes attached for one logging step (``sites``: the watch's, selected once;
    ``hooks``: the step's gradient hooks, removed after it; ``percentiles``: also taken of
    each call's output, for drift)."""

    def __init__(self, model: nn.Module, sites: Sequence[Site], hooks: Hooks,
                 percentiles: Sequence[float] = ()) -> None:
        select = _Chosen(chosen=tuple(sites))
        self.stats = StatsProbe(model, select=select, percentiles=tuple(percentiles) or None)
        trainable = any(p.requires_grad for p in model.parameters())
        self.grads = GradsProbe(model, select=select) if trainable else None
        if self.grads is not None:
            self.grads.bind(hooks)

    def enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.stats.on_enter(call, args, kwargs)  # without input stats, only shapes: no grad mode

    def exit(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        with torch.no_grad():
            self.stats.on_exit(call, args, kwargs, output)
        if self.grads is not None:
            self.grads.on_exit(call, args, kwargs, output)

    def reports(self) -> tuple[StatsReport, GradReport | None]:
        """This rank's reports (mergeable across ranks)."""
        self.stats.table.flush()
        grads = None
        if self.grads is not None:
            grads = GradReport(self.grads.entries(), [], loss="", targets=[],
                               objective=math.nan, input_shape=None,
                               vanish=self.grads.vanish, explode=self.grads.explode)
        return self.stats.finish(), grads


@dataclass(frozen=True)
class StepReports(Merges):
    """A logging step's two reports, merged as one across ranks."""

    stats: StatsReport = state("merge")
    grads: GradReport | None = state("merge")


def layer_rows(reports: StepReports) -> list[dict[str, Any]]:
    """One row per selected call, in execution order: the ``stats`` row and the gradient
    at the call's output (``grad_norm``, ``grad_mean``, ``grad_std``, ``grad_nonfinite``;
    null where no gradient reached it), and empty ``flags`` (:class:`Health` sets them)."""
    grads = {(g.name, g.call): g for g in (reports.grads.layers if reports.grads else [])}
    rows = []
    for layer in reports.stats.layers:
        g = grads.get((layer.name, layer.call))
        rows.append(layer.to_dict() | {f"grad_{key}": getattr(g, key) if g else None
                                       for key in ("norm", "mean", "std", "nonfinite")}
                    | {"flags": []})
    return rows


def _output_norm(row: Mapping[str, Any]) -> float:
    """‖y‖ of a row's outputs, from their element count, mean and (unbiased) std."""
    n = sum(math.prod(shape) for shape in row.get("output_shapes") or [row.get("output_shape") or []])
    mean, std = row["mean"], row["std"] if n > 1 else 0.0
    return math.sqrt(n * mean * mean + (n - 1) * std * std) \
        if math.isfinite(mean) and math.isfinite(std) else math.nan


class Health:
    """The rows' health flags (docs/watch.md, Layer flags): ``nonfinite`` but for an
    ``allow_inf`` module, ``dead``, and the gradient's (:func:`hookscope.numerics.health.grad_flags`)
    against each call's first healthy sensitivity, which is kept."""

    def __init__(self, allow_inf: Sequence[str] = ()) -> None:
        self.allow_inf, self.first = tuple(allow_inf), dict[tuple[str, int], float]()

    def apply(self, rows: list[dict[str, Any]], loss: float | None) -> None:
        """Flag each row (``loss``: this step's, or None)."""
        for row in rows:
            nonfinite = row["nonfinite"] or row["grad_nonfinite"]
            if nonfinite and not any(fnmatch.fnmatchcase(row["name"], p) for p in self.allow_inf):
                row["flags"].append("nonfinite")
            if math.isfinite(row["zero_fraction"]) and row["zero_fraction"] >= DEAD:
                row["flags"].append("dead")
            norm = row["grad_norm"]
            if norm is None or nonfinite:
                continue
            sens, key = sensitivity(norm, _output_norm(row), loss), (row["name"], row["call"])
            flags = grad_flags(norm, sens, self.first.get(key))
            if not flags and math.isfinite(sens):  # the first healthy value is the reference
                self.first.setdefault(key, sens)
            if "dead" not in row["flags"] or norm == 0:
                row["flags"] += flags


def number(loss: Any) -> float | None:
    """A loss given to ``watch.step()`` as a float (None: none given)."""
    if loss is None:
        return None
    return float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)


def step_line(index: int, loss: float | None, rows: list[dict[str, Any]],
              params: Any) -> dict[str, Any]:
    """A logging step's line of ``watch.jsonl``: its loss (when given), rows and params, and
    the rows that carry a flag."""
    line: dict[str, Any] = {"step": index, "time": time.time()}
    if loss is not None:
        line["loss"] = loss
    return line | {"layers": rows, "params": params,
                   "flagged": [{"name": r["name"], "call": r["call"], "flags": r["flags"]}
                               for r in rows if r["flags"]]}


class ParamTracker:
    """Each parameter's norm, gradient norm and update ratio at logging steps.

    The gradient norm is read at the end of each backward pass that reached the parameter,
    so ``optimizer.zero_grad()`` before ``watch.step()`` loses nothing: a
    post-accumulate-grad hook queues a callback on autograd's engine, which queues the
    reading behind every callback queued so far. Under DDP the reducer's callback (writing
    the ranks' averaged gradient into ``.grad``) is among those, so the norm is that of the
    gradient the optimiser uses. ``w_prev`` of the update ratio is one kept copy of the weights.
    """

    def __init__(self, model: nn.Module) -> None:
        self.params = list(model.named_parameters())
        self.grad_norms: dict[int, torch.Tensor] = {}
        self.previous: list[torch.Tensor] | None = None
        self._reached: set[int] = set()

    def attach(self, hooks: Hooks) -> None:
        """Hook each trainable parameter's gradient for this step."""
        self.grad_norms.clear()
        self._reached.clear()
        for i, (_, p) in enumerate(self.params):
            if p.requires_grad:
                hooks.keep(p.register_post_accumulate_grad_hook(partial(self._on_grad, i)))

    def _on_grad(self, index: int, p: torch.Tensor) -> None:
        if not self._reached:
            _ENGINE.queue_callback(self._behind)
        self._reached.add(index)

    def _behind(self) -> None:
        _ENGINE.queue_callback(self._read)

    def _read(self) -> None:
        reached, self._reached = sorted(self._reached), set()
        grads = [(i, g.detach()) for i in reached
                 if (g := self.params[i][1].grad) is not None]
        if grads:
            norms = torch._foreach_norm([g for _, g in grads])
            self.grad_norms |= {i: n.float() for (i, _), n in zip(grads, norms, strict=True)}

    def nonfinite(self) -> list[str]:
        """The parameters holding NaN or ±inf (one read: their largest magnitudes)."""
        if not self.params:
            return []
        with torch.no_grad():
            peaks = torch._foreach_norm([p.detach() for _, p in self.params], math.inf)
            finite = torch.stack([n.float().to(peaks[0].device) for n in peaks]).isfinite().tolist()
        return [name for (name, _), ok in zip(self.params, finite, strict=True) if not ok]

    def rows(self) -> list[dict[str, Any]]:
        """``name``, ``norm``, ``grad_norm`` and ``update_ratio`` of each parameter (one
        transfer to the host), and the weights kept for the next logging step's ratios."""
        if not self.params:
            return []
        with torch.no_grad():
            weights = [p.detach() for _, p in self.params]
            count = len(weights)
            norms = torch._foreach_norm(weights)
            missing = norms[0].new_full((), math.nan)
            deltas: Sequence[torch.Tensor] = [missing] * count
            if self.previous is None:
                self.previous = [w.clone() for w in weights]
            else:  # in place: the kept weights less the new ones, whose norm is the update's
                torch._foreach_sub_(self.previous, weights)
                deltas = torch._foreach_norm(self.previous)
                torch._foreach_copy_(self.previous, weights)
            grads = [self.grad_norms.get(i, missing) for i in range(count)]
            # One stack (dtypes promoted, then float32) and one transfer: a (count, 3) list.
            host = torch.stack([*norms, *grads, *deltas]).float().view(3, count).T.tolist()
        return [{"name": name, "norm": n, "grad_norm": g if i in self.grad_norms else None,
                 "update_ratio": d / n if math.isfinite(d) and n > 0 else None}
                for i, ((name, _), (n, g, d)) in enumerate(zip(self.params, host, strict=True))]


class Drift:
    """Each call's distance to a reference (docs/watch.md, Drift): with percentiles, the
    distribution drift of ``check``'s ``max_drift``; without, the larger of its mean and std
    drifts. ``reference``: rows by (name, call), a ``stats`` document's (None: the first
    logging step's); rows whose drift exceeds ``limit`` are flagged ``drift``.
    """

    def __init__(self, reference: Mapping[tuple[str, int], Mapping[str, Any]] | None,
                 limit: float, percentiles: tuple[float, ...] = ()) -> None:
        self.reference, self.limit, self.percentiles = reference, limit, percentiles

    @property
    def measure(self) -> str:
        """``"quantile"`` or ``"mean_std"``."""
        return "quantile" if self.percentiles else "mean_std"

    @classmethod
    def of(cls, path: str | Path | None, limit: float,
           percentiles: str | Sequence[float] | None = None) -> Drift:
        """The reference in a ``stats --format json`` document at ``path`` (None: the first
        logging step); the percentiles taken are ``percentiles``, else the reference's.

        Raises:
            HookscopeError: the file is missing, unreadable or not a stats document; bad
                percentiles.
        """
        taken = parse_percentiles(percentiles)
        if path is None:
            return cls(None, limit, taken)
        rows, found, *_ = read_stats(Path(path), param("reference"))
        return cls(rows, limit, taken or tuple(float(key) for key in found))

    def apply(self, rows: list[dict[str, Any]]) -> None:
        """Add ``drift`` to each row (null when the reference lacks the call) and flag it."""
        if self.reference is None:
            self.reference = {(r["name"], r["call"]): dict(r) for r in rows}
        for row in rows:
            base = self.reference.get((row["name"], row["call"]))
            row["drift"] = None if base is None else self._distance(row, base)
            if row["drift"] is not None and row["drift"] > self.limit:
                row["flags"].append("drift")

    def _distance(self, row: Mapping[str, Any], base: Mapping[str, Any]) -> float | None:
        if self.percentiles:
            return quantile_drift(base.get("percentiles"), row.get("percentiles"),
                                  base.get("std"), base.get("mean"))
        return max(stat_drift("mean", row.get("mean"), base), stat_drift("std", row.get("std"), base))
