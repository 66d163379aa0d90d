"""The CAM engine's passes: each kind of forward pass whose hooks act is its own object.

The probe (a :class:`Switch`) hands its hooks to the pass that is running; between passes
they do nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from hookscope.cam.methods import PLAIN, SMOOTH_STD, FullBackward
from hookscope.cam.rules import guided
from hookscope.cam.targets import Focus, Objective, Origins
from hookscope.core.arguments import Placement, map_tensors
from hookscope.core.errors import HookscopeError, param
from hookscope.core.hooks import Call
from hookscope.core.run import GradMode, Probe, Step
from hookscope.core.select import Site
from hookscope.numerics.layout import Layout, extent, layout

if TYPE_CHECKING:
    from hookscope.cam.probe import CamProbe

R = TypeVar("R")


def output_tensor(output: Any) -> torch.Tensor | None:
    """A module's output tensor: the output itself, or the first item of a tuple or list."""
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) else None


def _with_output(output: Any, replacement: torch.Tensor) -> Any:
    """The module's output with its :func:`output_tensor` replaced."""
    if isinstance(output, torch.Tensor):
        return replacement
    return type(output)([replacement, *output[1:]])


def channel_per_row(out: torch.Tensor, channels: Sequence[int], channel_dim: int,
                    change: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Channel ablation, one channel per row: a copy of ``out`` (one row, expanded to one per
    channel, or already one per channel) whose row r has channel ``channels[r]`` replaced
    by ``change`` of it."""
    moved = out.movedim(channel_dim, 1)
    if moved.shape[0] == 1:
        moved = moved.expand(len(channels), *moved.shape[1:])
    new = moved.clone()
    rows = torch.arange(len(channels), device=out.device)
    cols = torch.tensor(list(channels), device=out.device)
    new[rows, cols] = change(moved[rows, cols])
    return new.movedim(1, channel_dim)


def or_zeros(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``grad`` detached, or zeros where autograd found no path (None)."""
    return torch.zeros_like(like) if grad is None else grad.detach()


def score_grads(objective: Objective, out: Any, focus: Focus, rows: Sequence[int],
                nodes: list[torch.Tensor], **options: Any) -> tuple[torch.Tensor | None, ...] | None:
    """The gradients of the summed target scores (output row j against input ``rows[j]``) at
    ``nodes`` (None where autograd finds no path); None when the scores do not depend on
    anything differentiable."""
    with torch.inference_mode(False), torch.enable_grad():
        total = objective.score(out, focus, list(rows)).sum()
        if not total.requires_grad:
            return None
        return torch.autograd.grad(total, nodes, allow_unused=True, **options)


@dataclass
class Captured:
    """One capture pass: the output, and per layer its activations and gradients."""

    out: Any  # detached
    acts: list[torch.Tensor]  # per layer, the layer's own layout
    nchw: list[torch.Tensor]
    grads: list[torch.Tensor | None]
    calls: list[int]
    scores: torch.Tensor
    graph_out: Any = None  # with its graph, for regrad
    nodes: list[torch.Tensor] = field(default_factory=list)
    graph_grads: list[torch.Tensor] = field(default_factory=list)  # for the HVP


@dataclass
class Placed(Step):
    """A batch as the CAM passes see it: a tensor given to :meth:`forward` is the drawn input
    (its :class:`~hookscope.core.arguments.Placement`), run with the other inputs."""

    placement: Placement | None = None

    @classmethod
    def of(cls, step: Step, placement: Placement) -> Placed:
        return cls(**{f.name: getattr(step, f.name) for f in fields(step)}, placement=placement)

    def forward(self, x: Any = None, *, grad: GradMode | None = None) -> Any:
        if isinstance(x, torch.Tensor):
            x = self.place(x)
        return super().forward(x, grad=grad)

    def place(self, t: torch.Tensor, rows: Sequence[int] | None = None) -> Any:
        """The batch with drawn input ``t`` (see :meth:`Placement.put`)."""
        assert self.placement is not None  # set by of()
        return self.placement.put(t, rows)


class Pass:
    """A forward pass whose hooks do one thing; they act only while it runs."""

    def __init__(self, switch: Switch[Any], objective: Objective) -> None:
        self.switch, self.objective = switch, objective

    def on_enter(self, call: Call, kwargs: dict[str, Any]) -> None:
        return None

    def on_exit(self, call: Call, output: Any) -> Any:
        return None

    def grads(self, out: Any, focus: Focus, nodes: list[torch.Tensor], **options: Any
              ) -> tuple[torch.Tensor | None, ...] | None:
        """:func:`score_grads` of the batch, each input against its own target."""
        return score_grads(self.objective, out, focus, range(len(focus.classes)), nodes, **options)


class Switch(Probe[R]):
    """A probe whose hooks go to the pass that is running; between passes, to none."""

    active: Pass | None = None

    @contextmanager
    def running(self, active: Pass) -> Iterator[None]:
        self.active = active
        try:
            yield
        finally:
            self.active = None

    def on_enter(self, call: Call, args: Any, kwargs: dict[str, Any]) -> None:
        if self.active is not None:
            self.active.on_enter(call, kwargs)

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> Any:
        return None if self.active is None else self.active.on_exit(call, output)


class CapturePass(Pass):
    """Snapshots each target layer's output, starting the graph at the first one when a
    method needs gradients, and takes the gradients of the target scores there; during
    Ablation-CAM's passes (:meth:`BatchRun.ablate`), hands on the ablated outputs instead."""

    def __init__(self, switch: Switch[Any], objective: Objective, sites: list[Site], hint: Any,
                 reshape: str, needs_grad: bool, second_order: bool) -> None:
        super().__init__(switch, objective)
        self.layer_sites, self.hint, self.reshape = sites, hint, reshape
        self.needs_grad, self.second_order = needs_grad, second_order
        self.layer_ids = {id(s.module): i for i, s in enumerate(sites)}
        self.grids: list[Layout] = [Layout("nchw", 0, 0)] * len(sites)
        self.size: tuple[int, ...] = (0, 0)
        self.cap: list[tuple[torch.Tensor, torch.Tensor, int] | None] = []
        self.ablation: tuple[int, int, torch.Tensor] | None = None
        self.expand_ok: dict[int, bool] = {}

    def on_exit(self, call: Call, output: Any) -> Any:
        """Snapshot a target layer's output; start the graph there (or keep it going)."""
        index = self.layer_ids.get(id(call.site.module))
        if self.ablation is not None:
            layer, at, replacement = self.ablation
            return _with_output(output, replacement) if (index, call.index) == (layer, at) else None
        if index is None:
            return None
        site, out = call.site, output_tensor(output)
        if out is None:
            raise HookscopeError(
                f"Layer {call.name!r} returns a {type(output).__name__}; Grad-CAM needs a layer "
                "that returns a tensor (or a tuple starting with one).")
        found = layout(list(out.shape), self.size, type_name=site.type, hint=self.hint,
                       force=self.reshape)
        if not isinstance(found, Layout):
            raise HookscopeError(
                f"Layer {site.name!r} ({site.type}) outputs shape {list(out.shape)}, "
                f"which cannot give a class activation map: {found}. Choose a layer whose "
                "output is an image grid, or a signal's or volume's grid (or leave "
                f"{param('layer')} out for a good default); "
                "`hookscope layers MODEL` lists the names and shapes."
            )
        self.grids[index] = found
        if not self.needs_grad:
            self.cap[index] = (out.detach().clone(), out, call.index)
            return None
        # Last call wins: a module run several times is explained at its last call.
        if out.requires_grad:  # a later layer, already in the graph
            node = out
        else:
            node = out.detach().clone().requires_grad_(True)
            torch.set_grad_enabled(True)  # for the rest of this forward pass only
        self.cap[index] = (node.detach(), node, call.index)
        # The model gets a copy, so a following in-place op cannot touch the snapshot.
        return _with_output(output, node.clone())

    def run(self, step: Step, x: torch.Tensor, focus: Focus | None, origins: Origins, *,
            keep: bool = False, strict: bool = True) -> tuple[Captured, Focus]:
        """One forward (and backward) pass: the output, activations and gradients."""
        self.cap = [None] * len(self.layer_sites)
        self.size = extent(x)
        with self.switch.running(self):
            graph_out = self.objective.output(step.forward(x))
        out = map_tensors(graph_out, torch.Tensor.detach)  # a detector's: a list of dicts
        taken = [c for c in self.cap if c is not None]
        if len(taken) < len(self.cap):
            raise HookscopeError(f"Layer {self.layer_sites[self.cap.index(None)].name!r} did "
                                 "not run during the forward pass; choose a layer the model uses.")
        acts, nodes = [c[0] for c in taken], [c[1] for c in taken]
        focus = focus or self.objective.select(out, x, step.start, origins)
        grads: list[torch.Tensor | None] = [None] * len(taken)
        graph_grads: list[torch.Tensor] = []
        if self.needs_grad:
            graph_grads = [torch.zeros_like(n) for n in nodes] if all(focus.skipped) else \
                self._backward(graph_out, focus, nodes, keep, strict)
            grads = [self.nchw(i, g.detach()) for i, g in enumerate(graph_grads)]
        with torch.no_grad():
            scores = self.objective.score(out, focus, list(range(len(x)))).float()
        return Captured(
            out=out, acts=acts, nchw=[self.nchw(i, a) for i, a in enumerate(acts)],
            grads=grads, calls=[c[2] for c in taken], scores=scores,
            graph_out=graph_out if keep else None, nodes=nodes if keep else [],
            graph_grads=graph_grads if keep else []), focus

    def _backward(self, out: Any, focus: Focus, nodes: list[torch.Tensor], keep: bool,
                  strict: bool) -> list[torch.Tensor]:
        """Gradients of the summed target scores at each layer (zeros for a noisy copy whose
        scores depend on nothing, when not ``strict``)."""
        grads = self.grads(out, focus, nodes, retain_graph=keep,
                           create_graph=keep and self.second_order)
        if grads is None and not strict:
            return [torch.zeros_like(n) for n in nodes]
        found = grads or (None,)
        for site, g in zip(self.layer_sites, found, strict=False):
            if g is None:
                raise HookscopeError(
                    f"The model's output does not depend on layer {site.name!r}, so it has no "
                    "gradient; choose a layer on the path to the output.")
        return list(found)  # type: ignore[arg-type]

    def nchw(self, layer: int, t: torch.Tensor) -> torch.Tensor:
        """A tensor in ``layer``'s output layout as (N, C, h, w) float32."""
        return self.grids[layer].to_nchw(t).float()


def has_bias(module: nn.Module) -> bool:
    """A Conv2d or BatchNorm2d (exactly those types, as pytorch-grad-cam) with a bias."""
    if type(module) is nn.BatchNorm2d:
        return module.bias is not None and module.running_mean is not None
    return type(module) is nn.Conv2d and module.bias is not None


def bias_of(module: Any) -> torch.Tensor:
    """The bias a :func:`has_bias` module adds to each channel: a BatchNorm's folds in its
    running mean."""
    bias = module.bias
    if isinstance(module, nn.BatchNorm2d):
        mean, var = module.running_mean, module.running_var
        assert mean is not None and var is not None
        weight = module.weight if module.weight is not None else torch.ones_like(bias)
        bias = bias - mean * weight / torch.sqrt(var + module.eps)
    return bias.detach()


class InputPass(Pass):
    """A pass with the full backward pass to the input: FullGrad's keeps each biased
    module's output, for its bias gradient; guided backpropagation's has each ReLU pass back
    only positive gradients."""

    def __init__(self, switch: Switch[Any], objective: Objective, modules: list[Site], *,
                 guided: bool) -> None:
        super().__init__(switch, objective)
        self.ids, self.guided = {id(s.module) for s in modules}, guided
        self.biases: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_exit(self, call: Call, output: Any) -> Any:
        if id(call.site.module) not in self.ids or not isinstance(output, torch.Tensor) \
                or not output.requires_grad:
            return None
        if self.guided:
            return guided(output)
        self.biases.append((bias_of(call.site.module), output))
        return output.clone()  # a following in-place ReLU must not change it

    def run(self, step: Step, x: torch.Tensor, focus: Focus) -> FullBackward:
        """The full backward pass to the input (FullGrad's or guided backpropagation's)."""
        leaf = x.detach().clone().requires_grad_(True)
        self.biases = []
        with self.switch.running(self):
            out = self.objective.output(step.forward(leaf, grad="grad"))
        biases, self.biases = self.biases, []
        grads = self.grads(out, focus, [leaf, *(o for _, o in biases)])
        if grads is None:
            return FullBackward(x, torch.zeros_like(leaf))
        pairs = [(b, or_zeros(g, o)) for (b, o), g in zip(biases, grads[1:], strict=True)]
        return FullBackward(x, or_zeros(grads[0], leaf), pairs)



@dataclass
class BatchRun:
    """One batch (one augmentation of it) after its capture pass, and the extra passes a
    method may run over it, ``score_batch`` inputs at a time: built once per batch and
    shared by every method and layer (see :class:`hookscope.cam.methods.CamInputs`)."""

    probe: CamProbe
    step: Placed
    cap: Captured
    focus: Focus
    origins: Origins
    x: torch.Tensor
    full: FullBackward | None = None
    noisy_caps: dict[tuple[str, int], Captured] = field(default_factory=dict)

    @property
    def score_batch(self) -> int:
        return max(1, int(self.probe.options.score_batch))

    def score(self, x: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """The target scores of ``x``, its row j against input ``rows[j]``: a plain pass."""
        objective = self.probe.objective
        return objective.score(objective.output(self.step.forward(self.step.place(x, rows),
                                                                   grad=PLAIN)), self.focus, rows)

    def ablate(self, layer: int, i: int, channels: list[int]) -> torch.Tensor:
        """Input ``i``'s target scores with each of ``channels`` of ``layer``'s output
        ablated: one copy of the input runs up to the layer, whose hook hands on the k
        ablated outputs (see :meth:`hookscope.core.run.Step.forward_expanded`)."""
        capture, objective, cap = self.probe.capture, self.probe.objective, self.cap
        orig = cap.acts[layer][i : i + 1]
        low = float(orig.min())
        value = 0.0 if low == 0 else low - 1e7  # pytorch-grad-cam's AblationLayer
        batch = channel_per_row(orig, channels, capture.grids[layer].channel_dim,
                                lambda v: torch.full_like(v, value)).contiguous()
        capture.ablation = (layer, cap.calls[layer], batch)
        try:
            with self.probe.running(capture):
                out = self.step.forward_expanded(
                    self.step.place(self.x[i : i + 1], [i]), len(channels),
                    lambda o: len(objective.output(o)), capture.expand_ok, layer, grad=PLAIN)
            return objective.score(objective.output(out), self.focus, [i] * len(channels))
        finally:
            capture.ablation = None

    def regrad(self, layer: int, fn: Callable[[Any], torch.Tensor]) -> torch.Tensor:
        """The gradient of ``fn(output).sum()`` at ``layer``."""
        with torch.inference_mode(False), torch.enable_grad():
            (g,) = torch.autograd.grad(fn(self.cap.graph_out).sum(), self.cap.nodes[layer],
                                       retain_graph=True, allow_unused=True)
        return self.probe.capture.nchw(layer, or_zeros(g, self.cap.acts[layer]))

    def hvp(self, layer: int) -> torch.Tensor:
        """The Hessian of the summed target scores at ``layer`` times its activations."""
        grad, node = self.cap.graph_grads[layer], self.cap.nodes[layer]
        h = None
        if grad.requires_grad:
            try:
                with torch.inference_mode(False), torch.enable_grad():
                    (h,) = torch.autograd.grad(grad, node, grad_outputs=node.detach(),
                                               retain_graph=True, allow_unused=True)
            except RuntimeError as exc:
                if "not implemented" not in str(exc):
                    raise
                raise HookscopeError(
                    "shapleycam needs second derivatives, and PyTorch has none for an "
                    f"operation of this model after layer {self.probe.layer_sites[layer].name!r} "
                    f"({' '.join(str(exc).split())}); choose another method.") from None
        return self.probe.capture.nchw(layer, or_zeros(h, self.cap.acts[layer]))

    def noise(self, method: str, shape: Sequence[int]) -> torch.Tensor:
        """Standard normal noise from ``method``'s own seeded generator."""
        return torch.randn(tuple(shape), generator=self.probe.noise[method]).to(self.x.device)

    def noisy(self, method: str, layer: int, sample: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``sample``-th noisy copy's activations and gradients at ``layer`` (one
        capture pass per copy, shared by the layers)."""
        if (method, sample) not in self.noisy_caps:
            noisy = self.x + SMOOTH_STD * self.noise(method, self.x.shape)
            self.noisy_caps[method, sample] = self.probe.capture.run(
                self.step, noisy, self.focus, self.origins, strict=False)[0]
        found = self.noisy_caps[method, sample]
        return found.nchw[layer], or_zeros(found.grads[layer], found.nchw[layer])

    def attention(self, gradients: bool) -> Any:
        """The pass's attention probabilities (:class:`hookscope.cam.attention.Attentions`)."""
        assert self.probe.attention is not None  # made for the methods that need it
        return self.probe.attention.run(self.step, self.x, self.focus, gradients)
