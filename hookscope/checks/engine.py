"""``hookscope check``'s rules: functions registered by name, run in registration order
against a :class:`~hookscope.probes.stats.StatsReport` (or a training log's rows,
:mod:`hookscope.checks.log`). An expectation for an input not given, or a label the model
lacks, is a HookscopeError raised before the model runs. Torch-free.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from hookscope.checks.baseline import StatsDocument
from hookscope.checks.rulefile import Expect, Rules
from hookscope.core.classes import label_classes
from hookscope.core.errors import HookscopeError, clip, param, suggest
from hookscope.numerics.drift import finite, quantile_drift, stat_drift

if TYPE_CHECKING:
    from hookscope.probes.stats import LayerStats, Prediction, StatsReport

__all__ = ["RULES", "CheckContext", "CheckReport", "Expectation", "RuleResult", "call_id", "evaluate",
           "expectations", "fmt", "folder_expectations", "ignored", "match_inputs", "row_id", "rule",
           "verdict"]

log = logging.getLogger("hookscope")


@dataclass(frozen=True)
class Expectation:
    """One input's expected top-1, resolved: any of ``classes`` passes."""

    input: str
    position: int
    classes: tuple[int, ...]
    want: str | int
    text: str = ""  # as offenders show it: 'tabby' (281)


def _parts(name: str) -> tuple[str, ...]:
    return tuple(p for p in os.path.normpath(name).replace(os.sep, "/").split("/") if p)


def _inputs_named(entry: Expect, names: Sequence[str]) -> list[str]:
    """The same path, else the one input name ending with it (``cat.jpg``: ``images/cat.jpg``)."""
    distinct = list(dict.fromkeys(names))
    wanted = _parts(entry.input)
    same = [n for n in distinct if _parts(n) == wanted
            or os.path.abspath(n) == os.path.abspath(entry.input)]
    if same:
        return same
    ending = [n for n in distinct if wanted and _parts(n)[-len(wanted):] == wanted]
    if len(ending) > 1:
        raise HookscopeError(f"{entry.where} matches several inputs ({clip(', '.join(ending))}); "
                             "give more of the path.")
    if not ending:
        raise HookscopeError(f"{entry.where}: no input is named {entry.input!r}; the inputs "
                             f"are {clip(', '.join(distinct))}.")
    return ending


def match_inputs(rules: Rules, names: Sequence[str]) -> list[tuple[int, str, Expect]]:
    """Each ``expect`` entry's inputs as (position, name, entry), checked before the model
    loads: an entry naming no input, several, or one another entry names is an error."""
    taken: dict[str, Expect] = {}
    matched = []
    for entry in rules.expect:
        for name in _inputs_named(entry, names):
            if name in taken:
                raise HookscopeError(f"{entry.where}: input {name!r} already has an expected "
                                     f"class ({taken[name].where}).")
            taken[name] = entry
            matched += [(i, name, entry) for i, n in enumerate(names) if n == name]
    return sorted(matched, key=lambda m: m[0])


def folder_expectations(rules: Rules, names: Sequence[str], labels: Sequence[str]
                        ) -> tuple[Rules, list[tuple[int, str, Expect]]]:
    """The rules with an ImageFolder's ``expect`` (each input's class folder), and its
    entries as :func:`match_inputs` gives them."""
    matched = [(i, name, Expect(name, label, f"{name} (in class folder {label!r})"))
               for i, (name, label) in enumerate(zip(names, labels, strict=True))]
    return replace(rules, expect=tuple(e for _, _, e in matched)), matched


def _classes(entry: Expect, categories: Sequence[str] | None,
             num_classes: int | None) -> tuple[int, ...]:
    want = entry.want
    if isinstance(want, str):
        hits = label_classes(want.strip(), categories)
        if hits:  # ImageNet has two "crane"s and two "maillot"s: either passes
            return hits
        if not re.fullmatch(r"[0-9]+", want.strip()):
            if not categories:
                raise HookscopeError(f"{entry.where}: {want!r} is a label, but the model has no class "
                                     f"labels; give a class index, or labels with {param('labels')}.")
            raise HookscopeError(f"{entry.where}: {want!r} is not one of the model's "
                                 f"{len(categories)} class labels.{suggest(want, categories)}")
        want = int(want)
    count = len(categories) if categories else num_classes
    if count is not None and want >= count:
        raise HookscopeError(f"{entry.where}: class index {want} is out of range; the model "
                             f"has {count} classes (0 to {count - 1}).")
    return (want,)


