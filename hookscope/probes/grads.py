"""Gradient flow: the gradient at every module call's output and every parameter.

Output gradients come from tensor hooks registered in forward hooks, not from
``register_full_backward_hook``, which fails when an in-place operation follows the module.
Parameter gradients come from ``torch.autograd.grad`` in the same backward pass, so no
``.grad`` is ever written. One forward and one backward pass per batch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any

import torch
from torch import nn

from hookscope.core.classes import Targets, parse_targets
from hookscope.core.errors import CheckFailed, HookscopeError, param
from hookscope.core.hooks import Call, Hooks, first_tensor
from hookscope.core.logits import class_logits
from hookscope.core.mergeable import Merges, Row, state
from hookscope.core.run import Probe, Step, drive
from hookscope.core.select import LEAVES, Selection, Site, selecting
from hookscope.numerics.health import flag as _flag
from hookscope.numerics.moments import Moments, deferred_moments
from hookscope.numerics.table import Table

__all__ = ["GradLayer", "GradReport", "GradsProbe", "ParamGrad", "collect_grads",
           "nonfinite_failure"]

LOSSES = ("logit", "ce")


def _grown(shape: list[int], other: list[int]) -> list[int]:
    """``shape`` with ``other``'s batch added, when their trailing dimensions agree."""
    if shape and other and shape[1:] == other[1:]:
        return [shape[0] + other[0], *shape[1:]]
    return shape


