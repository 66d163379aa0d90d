"""``hookscope check LOG_DIR`` (torch-free): engine's ``nonfinite`` and ``max_zero_fraction``
read the layer rows of the last ``last`` logging steps (``nonfinite`` also the event), and
the rules registered here, in the one registry, bound their gradient norms and update ratios.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hookscope.checks import engine
from hookscope.checks.engine import CheckContext, CheckReport, RuleResult, fmt, row_id
from hookscope.checks.rulefile import Rules
from hookscope.core.files import envelope
from hookscope.numerics.drift import finite

if TYPE_CHECKING:
    from hookscope.training.log_reader import TrainingLog

__all__ = ["LogCall", "LogView", "evaluate_log", "event_text", "log_doc"]

@dataclass(frozen=True)
class LogCall:
    """One layer call at one logging step, as the per-call rules read it."""

    name: str
    call: int
    step: int
    nonfinite: int  # in the output and in the gradient at the output
    zero_fraction: float
    grad_norm: float | None


@dataclass(frozen=True)
class LogView:
    """What the log rules see: the steps checked, their parameters, and the event in words."""

    steps: list[Mapping[str, Any]]
    params: list[tuple[int, Mapping[str, Any], int]]  # (step, row, the steps its ratio spans)
    event: str | None
    outcome: str | None  # what the watch did on the event (TrainingLog.outcome)

    def span(self) -> str:
        """``3 logging steps (steps 200 to 400)``."""
        n = len(self.steps)
        if n < 2:
            return f"1 logging step (step {self.steps[0]['step']})" if n else "no logging step"
        return f"{n} logging steps (steps {self.steps[0]['step']} to {self.steps[-1]['step']})"


def _calls(log: TrainingLog, steps: list[Mapping[str, Any]]) -> Iterator[LogCall]:
    """The rows (their types checked by the reader) as calls; an ``allow_inf`` module's count
    is 0 (its NaN, which the watch still checked, is the event)."""
    for step in steps:
        for row in step.get("layers") or ():
            zero = finite(row.get("zero_fraction"))
            bad = (row.get("nonfinite") or 0) + (row.get("grad_nonfinite") or 0)
            yield LogCall(row["name"], row.get("call") or 0, step["step"],
                          0 if log.allowed(row["name"]) else bad,
                          math.nan if zero is None else zero, finite(row.get("grad_norm")))


def event_text(event: Mapping[str, Any] | None) -> str | None:
    """The event in one line: its own message, else its step, phase and module."""
    if event is None:
        return None
    message = event.get("message")
    if isinstance(message, str) and message.strip():
        return " ".join(message.split())
    rank = f"rank {event['rank']}, " if event.get("rank") is not None else ""
    return (f"step {event.get('step')}, {rank}{event.get('phase')}: {event.get('module')} "
            f"(call {event.get('call')}) produced a non-finite value")


def evaluate_log(rules: Rules, log: TrainingLog) -> CheckReport:
    """Run every active rule against the last ``rules.last`` logging steps of ``log``."""
    last = rules.only("log").last
    steps = list(log.steps[-last:] if last else log.steps)
    every = [(s["step"], p, log.span(s["step"])) for s in steps for p in s.get("params") or ()]
    params = [entry for entry in every if not engine.ignored(entry[1]["name"], rules.ignore)]
    view = LogView(steps, params, event_text(log.event), log.outcome())
    return engine.verdict(rules, list(_calls(log, steps)), [p["name"] for _, p, _ in every], log=view)


# ----------------------------------------------------------------------------- the rules

def _grad_norms(ctx: CheckContext, view: LogView) -> list[tuple[str, float | None]]:
    calls: list[LogCall] = ctx.calls  # type: ignore[assignment]  # a log's rows
    layers = [(row_id(c), c.grad_norm) for c in calls]
    params = [(f"parameter {p['name']} at step {step}", finite(p.get("grad_norm")))
              for step, p, _ in view.params]
    return layers + params


def _ratios(ctx: CheckContext, view: LogView) -> list[tuple[str, float | None]]:
    """Each update ratio per step: the logged ratio over the steps it spans (docs/watch.md)."""
    return [(f"parameter {p['name']} at step {step}", None if (r := finite(p.get("update_ratio")))
             is None else r / span) for step, p, span in view.params]


def _bound_rule(name: str, what: str,
                values: Callable[[CheckContext, LogView], list[tuple[str, float | None]]],
                side: str) -> Callable[[CheckContext], RuleResult | None]:
    """The rule ``name``: no ``what`` of ``values`` (who, value) is ``side`` the limit."""
    above = side == "above"

    def check(ctx: CheckContext) -> RuleResult | None:
        view: LogView | None = ctx.log
        limit = getattr(ctx.rules, name)
        if limit is None or view is None:
            return None
        measured = [(who, v) for who, v in values(ctx, view) if v is not None]
        bad = [(who, v) for who, v in measured if (v > limit if above else v < limit)]
        worst = (max if above else min)(measured, key=lambda m: m[1], default=None)
        extreme = f"; the {'largest' if above else 'smallest'}: {fmt(worst[1])} at " \
            f"{worst[0]}" if worst is not None else ""
        detail = (f"{len(bad)} of {len(measured)} {what}s over {view.span()} are {side} "
                  f"{limit:.4g}" if bad else
                  f"no {what} of {len(measured)} over {view.span()} is {side} {limit:.4g}")
        offenders = [f"{who}: {what} {fmt(v)}" for who, v in bad]
        return RuleResult(name, not bad, limit, detail + extreme + ctx.note(), offenders)

    return check


#: The log's bounds, registered in check's one registry in this order.
BOUNDS = (("min_grad_norm", "gradient norm", _grad_norms, "below"),
          ("max_grad_norm", "gradient norm", _grad_norms, "above"),
          ("min_update_ratio", "per-step update ratio", _ratios, "below"),
          ("max_update_ratio", "per-step update ratio", _ratios, "above"))
for _name, _what, _values, _side in BOUNDS:
    engine.rule(_name)(_bound_rule(_name, _what, _values, _side))


def log_doc(log: TrainingLog, report: CheckReport) -> dict[str, Any]:
    """The check's document for a log: the log's envelope, what was read, the rules."""
    env = dict(log.envelope)
    return envelope("check", model=env.get("model"),
                    weights=env.get("weights") or {"requested": None, "loaded": None},
                    device=env.get("device"), watch=env) | log.to_dict() | report.to_dict()