def expectations(matched: Sequence[tuple[int, str, Expect]],
                 categories: Sequence[str] | None = None,
                 num_classes: int | None = None) -> list[Expectation]:
    """Matched entries' labels as class indices, once the model's labels are known."""
    found = []
    for position, name, entry in matched:
        classes = _classes(entry, categories, num_classes)
        text = " or ".join(map(str, classes))  # 'crane' (134 or 517), or 7 without labels
        if categories and len(categories) > max(classes):
            text = f"{categories[classes[0]]!r} ({text})"
        found.append(Expectation(name, position, classes, entry.want, text))
    return found


@dataclass(frozen=True)
class RuleResult:
    """One rule's verdict: ``limit`` is its setting, ``detail`` one line of what was found,
    ``offenders`` the calls (``layer4.1.relu#1: zero_fraction 0.995``) or inputs that broke it."""

    rule: str
    passed: bool
    limit: Any
    detail: str
    offenders: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CheckReport:
    """Every active rule's result, in a fixed order, and the verdict."""

    results: list[RuleResult]
    calls: int = 0
    ignored: int = 0
    rules_file: str | None = None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[RuleResult]:
        return [r for r in self.results if not r.passed]

    def summary(self) -> str:
        """``2 of 6 rules failed: nonfinite, expect``, or ``all 6 rules passed``."""
        failed = self.failures
        if not failed:
            return f"all {len(self.results)} rules passed"
        return f"{len(failed)} of {len(self.results)} rules failed: {', '.join(r.rule for r in failed)}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON document without its envelope."""
        return {"rules_file": self.rules_file, "calls": self.calls, "ignored": self.ignored,
                "rules": [asdict(r) for r in self.results], "passed": self.passed,
                "failed": len(self.failures)}


@dataclass(frozen=True)
class CheckContext:
    """What every rule sees: the rules, the calls not ignored, predictions, the baseline; or,
    for a training log, its rows and ``log``, its view (:class:`hookscope.checks.log.LogView`)."""

    rules: Rules
    calls: list[LayerStats]
    ignored: int
    inputs: Sequence[str] = ()
    predictions: Sequence[list[Prediction] | None] = ()
    expectations: Sequence[Expectation] = ()
    baseline: StatsDocument | None = None
    log: Any = None

    def note(self) -> str:
        """How many calls ``ignore`` left out, as a detail ends."""
        return f"; {self.ignored} ignored" if self.ignored else ""


RuleFn = Callable[[CheckContext], "RuleResult | None"]
#: Registered rules, run in registration order; a rule returns None when not asked for.
RULES: dict[str, RuleFn] = {}


def rule(name: str) -> Callable[[RuleFn], RuleFn]:
    """Register the decorated function as the rule ``name``."""

    def wrap(fn: RuleFn) -> RuleFn:
        RULES[name] = fn
        return fn

    return wrap


def call_id(name: str, call: int) -> str:
    """A call as offenders name it: ``layer4.1.relu#1``."""
    return f"{name or '(model)'}#{call}"


def ignored(name: str, globs: Sequence[str]) -> bool:
    """``name`` matches an ``ignore`` glob, or lies under a module that does."""
    return any(fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(name, f"{g}.*") for g in globs)


def verdict(rules: Rules, rows: Sequence[Any], others: Iterable[str] = (), **seen: Any) -> CheckReport:
    """Every registered rule's result, in registration order, over the ``rows`` that ``ignore``
    leaves in and what else the rules see (:class:`CheckContext`'s fields); a glob that matches
    no row and none of the ``others`` (a baseline's rows, a log's parameters) is warned of."""
    calls = [row for row in rows if not ignored(row.name, rules.ignore)]
    names = {row.name for row in rows} | set(others)
    for glob in rules.ignore:
        if not any(ignored(name, [glob]) for name in names):
            log.warning("ignore glob %r matches no module call", glob)
    ctx = CheckContext(rules, calls, len(rows) - len(calls), **seen)
    results = [found for fn in RULES.values() if (found := fn(ctx)) is not None]
    return CheckReport(results, calls=len(calls), ignored=ctx.ignored, rules_file=rules.source)


def evaluate(rules: Rules, report: StatsReport, *, inputs: Sequence[str],
             baseline: StatsDocument | None = None,
             expectations: Sequence[Expectation] = ()) -> CheckReport:
    """Run every active rule against ``report``; ``inputs`` are the input names in order,
    ``expectations`` the resolved ``expect`` entries (:func:`expectations`)."""
    others = [name for name, _ in baseline.rows] if baseline else []
    return verdict(rules, report.layers, others, inputs=inputs, predictions=report.predictions,
                   expectations=expectations, baseline=baseline)