def _sum(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else a + b


def _set(obj: Any, **values: Any) -> None:
    """Set a frozen dataclass's derived (``init=False``) fields, in ``__post_init__``."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class GradLayer(Row):
    """The gradient with respect to one module call's output (over all inputs): the numbers
    follow from ``moments``, the exact mergeable summary; ``flag`` is set by the report."""

    name: str
    type: str
    call: int
    shape: list[int] = state(_grown)
    norm: float = field(init=False)
    mean: float = field(init=False)
    std: float = field(init=False)
    max_abs: float = field(init=False)
    nonfinite: int = field(init=False)
    flag: str | None = None
    moments: Moments = state("merge", default_factory=Moments, json=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m = self.moments
        _set(self, norm=math.sqrt(max(m.m2 + m.n * m.mean * m.mean, 0.0)) if m.n else math.nan,
             mean=m.mean if m.n else math.nan, std=m.std,
             max_abs=max(abs(m.min), abs(m.max)) if m.n else math.nan, nonfinite=m.nonfinite)


@dataclass(frozen=True)
class ParamGrad(Merges):
    """A parameter's gradient norm, its weight norm and their ratio, from ``summed``: the
    gradient summed over the inputs, which merges."""

    name: str
    grad_norm: float = field(init=False)
    weight_norm: float
    ratio: float = field(init=False)
    summed: torch.Tensor | None = state(_sum, None, json=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        with torch.no_grad():
            # Native precision: accurate to ~1e-7, where float64 costs more than the backward pass.
            grad = float(torch.linalg.vector_norm(self.summed)) if self.summed is not None else 0.0
        _set(self, grad_norm=grad, ratio=grad / self.weight_norm if self.weight_norm > 0 else math.nan)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "summed"}


def _pairwise(a: list[ParamGrad], b: list[ParamGrad]) -> list[ParamGrad]:
    return [x.merge(y) for x, y in zip(a, b, strict=True)]


@dataclass(frozen=True)
class GradReport(Merges):
    """What :func:`collect_grads` returns; ``layers`` are in backward order, each flagged against
    the median call's norm. A merge is what one run over both reports' inputs gives, this one's
    first (moments merged exactly, parameter gradients summed)."""

    layers: list[GradLayer] = state("rows")
    params: list[ParamGrad] = state(_pairwise)
    loss: str = field(kw_only=True)
    targets: list[int] = state("cat")
    objective: float = state("sum")
    input_shape: list[int] | None = state("first")
    median_norm: float = field(init=False)
    first_nonfinite: str | None = field(init=False)
    first_nonfinite_param: str | None = field(init=False)
    vanish: float = field(default=1e-3, compare=False)
    explode: float = field(default=1e3, compare=False)

    def __post_init__(self) -> None:
        finite = [r.norm for r in self.layers if math.isfinite(r.norm)]
        median = statistics.median(finite) if finite else math.nan
        rows = [replace(r, flag=_flag(r.norm, r.nonfinite, median, self.vanish, self.explode))
                for r in self.layers]
        bad = next((r for r in rows if r.nonfinite), None)
        first = None if bad is None else bad.name if bad.call == 0 else f"{bad.name} (call {bad.call})"
        bad_param = next((p.name for p in self.params if not math.isfinite(p.grad_norm)), None)
        _set(self, layers=rows, median_norm=median, first_nonfinite=first, first_nonfinite_param=bad_param)

    @property
    def nonfinite(self) -> bool:
        """Whether any layer or parameter gradient holds NaN or Inf."""
        return self.first_nonfinite is not None or self.first_nonfinite_param is not None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document without its envelope."""
        return {"input_shape": self.input_shape, "loss": self.loss, "targets": list(self.targets),
                "objective": self.objective, "median_norm": self.median_norm,
                "first_nonfinite": self.first_nonfinite, "first_nonfinite_param": self.first_nonfinite_param,
                "layers": [layer.to_dict() for layer in self.layers],
                "params": [p.to_dict() for p in self.params]}


def _objective(logits: torch.Tensor, loss: str, targets: Targets, start: int
               ) -> tuple[torch.Tensor, list[int]]:
    classes = targets.resolve(logits, start)
    index = torch.tensor(classes, device=logits.device)
    if loss == "ce":
        return torch.nn.functional.cross_entropy(logits, index, reduction="sum"), classes
    return logits.gather(1, index[:, None]).sum(), classes


def _objective_targets(target: Targets | str | None, loss: str, label: Targets | str | None,
                       categories: Sequence[str] | None) -> Targets:
    """The classes differentiated: ``target`` for the logit loss, ``label`` for ce."""
    if loss not in LOSSES:
        raise HookscopeError(f"{param('loss')} {loss!r}: choose one of {', '.join(LOSSES)}.")
    targets = parse_targets(target, categories) if isinstance(target, str) else target
    labels = parse_targets(label, categories, name="label") if isinstance(label, str) else label
    if isinstance(label, str) and labels is not None and labels.ranks:
        raise HookscopeError(f"{param('label')} {label!r}: give the true class as an index or "
                             "a label, not a rank.")
    if loss == "logit":
        if labels is not None:
            raise HookscopeError(f"{param('label')} applies to {param('loss')} ce; use "
                                 f"{param('target')} with the logit loss.")
        return targets or parse_targets(None, categories)
    if labels is None:
        raise HookscopeError(f"{param('loss')} ce needs {param('label')}: the true class (an "
                             "index or a label).")
    if targets is not None and targets.entries != ("top1",):
        raise HookscopeError(f"{param('target')} applies to {param('loss')} logit; with "
                             f"{param('loss')} ce use {param('label')}.")
    return labels


class GradsProbe(Probe[GradReport]):
    """Gradients at each selected call's output and at each parameter.

    Args:
        target: ``loss="logit"``: the class whose raw logit is differentiated (``top1``,
            ``topK``, an index or label; one for all inputs or one per input), summed.
        loss: ``"logit"`` or ``"ce"`` (cross-entropy against ``label``, summed over inputs).
        label: ``loss="ce"``: the true class, one for all inputs or one per input.
        select: the modules.
        vanish, explode: flag calls whose gradient norm is below ``vanish`` or above
            ``explode`` times the median call's norm.
        n_inputs: the number of inputs, to check a per-input target or label list early.
    """

    grad = "grad"

    def __init__(self, model: nn.Module, *, target: Targets | str | None = None,
                 loss: str = "logit", label: Targets | str | None = None,
                 select: Selection = LEAVES, vanish: float = 1e-3, explode: float = 1e3,
                 categories: Sequence[str] | None = None, n_inputs: int | None = None,
                 output_key: str | None = None) -> None:
        if not (vanish > 0 and explode > 0):
            raise HookscopeError(f"{param('vanish')} and {param('explode')} must be positive factors.")
        self.loss, self.vanish, self.explode = loss, vanish, explode
        self.targets = _objective_targets(target, loss, label, categories)
        if n_inputs is not None:
            self.targets.check_count(n_inputs)
        self.sites = select.sites(model)
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.params:
            raise HookscopeError("The model has no parameter that requires a gradient; nothing "
                                 "to differentiate.")
        self.output_key = output_key
        self.table = Table(Moments.from_values)
        self.order: dict[tuple[str, int], None] = {}  # backward order, from the first batch
        self.meta: dict[tuple[str, int], tuple[Site, list[int]]] = {}
        self.param_sums: list[torch.Tensor | None] = [None] * len(self.params)
        self.classes: list[int] = []
        self.objective = 0.0
        self.input_shape: list[int] | None = None
        self.hooks: Hooks | None = None

    def bind(self, tracer: Hooks) -> None:
        self.hooks = tracer

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        t = first_tensor(output)
        if t is None or not t.requires_grad or self.hooks is None:
            return  # nothing before it needs a gradient: no gradient flows here
        key, shape = call.key, list(t.shape)
        self.meta[key] = (call.site, _grown(self.meta[key][1], shape) if key in self.meta else shape)
        self.hooks.keep(t.register_hook(partial(self._on_grad, key)))

    def _on_grad(self, key: tuple[str, int], grad: torch.Tensor) -> None:
        self.order.setdefault(key, None)
        self.table.put(key, deferred_moments(grad))

    def observe(self, step: Step, output: Any) -> None:
        logits = class_logits(output, self.output_key, "grads")
        value, classes = _objective(logits, self.loss, self.targets, step.start)
        if not value.requires_grad:
            raise HookscopeError("The model's output depends on no parameter that requires a "
                                 "gradient.")
        grads = torch.autograd.grad(value, [p for _, p in self.params], allow_unused=True)
        self.param_sums = [_sum(s, g) for s, g in zip(self.param_sums, grads, strict=True)]
        del grads, output, logits
        self.table.flush()
        self.objective += float(value.detach())
        self.classes.extend(classes)
        if self.input_shape is None:
            found = first_tensor(step.x)
            self.input_shape = list(found.shape[1:]) if found is not None else None

    def entries(self) -> list[GradLayer]:
        """Each call's gradient row so far (not flagged), in backward order (flushed first)."""
        self.table.flush()
        return [GradLayer(site.name, site.type, key[1], shape, moments=self.table.get(key) or Moments())
                for key in self.order for site, shape in [self.meta[key]]]

    def finish(self) -> GradReport:
        with torch.no_grad():
            params = [ParamGrad(name, float(torch.linalg.vector_norm(p.detach())), summed)
                      for (name, p), summed in zip(self.params, self.param_sums, strict=True)]
        return GradReport(self.entries(), params, loss=self.loss, targets=self.classes,
                          objective=self.objective, input_shape=self.input_shape,
                          vanish=self.vanish, explode=self.explode)


def nonfinite_failure(report: GradReport) -> CheckFailed:
    """The error for ``fail_on_nonfinite``: the first non-finite gradient."""
    if report.first_nonfinite is not None:
        return CheckFailed(f"non-finite gradient; first in backward order: {report.first_nonfinite}.")
    return CheckFailed(f"non-finite gradient in parameter {report.first_nonfinite_param} (the "
                       "first in model order); the gradients at the module outputs are "
                       "finite, so the non-finite values come from the activations (is the "
                       "input finite?).")


@selecting
def collect_grads(model: nn.Module, inputs: torch.Tensor | Iterable[torch.Tensor], *,
                  train_mode: bool = False, on_batch: Callable[[int], None] | None = None,
                  **options: Any) -> GradReport:
    """Gradients at each selected module call's output and at each parameter of a classifier,
    over ``inputs`` (a batch or an iterable of batches); the objectives of batches add up.
    ``options`` are :class:`GradsProbe`'s (``select``, or the keywords ``layers``, ``types``,
    ``all_modules``, ``max_depth``); ``on_batch`` is called with each batch's size."""
    return drive(model, inputs, GradsProbe(model, **options), train_mode=train_mode, progress=on_batch)
