"""Gradient flow: the gradient at every module call's output and every parameter.

The gradients at module outputs are caught by tensor hooks registered from forward hooks
(``Tracer``), not by ``register_full_backward_hook``, which fails when the module is
followed by an in-place operation. A tensor hook registered before an in-place ReLU still
receives the gradient with respect to the module's own output.

Parameter gradients come from ``torch.autograd.grad`` in the same single backward pass, so
no ``.grad`` is ever written to the model. One forward and one backward pass per batch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from hookscope.errors import HookscopeError
from hookscope.hooks import Call, Site, Tracer, first_tensor, model_device, select_sites
from hookscope.stats import Moments, MomentTable
from hookscope.targets import Targets, parse_targets

__all__ = [
    "GradLayer",
    "GradReport",
    "ParamGrad",
    "collect_grads",
    "parse_labels",
]

NAN = float("nan")
LOSSES = ("logit", "ce")


@dataclass(frozen=True)
class GradLayer:
    """The gradient with respect to one module call's output (over all inputs)."""

    name: str
    type: str
    call: int
    shape: list[int]
    norm: float
    mean: float
    std: float
    max_abs: float
    nonfinite: int
    flag: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ParamGrad:
    """A parameter's gradient norm, its weight norm and their ratio."""

    name: str
    grad_norm: float
    weight_norm: float
    ratio: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GradReport:
    """What :func:`collect_grads` returns; ``layers`` are in backward order."""

    layers: list[GradLayer]
    params: list[ParamGrad]
    loss: str
    targets: list[int]
    objective: float
    median_norm: float
    first_nonfinite: str | None
    input_shape: list[int] | None

    @property
    def nonfinite(self) -> bool:
        """Whether any layer or parameter gradient holds NaN or Inf."""
        return self.first_nonfinite is not None or any(
            not math.isfinite(p.grad_norm) for p in self.params
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON document without its envelope."""
        return {
            "input_shape": self.input_shape,
            "loss": self.loss,
            "targets": list(self.targets),
            "objective": self.objective,
            "median_norm": self.median_norm,
            "first_nonfinite": self.first_nonfinite,
            "layers": [layer.to_dict() for layer in self.layers],
            "params": [p.to_dict() for p in self.params],
        }


def parse_labels(spec: str, categories: Sequence[str] | None) -> Targets:
    """Parse ``--label``: a class index or label, for all inputs or a comma list, one each.

    Raises:
        HookscopeError: a malformed or unknown label, or a rank such as ``top1``.
    """
    try:
        labels = parse_targets(spec, categories)
    except HookscopeError as exc:
        raise HookscopeError(str(exc).replace("--target", "--label")) from None
    if any(isinstance(e, str) for e in labels.entries):
        raise HookscopeError(
            f"--label {spec!r}: give the true class as an index or a label, not a rank."
        )
    return labels


def _check_count(spec: Targets, n: int, option: str) -> None:
    try:
        spec.check_count(n)
    except HookscopeError as exc:
        message = str(exc)
        raise HookscopeError(
            message.replace("target", "label") if option == "--label" else message
        ) from None


class _GradCollector:
    """Forward hooks that register tensor hooks; tensor hooks summarise the gradient."""

    def __init__(self, tracer_hooks: Tracer | None, on_device: bool) -> None:
        self.tracer = tracer_hooks
        self.order: dict[tuple[str, int], None] = {}  # backward order, from the first batch
        self.meta: dict[tuple[str, int], tuple[Site, list[int]]] = {}
        # Gradient statistics never report zeros, so the zero count is skipped.
        self.table = MomentTable(on_device=on_device, zeros=False)

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        t = first_tensor(output)
        if t is None or not t.requires_grad or self.tracer is None:
            return  # nothing before it needs a gradient: no gradient flows here
        key = call.key
        if key not in self.meta:
            self.meta[key] = (call.site, list(t.shape))
        else:  # batches of other sizes: keep the trailing shape, sum the batch dimension
            shape = self.meta[key][1]
            if shape and list(t.shape[1:]) == shape[1:]:
                shape[0] += t.shape[0]
        self.tracer.tensor(t, partial(self._on_grad, key))

    def _on_grad(self, key: tuple[str, int], grad: torch.Tensor) -> None:
        self.order.setdefault(key, None)
        self.table.add(key, grad)

    def end_batch(self) -> None:
        """Copy the batch's device-side summaries to the host in one transfer."""
        self.table.flush()

    @property
    def grads(self) -> dict[tuple[str, int], Moments]:
        return {key: self.table.get(key) or Moments() for key in self.order}


def _norm(m: Moments) -> float:
    if m.n == 0:
        return NAN
    return math.sqrt(max(m.m2 + m.n * m.mean * m.mean, 0.0))


def _flag(norm: float, nonfinite: int, median: float, vanish: float, explode: float) -> str | None:
    if nonfinite:
        return "nonfinite"
    if not (math.isfinite(median) and median > 0 and math.isfinite(norm)):
        return None
    if norm < median * vanish:
        return "vanish"
    if norm > median * explode:
        return "explode"
    return None


def _objective(
    logits: torch.Tensor, loss: str, targets: Targets | None, labels: Targets | None, start: int
) -> tuple[torch.Tensor, list[int]]:
    if loss == "ce":
        assert labels is not None
        classes = labels.resolve(logits, start)
        index = torch.tensor(classes, device=logits.device)
        return torch.nn.functional.cross_entropy(logits, index, reduction="sum"), classes
    spec = targets if targets is not None else Targets(("top1",))
    classes = spec.resolve(logits, start)
    rows = torch.arange(logits.shape[0], device=logits.device)
    index = torch.tensor(classes, device=logits.device)
    return logits[rows, index].sum(), classes


def collect_grads(
    model: nn.Module,
    inputs: torch.Tensor | Iterable[torch.Tensor],
    *,
    target: Targets | str | None = None,
    loss: str = "logit",
    label: Targets | str | None = None,
    layers: Sequence[str] | None = None,
    types: Sequence[str] | None = None,
    all_modules: bool = False,
    max_depth: int | None = None,
    vanish: float = 1e-3,
    explode: float = 1e3,
    categories: Sequence[str] | None = None,
    n_inputs: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> GradReport:
    """Gradients at each selected module call's output and at each parameter.

    The model runs in eval mode (its ``training`` flags are restored afterwards), one
    forward and one backward pass per batch; over several batches the objectives add up.

    Args:
        model: a classifier returning (N, classes) logits.
        inputs: one batch tensor, or an iterable of batch tensors.
        target: ``loss="logit"``: the class whose raw logit is differentiated (``top1``,
            ``topK``, an index or label; one for all inputs or one per input), summed.
        loss: ``"logit"`` or ``"ce"`` (cross-entropy against ``label``, summed over inputs).
        label: ``loss="ce"``: the true class, one for all inputs or one per input.
        layers, types, all_modules, max_depth: module selection, as in ``collect_stats``.
        vanish, explode: flag calls whose gradient norm is below ``vanish`` or above
            ``explode`` times the median call's norm.
        categories: class labels, to parse labels given by name.
        n_inputs: the number of inputs, to check a per-input target or label list early.
        on_batch: called with each batch's size after it ran.

    Raises:
        HookscopeError: bad target or label, no classifier output, bad selection.
    """
    if loss not in LOSSES:
        raise HookscopeError(f"--loss {loss!r}: choose one of {', '.join(LOSSES)}.")
    if not (vanish > 0 and explode > 0):
        raise HookscopeError("--vanish and --explode must be positive factors.")
    targets = parse_targets(target, categories) if isinstance(target, str) else target
    labels = parse_labels(label, categories) if isinstance(label, str) else label
    if loss == "ce":
        if labels is None:
            raise HookscopeError("--loss ce needs --label: the true class (index or label).")
        if target is not None and (not isinstance(target, str) or target.strip() != "top1"):
            raise HookscopeError("--target applies to --loss logit; with --loss ce use --label.")
    elif labels is not None:
        raise HookscopeError("--label applies to --loss ce; add --loss ce or use --target.")
    if n_inputs is not None:
        if targets is not None:
            _check_count(targets, n_inputs, "--target")
        if labels is not None:
            _check_count(labels, n_inputs, "--label")

    sites = select_sites(model, layers=layers, types=types, all_modules=all_modules,
                         max_depth=max_depth)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise HookscopeError(
            "The model has no parameter that requires a gradient; nothing to differentiate."
        )
    device = model_device(model)
    modes = {m: m.training for m in model.modules()}
    batches = [inputs] if isinstance(inputs, torch.Tensor) else inputs
    param_sums: list[torch.Tensor | None] = [None] * len(params)
    classes_all: list[int] = []
    objective = 0.0
    input_shape: list[int] | None = None
    start = 0
    model.eval()
    try:
        with torch.enable_grad(), Tracer(model, sites) as tracer:
            collector = _GradCollector(tracer, on_device=device.type != "cpu")
            tracer.on_exit = collector.on_exit
            for batch in batches:
                x = batch.to(device, non_blocking=True)
                tracer.reset()
                try:
                    output = model(x)
                except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                    raise tracer.forward_error(exc) from exc
                if not (isinstance(output, torch.Tensor) and output.dim() == 2):
                    raise HookscopeError(
                        f"grads needs a classifier whose output is (N, classes) logits; "
                        f"{type(model).__name__} returned {type(output).__name__}"
                        f"{list(output.shape) if isinstance(output, torch.Tensor) else ''}."
                    )
                value, classes = _objective(output, loss, targets, labels, start)
                if not value.requires_grad:
                    raise HookscopeError(
                        "The model's output depends on no parameter that requires a gradient."
                    )
                grads = torch.autograd.grad(value, [p for _, p in params], allow_unused=True)
                for i, g in enumerate(grads):
                    if g is not None:
                        prev = param_sums[i]
                        param_sums[i] = g if prev is None else prev + g
                del grads, output
                collector.end_batch()
                objective += float(value.detach())
                classes_all.extend(classes)
                if input_shape is None:
                    input_shape = list(x.shape[1:])
                start += x.shape[0]
                if on_batch is not None:
                    on_batch(x.shape[0])
    finally:
        for module, mode in modes.items():
            module.training = mode

    norms = {k: _norm(m) for k, m in collector.grads.items()}
    finite = [v for v in norms.values() if math.isfinite(v)]
    median = statistics.median(finite) if finite else NAN
    rows: list[GradLayer] = []
    first_bad: str | None = None
    for key in collector.order:
        site, shape = collector.meta[key]
        m = collector.grads[key]
        norm = norms[key]
        if m.nonfinite and first_bad is None:
            first_bad = site.name if key[1] == 0 else f"{site.name} (call {key[1]})"
        rows.append(GradLayer(
            name=site.name, type=site.type, call=key[1], shape=shape, norm=norm,
            mean=m.mean if m.n else NAN, std=m.std,
            max_abs=max(abs(m.min), abs(m.max)) if m.n else NAN,
            nonfinite=m.nonfinite, flag=_flag(norm, m.nonfinite, median, vanish, explode),
        ))
    param_rows = []
    with torch.no_grad():
        for (name, p), summed in zip(params, param_sums, strict=True):
            # Native-precision norms: torch's reduction is accurate to ~1e-7 relative, and
            # dtype=float64 is ~40x slower on CPU (it costs more than the backward pass).
            weight = float(torch.linalg.vector_norm(p.detach()))
            grad = float(torch.linalg.vector_norm(summed)) if summed is not None else 0.0
            ratio = grad / weight if weight > 0 else NAN
            param_rows.append(ParamGrad(name, grad, weight, ratio))
    return GradReport(
        layers=rows, params=param_rows, loss=loss, targets=classes_all, objective=objective,
        median_norm=median, first_nonfinite=first_bad, input_shape=input_shape,
    )