def fmt(value: float | None) -> str:
    """A measured value as details show it: four significant digits, null when not finite."""
    return "null" if value is None or not math.isfinite(value) else f"{value:.4g}"


@rule("nonfinite")
def _nonfinite(ctx: CheckContext) -> RuleResult:
    """At most ``nonfinite`` NaN/Inf values in each call's output."""
    limit = ctx.rules.nonfinite
    bad = [c for c in ctx.calls if c.nonfinite > limit]
    offenders = [f"{row_id(c)}: nonfinite {c.nonfinite}" for c in bad]
    if bad:
        detail = (f"{len(bad)} of {len(ctx.calls)} calls have more than {limit} non-finite "
                  f"values (NaN, Inf); the first is {row_id(bad[0])}")
    else:
        detail = f"no call of {len(ctx.calls)} has more than {limit} non-finite values"
    event = getattr(ctx.log, "event", None)  # a training log's NaN or Inf, stopped or warned
    if event is not None:  # it names the first module (the locator's rule), not the rows
        offenders.insert(0, event)
        held = f"; {len(bad)} of {len(ctx.calls)} calls hold non-finite values" if bad else ""
        detail = f"the watch {ctx.log.outcome}: {event}{held}"
    return RuleResult("nonfinite", not bad and event is None, limit, detail + ctx.note(), offenders)


def row_id(c: Any) -> str:
    """A row's call as offenders name it, with its logging step when it has one (a log's row)."""
    step = getattr(c, "step", None)
    return call_id(c.name, c.call) + (f" at step {step}" if step is not None else "")


@rule("max_zero_fraction")
def _zeros(ctx: CheckContext) -> RuleResult | None:
    """No call's output is more than ``max_zero_fraction`` zeros (a dead layer)."""
    limit = ctx.rules.max_zero_fraction
    if limit is None:
        return None
    measured = [c for c in ctx.calls if finite(c.zero_fraction) is not None]
    bad = [c for c in measured if c.zero_fraction > limit]
    offenders = [f"{row_id(c)}: zero_fraction {fmt(c.zero_fraction)}" for c in bad]
    top = max(measured, key=lambda c: c.zero_fraction, default=None)
    most = f"; the most: {fmt(top.zero_fraction)} at {row_id(top)}" \
        if top is not None and top.zero_fraction > 0 else ""
    detail = (f"{len(bad)} of {len(ctx.calls)} calls are more than {limit:.4g} zeros" if bad
              else f"no call of {len(ctx.calls)} is more than {limit:.4g} zeros")
    return RuleResult("max_zero_fraction", not bad, limit, detail + most + ctx.note(), offenders)


def _batchless(shape: Any) -> list[int] | None:
    return list(shape[1:]) if isinstance(shape, list) and shape else None


@rule("baseline")
def _baseline(ctx: CheckContext) -> RuleResult | None:
    """The same calls as the baseline, with the same output shapes (batch aside)."""
    if ctx.baseline is None:
        return None
    here = {(c.name, c.call): c for c in ctx.calls}
    base = {key: row for key, row in ctx.baseline.rows.items() if not ignored(key[0], ctx.rules.ignore)}
    offenders = [f"{call_id(*key)}: in the baseline, not in this run" for key in base if key not in here]
    offenders += [f"{call_id(*key)}: not in the baseline" for key in here if key not in base]
    for key, row in here.items():
        want = _batchless(base[key].get("output_shape")) if key in base else None
        got = _batchless(row.output_shape)
        if want is not None and got is not None and want != got:
            offenders.append(f"{call_id(*key)}: output shape {got}, baseline {want}")
    shared, path = len(set(here) & set(base)), ctx.baseline.path
    detail = (f"{len(offenders)} calls differ from the baseline {path} ({shared} shared)"
              if offenders else f"the {shared} calls match the baseline {path}")
    return RuleResult("baseline", not offenders, path, detail + ctx.note(), offenders)


def _dg(value: float) -> str:
    return "inf" if math.isinf(value) else fmt(value)


Measure = Callable[["LayerStats", Mapping[str, Any]], "tuple[float, str] | None"]


