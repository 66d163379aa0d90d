"""Grad-CAM and its family, with the autograd graph started at the target layer(s).

Speed: the forward pass runs with gradients disabled up to the first target layer. That
layer's forward hook snapshots its output as a fresh leaf tensor, switches gradients on for
the rest of the forward pass and hands the model a clone of the leaf (a later target layer
keeps its output, already in the graph, and hands on a clone too). ``torch.autograd.grad``
of the summed target scores then reaches only the layers: nothing before the first one
keeps autograd state, and no parameter gradient is ever computed, so a Grad-CAM costs about
one forward pass. Methods that need extra passes (ScoreCAM's masked inputs, Ablation-CAM's
ablated layer outputs, noisy inputs) run them through :meth:`hookscope.core.run.Step.forward`,
batched; Ablation-CAM's passes start from one copy of the input and put the ablated batch
in at the layer, so what comes before the layer runs once per batch of channels. Only
FullGrad and guided backpropagation take the full backward pass to the input.

Correctness: the snapshot is taken inside the hook, before any later in-place operation
(VGG's ``ReLU(inplace=True)``) can change the tensor, and the gradient is the one with respect
to the layer's own output.

What a map explains is an :class:`~hookscope.cam.targets.Objective`: a classifier's class
logit, a segmentation class over a region, or a detector's boxes. Several layers are fused
as pytorch-grad-cam does (each map min-max scaled, resized to the input, averaged);
``aug_smooth`` averages the maps of flipped and scaled inputs and ``eigen_smooth`` replaces
the sum over channels by their first principal component.

The model is left as it was found: no hook, no ``.grad``, ``training`` flags and the
grad mode restored, also when the forward pass raises. :class:`CamProbe` is the analysis;
the one driver (:func:`hookscope.core.run.drive`) runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from hookscope.cam.backprop import GuidedGrad, bias_of, has_bias
from hookscope.cam.layer import default_layer
from hookscope.cam.methods import (
    SMOOTH_STD,
    CamInputs,
    FullBackward,
    Method,
    get_method,
    method_names,
    project,
)
from hookscope.cam.result import CamBatch, CamReport, CamResult, MapSum, make_result
from hookscope.cam.targets import (
    Context,
    Objective,
    Selection,
    crop_box,
    infer_task,
    make_objective,
)
from hookscope.core.errors import HookscopeError, param
from hookscope.core.grid import Layout, layout, token_hint
from hookscope.core.hooks import Call, Site, all_sites, find_site, first_tensor
from hookscope.core.run import Probe, Step, drive, peek
from hookscope.core.targets import Targets, as_targets

if TYPE_CHECKING:
    pass

log = logging.getLogger("hookscope")

__all__ = [
    "AUGMENTATIONS",
    "CamBatch",
    "CamProbe",
    "CamReport",
    "CamResult",
    "RESHAPES",
    "check_explain",
    "default_layer",
    "explain",
    "gradcam",
    "method_names",
]

RESHAPES = ("auto", "none", "vit", "swin")
#: pytorch-grad-cam's ``aug_smooth``: (horizontal flip, intensity factor), the identity first.
AUGMENTATIONS = ((False, 1.0), (False, 0.9), (False, 1.1), (True, 0.9), (True, 1.0),
                 (True, 1.1))
Layers = str | nn.Module | Sequence[str | nn.Module]


def _augment(x: torch.Tensor, flip: bool, factor: float) -> torch.Tensor:
    x = x.flip(-1) if flip else x
    return x * factor if factor != 1.0 else x


def _detach(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.detach()
    return [{k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in d.items()}
            for d in out]


def _with_output(output: Any, out: torch.Tensor, replacement: torch.Tensor, name: str) -> Any:
    """The module's output with its tensor ``out`` replaced."""
    if output is out:
        return replacement
    if isinstance(output, (tuple, list)) and output and output[0] is out:
        return type(output)([replacement, *output[1:]])
    raise HookscopeError(
        f"Layer {name!r} returns a {type(output).__name__}; Grad-CAM needs a layer that "
        "returns a tensor (or a tuple starting with one)."
    )


# ----------------------------------------------------------------------------- layers