def _drift_rule(name: str, measure: Measure) -> RuleFn:
    """The rule ``name``: each call present on both sides within the rule's limit of the
    baseline, by ``measure`` (the drift and how an offender shows it; None: not compared)."""

    def check(ctx: CheckContext) -> RuleResult | None:
        limit = getattr(ctx.rules, name)
        if limit is None or ctx.baseline is None:
            return None
        measured = []
        for c in ctx.calls:
            base = ctx.baseline.rows.get((c.name, c.call))
            found = measure(c, base) if base is not None else None
            if found is not None:
                measured.append((call_id(c.name, c.call), *found))
        offenders = [f"{who}: {shown}" for who, d, shown in measured if d > limit]
        worst = max(measured, key=lambda m: m[1], default=None)  # the first of equal drifts
        most = f"; the largest: {_dg(worst[1])} at {worst[0]}" if worst and worst[1] > 0 else ""
        compared = len(measured)
        detail = (f"{len(offenders)} of {compared} calls drift more than {limit:.4g}" if offenders
                  else f"no call of {compared} drifts more than {limit:.4g}")
        return RuleResult(name, not offenders, limit, detail + most + ctx.note(), offenders)

    return check


def _stat_drift(stat: str, c: LayerStats, base: Mapping[str, Any]) -> tuple[float, str]:
    """The relative drift of ``stat`` (mean or std)."""
    value, base_value = finite(getattr(c, stat)), finite(base.get(stat))
    d = stat_drift(stat, value, base)
    return d, f"{stat} {fmt(value)}, baseline {fmt(base_value)} (drift {_dg(d)})"


def _quantile_drift(c: LayerStats, base: Mapping[str, Any]) -> tuple[float, str] | None:
    d = quantile_drift(base.get("percentiles"), c.percentiles, base.get("std"), base.get("mean"))
    return None if d is None else (d, f"drift {_dg(d)}")


# max_mean_drift and max_std_drift: relative; max_drift: the distributions' (see
# hookscope.numerics.drift.quantile_drift).
for _name, _measure in (("max_mean_drift", partial(_stat_drift, "mean")),
                        ("max_std_drift", partial(_stat_drift, "std")),
                        ("max_drift", _quantile_drift)):
    rule(_name)(_drift_rule(_name, _measure))


def _top1(p: Prediction) -> str:
    label = f"{p.label!r} " if p.label else ""
    return f"{label}({p.index}, prob {fmt(p.prob)})"


@rule("expect")
def _expect(ctx: CheckContext) -> RuleResult | None:
    """Each expected input's top-1 class is the one expected."""
    if not ctx.rules.expect:
        return None
    limit = {e.input: e.want for e in ctx.expectations}
    offenders = []
    for e in ctx.expectations:
        if e.position >= len(ctx.predictions):
            offenders.append(f"{e.input}: no class prediction (the output is not (N, "
                             f"classes) logits), expected {e.text}")
        elif (preds := ctx.predictions[e.position]) is None:
            offenders.append(f"{e.input}: non-finite logits (NaN or Inf), expected {e.text}")
        elif (top := preds[0]).index not in e.classes:
            offenders.append(f"{e.input}: top-1 {_top1(top)}, expected {e.text}")
    n = len(ctx.expectations)
    detail = (f"{len(offenders)} of {n} inputs have another top-1 class" if offenders
              else f"the {n} inputs have the expected top-1 class")
    return RuleResult("expect", not offenders, limit, detail, offenders)


@rule("min_prob")
def _min_prob(ctx: CheckContext) -> RuleResult | None:
    """Every input's top-1 probability is at least ``min_prob``."""
    limit = ctx.rules.min_prob
    if limit is None:
        return None
    if not ctx.predictions:
        return RuleResult("min_prob", False, limit, "no class predictions: the model's "
                          "output is not (N, classes) logits", [])
    tops = [(name, preds[0] if preds is not None else None)
            for name, preds in zip(ctx.inputs, ctx.predictions, strict=False)]
    bad = [(name, p) for name, p in tops if p is None or not p.prob >= limit]  # NaN fails too
    offenders = [f"{name}: top-1 {_top1(p)}" if p is not None else
                 f"{name}: non-finite logits (NaN or Inf)" for name, p in bad]
    prob = [(name, p.prob if p is not None else math.nan) for name, p in tops]
    low = min(prob, key=lambda t: t[1] if math.isfinite(t[1]) else -1.0)
    detail = (f"{len(bad)} of {len(tops)} inputs have a top-1 probability below {limit:.4g}"
              if bad else f"every top-1 probability is at least {limit:.4g}")
    return RuleResult("min_prob", not bad, limit, f"{detail}; the lowest: {fmt(low[1])} ({low[0]})",
                      offenders)