def _resolve_site(model: nn.Module, layer: str | nn.Module) -> Site:
    if isinstance(layer, nn.Module):
        for site in all_sites(model):
            if site.module is layer:
                return site
        raise HookscopeError(f"The given layer ({type(layer).__name__}) is not part of the model.")
    return find_site(model, layer)


def _layer_list(layer: Layers) -> list[str | nn.Module]:
    if isinstance(layer, (str, nn.Module)):
        return [layer]
    layers = list(layer)
    if not layers:
        raise HookscopeError(f"No layer given ({param('layer')}).")
    return layers


# ----------------------------------------------------------------------------- engine


@dataclass
class _Captured:
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


class CamProbe(Probe[CamReport]):
    """Computes one or more CAM methods at one or more layers, batch by batch.

    Args:
        model: a classifier returning (N, classes) logits, a segmentation model or a
            detector (see :mod:`hookscope.cam.targets`).
        layer: dotted module name (or the module itself), or several (their maps are fused).
        methods: registered method names.
        targets: parsed targets (see :func:`hookscope.core.targets.parse_targets`).
        reshape: ``auto`` (see :mod:`hookscope.core.grid`), or only ``none`` (N, C, H, W),
            ``vit`` (tokens after prefix tokens) or ``swin`` (N, H, W, C).
        score_batch: masked, ablated or perturbed inputs per forward pass.
        transform: the preprocessing, to place maps on the original images (see
            :func:`hookscope.cam.targets.crop_box`).
        sink: receives each :class:`CamBatch` (e.g. to write its files); without one, the
            maps are kept and concatenated into the report.
        output_key: the entry of a dict or tuple output holding the logits (see
            :func:`hookscope.core.outputs.select_logits`).
        task: ``classification``, ``segmentation`` or ``detection``; None: from the model's
            class (torchvision's segmentation models and detectors), else classification.
        objective: what the maps explain, instead of one made from ``task`` and ``targets``.
        aug_smooth: average the maps of the input flipped and scaled (pytorch-grad-cam's).
        eigen_smooth: the first principal component of the weighted activations instead of
            their sum over channels.
        guided: also guided backpropagation times each map (guided Grad-CAM).
        seed: seeds the noise of ``sscam``, ``smoothgradcam++`` and the ROAD metric.
        metrics: metric names (see :mod:`hookscope.cam.faithfulness`) to score every map with.
        percentiles: the ROAD metric's percentiles.
        head_fusion, discard_ratio: the rollout's (see :mod:`hookscope.cam.attention`).
    """

    grad = "off"  # autograd starts at the layer: its hook switches it on

    def __init__(self, model: nn.Module, layer: Layers,
                 methods: Sequence[str] = ("gradcam",), targets: Targets | None = None, *,
                 reshape: str = "auto", score_batch: int = 32, transform: Any = None,
                 sink: Callable[[CamBatch], None] | None = None,
                 output_key: str | None = None, task: str | None = None,
                 objective: Objective | None = None, aug_smooth: bool = False,
                 eigen_smooth: bool = False, guided: bool = False, seed: int = 0,
                 metrics: Sequence[str] = (), percentiles: Sequence[float] | None = None,
                 head_fusion: str = "mean", discard_ratio: float = 0.0) -> None:
        if reshape not in RESHAPES:
            raise HookscopeError(f"{param('reshape')} {reshape!r}: choose one of "
                                 f"{', '.join(RESHAPES)}.")
        if not methods:
            raise HookscopeError(f"No CAM method given ({param('method')}).")
        self.model = model
        sites = [_resolve_site(model, item) for item in _layer_list(layer)]
        self.layer_sites = list({s.name: s for s in sites}.values())
        self.methods: list[Method] = list({m.name: m for m in map(get_method, methods)}.values())
        self.task = objective.kind if objective is not None else task or infer_task(model)
        self.objective = objective or make_objective(self.task, targets, output_key=output_key)
        self.reshape, self.hint = reshape, token_hint(model)
        self.grids: list[Layout] = [Layout("nchw", 0, 0)] * len(self.layer_sites)
        self.size = (0, 0)
        self.score_batch, self.transform, self.sink = score_batch, transform, sink
        self.augs = AUGMENTATIONS if aug_smooth else AUGMENTATIONS[:1]
        self.eigen_smooth, self.guided, self.seed = eigen_smooth, guided, seed
        self.metrics = _metric_plan(metrics, percentiles, self.task, seed)
        self._check_methods(aug_smooth)
        needs = frozenset().union(*(m.needs for m in self.methods))
        self.needs_grad = any(m.gradients for m in self.methods)
        self.keep_graph, self.second_order = bool(needs & {"regrad", "hvp"}), "hvp" in needs
        self.needs_full = "full" in needs
        self.attn_kinds: dict[int, str] = {}
        if "attention" in needs:
            from hookscope.cam.attention import attention_sites, check_rollout

            check_rollout(head_fusion, discard_ratio)
            found = attention_sites(model)
            self.attn_kinds = {id(site.module): kind for site, kind in found}
            self.attn_sites = [site for site, _ in found]
        self.rollout = (head_fusion, discard_ratio)
        self.attn_probs: list[torch.Tensor] = []
        self.gens = {m.name: torch.Generator().manual_seed(seed) for m in self.methods}
        self._hook_sites(model)
        self.notes: dict[str, None] = {}
        if guided and not self.relu_ids:
            self.notes[f"{type(model).__name__} has no nn.ReLU module, so guided "
                       "backpropagation is the plain input gradient."] = None
        self.mode = "idle"
        self.cap: list[tuple[torch.Tensor, torch.Tensor, int] | None] = []
        self.biases: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.ablation: tuple[int, int, torch.Tensor] | None = None
        self.expand_ok: dict[int, bool] = {}
        self.layer_shapes: list[list[int]] = []
        self.kept: list[CamBatch] = []

    def _hook_sites(self, model: nn.Module) -> None:
        everything = all_sites(model)
        bias = [s for s in everything if has_bias(s.module)] if self.needs_full else []
        relus = [s for s in everything if isinstance(s.module, nn.ReLU)] if self.guided else []
        self.layer_ids = {id(s.module): i for i, s in enumerate(self.layer_sites)}
        self.bias_ids = {id(s.module) for s in bias}
        self.relu_ids = {id(s.module) for s in relus}
        attention = getattr(self, "attn_sites", [])
        self.sites = list({id(s.module): s for s in [*self.layer_sites, *bias, *relus,
                                                     *attention]}.values())

    def _check_methods(self, aug_smooth: bool) -> None:
        """A method or option that cannot work with this model says why, before any pass."""
        if self.task == "classification":
            return
        for m in self.methods:
            if m.classifier:
                raise HookscopeError(f"{m.name} compares a classifier's classes; this is a "
                                     f"{self.task} model ({param('method')}).")
        if aug_smooth:
            raise HookscopeError(f"{param('aug_smooth')} flips the input, which would move a "
                                 f"{self.task} model's region or boxes; it is for classifiers.")

    # ------------------------------------------------------------------ hooks

    def _check(self, site: Site, out: torch.Tensor, index: int) -> None:
        found = layout(list(out.shape), self.size, type_name=site.type, hint=self.hint,
                       force=self.reshape)
        if not isinstance(found, Layout):
            raise HookscopeError(
                f"Layer {site.name!r} ({site.type}) outputs shape {list(out.shape)}, "
                f"which cannot give a class activation map: {found}. Choose a layer whose "
                f"output is an image grid (or leave {param('layer')} out for a good default); "
                "`hookscope layers MODEL` lists the names and shapes."
            )
        self.grids[index] = found

    def on_enter(self, call: Call, args: Any, kwargs: dict[str, Any]) -> None:
        kind = self.attn_kinds.get(id(call.site.module))
        if self.mode == "attention" and kind is not None:
            from hookscope.cam.attention import ask_for_weights

            ask_for_weights(kind, kwargs)

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> Any:
        key = id(call.site.module)
        if self.mode == "attention" and key in self.attn_kinds:
            from hookscope.cam.attention import probabilities

            found = probabilities(self.attn_kinds[key], output)
            if found is not None:
                self.attn_probs.append(found)
            return None
        if self.mode == "capture" and key in self.layer_ids:
            return self._on_layer(call, self.layer_ids[key], output)
        if self.mode == "ablate" and self.ablation is not None and key in self.layer_ids:
            layer, index, replacement = self.ablation
            if self.layer_ids[key] == layer and call.index == index:
                out = first_tensor(output)
                assert out is not None
                return _with_output(output, out, replacement, call.name)
        if self.mode == "full" and key in self.bias_ids:
            if isinstance(output, torch.Tensor) and output.requires_grad:
                self.biases.append((bias_of(call.site.module), output))
                return output.clone()  # a following in-place ReLU must not change it
        if self.mode == "guided" and key in self.relu_ids:
            if isinstance(output, torch.Tensor) and output.requires_grad:
                return GuidedGrad.apply(output)
        return None

    def _on_layer(self, call: Call, index: int, output: Any) -> Any:
        """Snapshot a target layer's output; start the graph there (or keep it going)."""
        out = first_tensor(output)
        if out is None:
            raise HookscopeError(f"Layer {call.name!r} returned no tensor.")
        self._check(call.site, out, index)
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
        return _with_output(output, out, node.clone(), call.name)

    # ------------------------------------------------------------------ passes

    def _capture(self, step: Step, x: torch.Tensor, sel: Selection | None, ctx: Context, *,
                 keep: bool = False, strict: bool = True) -> tuple[_Captured, Selection]:
        """One forward (and backward) pass: the output, activations and gradients."""
        self.mode, self.cap = "capture", [None] * len(self.layer_sites)
        self.size = (int(x.shape[-2]), int(x.shape[-1]))
        try:
            out = self.objective.output(step.forward(x))
        finally:
            self.mode = "idle"
        cap = self.cap
        for site, found in zip(self.layer_sites, cap, strict=True):
            if found is None:
                raise HookscopeError(f"Layer {site.name!r} did not run during the forward "
                                     "pass; choose a layer the model uses.")
        taken = [c for c in cap if c is not None]
        sel = sel or self.objective.select(_detach(out), x, step.start, ctx)
        grads: list[torch.Tensor | None] = [None] * len(taken)
        graph_grads: list[torch.Tensor] = []
        if self.needs_grad:
            nodes = [c[1] for c in taken]
            graph_grads = [torch.zeros_like(n) for n in nodes] if all(sel.skipped) else \
                self._backward(out, sel, nodes, keep, strict)
            grads = [g.detach() for g in graph_grads]
        rows = list(range(len(x)))
        with torch.no_grad():
            scores = self.objective.score(_detach(out), sel, rows).float()
        nchw = [lay.to_nchw(c[0]).float() for c, lay in zip(taken, self.grids, strict=True)]
        return _Captured(
            out=_detach(out), acts=[c[0] for c in taken], nchw=nchw,
            grads=[lay.to_nchw(g).float() if g is not None else None
                   for g, lay in zip(grads, self.grids, strict=True)],
            calls=[c[2] for c in taken], scores=scores,
            graph_out=out if keep else None, nodes=[c[1] for c in taken] if keep else [],
            graph_grads=graph_grads if keep else []), sel

    def _backward(self, out: Any, sel: Selection, nodes: list[torch.Tensor], keep: bool,
                  strict: bool) -> list[torch.Tensor]:
        """Gradients of the summed target scores at each layer."""
        with torch.inference_mode(False), torch.enable_grad():
            total = self.objective.score(out, sel, list(range(len(sel.classes)))).sum()
            if not total.requires_grad:
                if strict:
                    raise self._disconnected(self.layer_sites[0].name)
                return [torch.zeros_like(n) for n in nodes]
            grads = torch.autograd.grad(total, nodes, allow_unused=True, retain_graph=keep,
                                        create_graph=keep and self.second_order)
        for site, g in zip(self.layer_sites, grads, strict=True):
            if g is None:
                raise self._disconnected(site.name)
        return list(grads)  # type: ignore[arg-type]

    def _disconnected(self, name: str) -> HookscopeError:
        return HookscopeError(
            f"The model's output does not depend on layer {name!r}, so it has no "
            "gradient; choose a layer on the path to the output."
        )

    def _score(self, step: Step, sel: Selection, x: torch.Tensor, rows: list[int]
               ) -> torch.Tensor:
        out = self.objective.output(step.forward(x, grad="inference"))
        return self.objective.score(out, sel, rows)

    def _ablate(self, step: Step, sel: Selection, cap: _Captured, layer: int, x: torch.Tensor,
                i: int, channels: list[int]) -> torch.Tensor:
        """Scores of input ``i`` with each of ``channels`` of the layer's output ablated.

        The pass starts from one copy of the input and the layer's hook returns the k
        ablated outputs, so what runs before the layer runs once; a model that cannot take
        that (it mixes tensors from before the layer with the batch) gets k copies.
        """
        orig = cap.acts[layer][i : i + 1]
        k = len(channels)
        batch = orig.repeat(k, *([1] * (orig.dim() - 1)))
        low = float(orig.min())
        value = 0.0 if low == 0 else low - 1e7  # pytorch-grad-cam's AblationLayer
        cdim = self.grids[layer].channel_dim
        batch.movedim(cdim, 1)[torch.arange(k), torch.tensor(channels)] = value
        self.mode, self.ablation = "ablate", (layer, cap.calls[layer], batch)
        try:
            out = step.forward_expanded(
                x[i : i + 1], k, lambda o: self.objective.rows(self.objective.output(o)),
                self.expand_ok, layer, grad="inference")
            return self.objective.score(self.objective.output(out), sel, [i] * k)
        finally:
            self.mode, self.ablation = "idle", None

    def _input_pass(self, step: Step, x: torch.Tensor, sel: Selection, mode: str
                    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The full backward pass to the input (FullGrad's or guided backpropagation's)."""
        leaf = x.detach().clone().requires_grad_(True)
        self.mode, self.biases = mode, []
        try:
            out = self.objective.output(step.forward(leaf, grad="grad"))
        finally:
            self.mode = "idle"
        biases, self.biases = self.biases, []
        with torch.inference_mode(False), torch.enable_grad():
            total = self.objective.score(out, sel, list(range(len(x)))).sum()
            if not total.requires_grad:
                return torch.zeros_like(leaf), []
            grads = torch.autograd.grad(total, [leaf, *(o for _, o in biases)],
                                        allow_unused=True)
        pairs = [(b, g.detach() if g is not None else torch.zeros_like(o))
                 for (b, o), g in zip(biases, grads[1:], strict=True)]
        first = grads[0]
        return (first.detach() if first is not None else torch.zeros_like(leaf)), pairs

    def _attention(self, step: Step, x: torch.Tensor, sel: Selection, gradients: bool) -> Any:
        """One pass with every attention module's probabilities (and, with ``gradients``,
        the summed target scores' gradients with respect to them)."""
        from hookscope.cam.attention import collect, eager_attention

        self.mode, self.attn_probs = "attention", []
        try:
            with eager_attention(self.model):
                out = self.objective.output(step.forward(x, grad="grad" if gradients
                                                         else "inference"))
        finally:
            self.mode = "idle"
        probs, self.attn_probs = self.attn_probs, []
        rows = list(range(len(sel.classes)))
        score = partial(self.objective.score, out, sel, rows) if gradients else None
        return collect(probs, score, x, self.hint, *self.rollout)

    def _regrad(self, cap: _Captured, layer: int, fn: Callable[[Any], torch.Tensor]
                ) -> torch.Tensor:
        with torch.inference_mode(False), torch.enable_grad():
            (g,) = torch.autograd.grad(fn(cap.graph_out).sum(), cap.nodes[layer],
                                       retain_graph=True, allow_unused=True)
        g = torch.zeros_like(cap.acts[layer]) if g is None else g.detach()
        return self.grids[layer].to_nchw(g).float()

    def _hvp(self, cap: _Captured, layer: int) -> torch.Tensor:
        grad, node = cap.graph_grads[layer], cap.nodes[layer]
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
                    f"operation of this model after layer {self.layer_sites[layer].name!r} "
                    f"({' '.join(str(exc).split())}); choose another method.") from None
        h = torch.zeros_like(cap.acts[layer]) if h is None else h.detach()
        return self.grids[layer].to_nchw(h).float()

    def _noise(self, name: str, device: torch.device, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=self.gens[name]).to(device)

    def _noisy(self, step: Step, sel: Selection, ctx: Context, x: torch.Tensor, name: str,
               cache: dict[int, _Captured], layer: int, sample: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``sample``-th noisy copy's activations and gradients (shared by the layers)."""
        if sample not in cache:
            noisy = x + SMOOTH_STD * self._noise(name, x.device, tuple(x.shape))
            cache[sample] = self._capture(step, noisy, sel, ctx, strict=False)[0]
        found = cache[sample]
        grads = found.grads[layer]
        return found.nchw[layer], grads if grads is not None else torch.zeros_like(
            found.nchw[layer])

    # ------------------------------------------------------------------ one batch

    def _context(self, step: Step) -> Context:
        batch = step.batch
        if batch is None:
            return Context([f"input {step.start + i}" for i in range(len(step))],
                           [None] * len(step), [None] * len(step))
        images = batch.images or [None] * len(step)
        sizes = [image.size if image is not None else None for image in images]
        return Context([item.name for item in batch.items], sizes,
                       [crop_box(self.transform, size) if size is not None else None
                        for size in sizes])

    def _inputs(self, method: Method, step: Step, cap: _Captured, sel: Selection,
                ctx: Context, x: torch.Tensor, full: FullBackward | None, layer: int,
                cache: dict[int, _Captured]) -> CamInputs:
        name = method.name
        return CamInputs(
            acts=cap.nchw[layer], grads=cap.grads[layer], x=x, targets=list(sel.classes),
            score=partial(self._score, step, sel), score_batch=self.score_batch,
            base_scores=cap.scores, ablate=partial(self._ablate, step, sel, cap, layer, x),
            regrad=partial(self._regrad, cap, layer) if cap.graph_out is not None else None,
            logits=cap.out if self.task == "classification" else None,
            hvp=partial(self._hvp, cap, layer) if cap.graph_grads else None,
            noisy=partial(self._noisy, step, sel, ctx, x, name, cache, layer),
            noise=partial(self._noise, name, x.device), full=full,
            attention=partial(self._attention, step, x, sel) if self.attn_kinds else None)

    def _raws(self, method: Method, step: Step, cap: _Captured, sel: Selection, ctx: Context,
              x: torch.Tensor, full: FullBackward | None) -> list[torch.Tensor]:
        """The method's raw maps (ReLU'd) at each layer (once, for FullGrad)."""
        cache: dict[int, _Captured] = {}
        grad_free = not method.needs & {"regrad", "hvp", "noisy"}
        raws = []
        for layer in range(len(self.layer_sites) if method.layerwise else 1):
            inputs = self._inputs(method, step, cap, sel, ctx, x, full, layer, cache)
            with torch.inference_mode(grad_free):
                res = method.fn(inputs).float()
                if res.dim() == 4:
                    res = project(res) if self.eigen_smooth else res.sum(dim=1)
                raws.append(torch.nan_to_num(res, nan=0.0).clamp(min=0))
        return raws

    def step(self, step: Step) -> None:
        x = step.x
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise HookscopeError(f"Grad-CAM takes image batches (N, C, H, W); got {shape}.")
        ctx = self._context(step)
        accs = {m.name: MapSum() for m in self.methods}
        sel: Selection | None = None
        first: tuple[list[float], list[float | None], Any] | None = None
        for flip, factor in self.augs:
            xa = _augment(x, flip, factor)
            cap, sel = self._capture(step, xa, sel, ctx, keep=self.keep_graph)
            if first is None:
                first = (cap.scores.tolist(), self.objective.probs(cap.out, sel), cap.out)
                self.layer_shapes = [list(a.shape[1:]) for a in cap.nchw]
            full = FullBackward(xa, *self._input_pass(step, xa, sel, "full")) \
                if self.needs_full else None
            for m in self.methods:
                raws = self._raws(m, step, cap, sel, ctx, xa, full)
                accs[m.name].add(raws, x.shape[-2:], flip, len(self.augs) > 1)
            del cap, full
        assert sel is not None and first is not None
        guided = self._input_pass(step, x, sel, "guided")[0] if self.guided else None
        results = {m.name: make_result(m, accs[m.name], sel, first[0], first[1], guided,
                                        [s.name for s in self.layer_sites])
                   for m in self.methods}
        if self.metrics is not None:
            results = self._scored(step, x, sel, results)
        self._emit(step, results, sel)

    def _probs(self, step: Step, sel: Selection, x: torch.Tensor, rows: list[int]
               ) -> torch.Tensor:
        logits = self.objective.output(step.forward(x, grad="inference")).float()
        index = torch.tensor([sel.classes[r] for r in rows], device=logits.device)
        return torch.softmax(logits, dim=1).gather(1, index[:, None]).squeeze(1)

    def _scored(self, step: Step, x: torch.Tensor, sel: Selection,
                results: dict[str, CamResult]) -> dict[str, CamResult]:
        """Every result with its metrics (perturbed inputs run ``score_batch`` at a time)."""
        from dataclasses import replace

        assert self.metrics is not None
        scored = {}
        for name, res in results.items():
            maps = torch.from_numpy(res.maps).to(x.device)
            values = self.metrics.evaluate(partial(self._probs, step, sel), x, maps,
                                           self.score_batch)
            scored[name] = replace(res, metrics=values)
        return scored

    def _emit(self, step: Step, results: dict[str, CamResult], sel: Selection) -> None:
        images = step.batch.images if step.batch is not None else [None] * len(step)
        boxes = [crop_box(self.transform, image.size) if image is not None else None
                 for image in images]
        first = self.layer_shapes[0] if self.layer_shapes else []
        explained = CamBatch(batch=step.batch, start=step.start, results=results,
                             layer=self.layer_sites[0].name, layer_shape=list(first),
                             boxes=boxes,
                             layers=[s.name for s in self.layer_sites],
                             layer_shapes=[list(s) for s in self.layer_shapes],
                             skipped=list(sel.skipped))
        self.notes.update(dict.fromkeys(why for why in sel.skipped if why is not None))
        self.notes.update(dict.fromkeys(explained.notes))
        if self.sink is not None:
            self.sink(explained)
        else:
            self.kept.append(explained)

    def finish(self) -> CamReport:
        results = {m.name: CamResult.concat([b.results[m.name] for b in self.kept])
                   for m in self.methods} if self.kept else {}
        shapes = [list(s) for s in self.layer_shapes]
        return CamReport(layer=self.layer_sites[0].name, layer_shape=shapes[0] if shapes else [],
                         methods=[m.name for m in self.methods], results=results,
                         notes=list(self.notes), layers=[s.name for s in self.layer_sites],
                         layer_shapes=shapes, task=self.task)


def _metric_plan(metrics: Sequence[str], percentiles: Sequence[float] | None, task: str,
                 seed: int) -> Any:
    if not metrics:
        return None
    from hookscope.cam.faithfulness import MetricPlan

    if task != "classification":
        raise HookscopeError(f"{param('metrics')} score a classifier's confidence in its "
                             f"class; this is a {task} model.")
    return MetricPlan.make(metrics, percentiles, seed)


def _default_layer(model: nn.Module, inputs: Any, task: str, autocast: torch.dtype | None
                   ) -> tuple[str, Any]:
    first, batches = peek(inputs)
    sample = getattr(first, "tensor", first)
    sample = sample.unsqueeze(0) if sample.dim() == 3 else sample
    layer, shape = default_layer(model, sample[:1], autocast=autocast, task=task)
    log.info("using layer %s, %s (%s channels on a %sx%s grid)", layer,
             "the default for this model" if task == "classification" else
             "the backbone's last stage", *shape[1:])
    return layer, batches


def explain(
    model: nn.Module,
    inputs: Any,
    *,
    layer: Layers | None = None,
    methods: Sequence[str] = ("gradcam",),
    targets: Targets | None = None,
    reshape: str = "auto",
    score_batch: int = 32,
    transform: Any = None,
    sink: Callable[[CamBatch], None] | None = None,
    progress: Callable[[int], None] | None = None,
    output_key: str | None = None,
    autocast: torch.dtype | None = None,
    task: str | None = None,
    mask: np.ndarray | None = None,
    box_index: Sequence[int] = (),
    iou: float = 0.5,
    min_score: float = 0.5,
    **options: Any,
) -> CamReport:
    """Every CAM method over ``inputs`` (a batch, or an iterable of batches).

    ``layer`` None picks :func:`default_layer` (the last image-grid output; a token
    transformer's last block's first norm; for segmentation models and detectors, the
    backbone's last stage), found on the first input (logged). ``task``, ``targets``,
    ``output_key``, ``mask``, ``box_index``, ``iou`` and ``min_score`` make the objective
    (see :func:`hookscope.cam.targets.make_objective`); other arguments and ``options``
    (``aug_smooth``, ``eigen_smooth``, ``guided``, ``seed``, ``metrics``, ``percentiles``,
    ``head_fusion``, ``discard_ratio``) are those of :class:`CamProbe`.

    Raises:
        HookscopeError: unknown layer or method, a layer without a spatial output, or an
            option that does not fit the model.
        ForwardError: the model's forward pass raised.
    """
    task = task or infer_task(model)
    objective = make_objective(task, targets, output_key=output_key, mask=mask,
                               box_index=box_index, iou=iou, min_score=min_score)
    batches: Any = inputs
    if layer is None:
        layer, batches = _default_layer(model, inputs, task, autocast)
    probe = CamProbe(model, layer, methods, reshape=reshape, score_batch=score_batch,
                     transform=transform, sink=sink, objective=objective, **options)
    return drive(model, batches, probe, progress=progress, autocast=autocast)


def check_explain(model: nn.Module, *, layer: Layers | None = None,
                  methods: Sequence[str] = ("gradcam",), targets: Targets | None = None,
                  output_key: str | None = None, task: str | None = None,
                  **options: Any) -> None:
    """Raise what :func:`explain` with these arguments would refuse, without running the
    model (so a command that runs other analyses first refuses before any of them)."""
    task = task or infer_task(model)
    objective = make_objective(task, targets, output_key=output_key)
    sites = [s for s in all_sites(model) if s.name]
    if layer is None and not sites:
        return
    CamProbe(model, layer if layer is not None else sites[-1].name, methods,
             objective=objective, **options)


def gradcam(
    model: nn.Module,
    inputs: torch.Tensor | Iterable[torch.Tensor],
    layer: Layers | None = None,
    *,
    method: str = "gradcam",
    target: int | str | Sequence[int | str] | None = None,
    reshape: str = "auto",
    categories: Sequence[str] | None = None,
    score_batch: int = 32,
    output_key: str | None = None,
    **options: Any,
) -> CamResult:
    """Class activation maps of ``model`` for ``inputs`` at ``layer``.

    Args:
        model: a classifier returning (N, classes) logits (or a segmentation model or
            detector, see :func:`explain`); it is left with no hook, no ``.grad`` and its
            ``training`` flags unchanged.
        inputs: a preprocessed batch (N, C, H, W) or one image (C, H, W), or an iterable
            of batches.
        layer: dotted module name or the module, or a list of them (fused); None picks the
            last module with a spatial output larger than 1x1 (logged).
        method: one of :func:`method_names`.
        target: None or ``"top1"`` for the top class, ``"topK"``, a class index, a label (with
            ``categories``), or one of those per input (a list or a comma string).
        reshape: ``auto`` (ViT tokens with a CLS token are reshaped automatically), ``none``,
            ``vit`` or ``swin`` (channels-last (N, H, W, C) or square token outputs).
        categories: class labels, for label targets.
        score_batch: masked, ablated or perturbed inputs per forward pass.
        options: more of :func:`explain`'s options (``aug_smooth``, ``eigen_smooth``,
            ``guided``, ``seed``, ``task``, ``mask``, ``box_index``, ``metrics``...).

    Returns:
        The maps, the raw layer-resolution maps, the targets and their scores.

    Raises:
        HookscopeError: unknown layer or method, a layer without a spatial output, or a
            target list whose length does not match the number of inputs.
    """
    options["task"] = options.get("task") or infer_task(model)
    targets = None if target is None and options["task"] == "detection" else \
        as_targets(target, categories)
    if isinstance(inputs, torch.Tensor):
        inputs = inputs.unsqueeze(0) if inputs.dim() == 3 else inputs
        count = inputs.shape[0]
    else:
        inputs = [b.unsqueeze(0) if b.dim() == 3 else b for b in inputs]
        count = sum(b.shape[0] for b in inputs)
    if targets is not None:
        targets.check_count(count)
    report = explain(model, inputs, layer=layer, methods=(method,), targets=targets,
                     reshape=reshape, score_batch=score_batch, output_key=output_key,
                     **options)
    for note in report.notes:
        log.warning(note)
    return report.results[get_method(method).name]
