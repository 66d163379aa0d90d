"""Grad-CAM and its family, with the autograd graph started at the target layer(s): see
"How it is fast" in docs/gradcam.md. Each kind of pass is its own object
(:mod:`hookscope.cam.passes`); the model is left as it was found, also when it raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from hookscope.cam.attention import AttentionPass
from hookscope.cam.backprop import has_bias
from hookscope.cam.faithfulness import MetricPlan
from hookscope.cam.layer import default_layer
from hookscope.cam.methods import CamInputs, FullBackward, Method, get_method, method_names, project
from hookscope.cam.passes import AblationPass, Captured, CapturePass, InputPass, Noise, Switch, probs, score
from hookscope.cam.result import CamBatch, CamReport, CamResult, MapSum, make_result
from hookscope.cam.targets import Context, Objective, Selection, infer_task, make_objective
from hookscope.core.errors import HookscopeError, param
from hookscope.core.run import Step, drive, peek
from hookscope.core.select import Site, all_sites, find_site
from hookscope.core.targets import Targets, as_targets
from hookscope.numerics.layout import token_hint

log = logging.getLogger("hookscope")

__all__ = ["AUGMENTATIONS", "CamBatch", "CamProbe", "CamReport", "CamResult", "RESHAPES",
           "check_explain", "default_layer", "explain", "gradcam", "method_names"]

RESHAPES = ("auto", "none", "vit", "swin")
#: pytorch-grad-cam's ``aug_smooth``: (horizontal flip, intensity factor), the identity first.
AUGMENTATIONS = ((False, 1.0), (False, 0.9), (False, 1.1), (True, 0.9), (True, 1.0),
                 (True, 1.1))
Layers = str | nn.Module | Sequence[str | nn.Module]


def _site(model: nn.Module, layer: str | nn.Module) -> Site:
    if not isinstance(layer, nn.Module):
        return find_site(model, layer)
    found = next((s for s in all_sites(model) if s.module is layer), None)
    if found is None:
        raise HookscopeError(f"The given layer ({type(layer).__name__}) is not part of the model.")
    return found


class CamProbe(Switch[CamReport]):
    """Computes one or more CAM methods at one or more layers, batch by batch.

    The options are the ``gradcam`` command's (docs/gradcam.md), plus ``layer``: a dotted
    name or the module itself, or several (their maps are fused); ``transform``: the
    preprocessing, to place maps on the original images; ``sink``: receives each
    :class:`CamBatch` (without one, the report keeps the maps); ``objective``: replaces the
    one made from ``task`` (None: from the model's class), ``targets`` and ``output_key``.
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
        layers = [layer] if isinstance(layer, (str, nn.Module)) else list(layer)
        if not layers:
            raise HookscopeError(f"No layer given ({param('layer')}).")
        sites = [_site(model, item) for item in layers]
        self.layer_sites = list({s.name: s for s in sites}.values())
        self.methods: list[Method] = list({m.name: m for m in map(get_method, methods)}.values())
        self.task = objective.kind if objective is not None else task or infer_task(model)
        self.objective = objective or make_objective(self.task, targets, output_key=output_key)
        self.score_batch, self.transform, self.sink = score_batch, transform, sink
        self.augs = AUGMENTATIONS if aug_smooth else AUGMENTATIONS[:1]
        self.eigen_smooth = eigen_smooth
        self._check_methods(aug_smooth, bool(metrics))
        self.metrics = MetricPlan.make(metrics, percentiles, seed) if metrics else None
        needs = frozenset().union(*(m.needs for m in self.methods))
        self.keep_graph = bool(needs & {"regrad", "hvp"})
        self.notes: dict[str, None] = {}
        self._make_passes(model, needs, reshape, guided, seed, (head_fusion, discard_ratio))
        self.layer_shapes: list[list[int]] = []
        self.kept: list[CamBatch] = []

    def _make_passes(self, model: nn.Module, needs: frozenset[str], reshape: str, guided: bool,
                     seed: int, rollout: tuple[str, float]) -> None:
        """One object per kind of pass, and the union of their modules as the probe's sites."""
        objective, hint = self.objective, token_hint(model)
        self.capture = CapturePass(self, objective, self.layer_sites, hint, reshape,
                                   any(m.gradients for m in self.methods), "hvp" in needs)
        self.ablation = AblationPass(self, objective, self.capture)
        self.noise = Noise(self.capture, [m.name for m in self.methods], seed)
        everything = all_sites(model)
        bias = [s for s in everything if has_bias(s.module)] if "full" in needs else []
        relus = [s for s in everything if isinstance(s.module, nn.ReLU)] if guided else []
        self.fullgrad = InputPass(self, objective, bias, guided=False) if "full" in needs else None
        self.guided = InputPass(self, objective, relus, guided=True) if guided else None
        if guided and not relus:
            self.notes[f"{type(model).__name__} has no nn.ReLU module, so guided "
                       "backpropagation is the plain input gradient."] = None
        self.attention = None
        if "attention" in needs:
            self.attention = AttentionPass(self, objective, model, hint, *rollout)
        attention = self.attention.sites if self.attention is not None else []
        self.sites = list({id(s.module): s for s in [*self.layer_sites, *bias, *relus,
                                                     *attention]}.values())

    def _check_methods(self, aug_smooth: bool, metrics: bool) -> None:
        """Refuse, before any pass, a method or option that cannot work with this model."""
        if self.task == "classification":
            return
        if metrics:
            raise HookscopeError(f"{param('metrics')} score a classifier's confidence in its "
                                 f"class; this is a {self.task} model.")
        for m in self.methods:
            if m.classifier:
                raise HookscopeError(f"{m.name} compares a classifier's classes; this is a "
                                     f"{self.task} model ({param('method')}).")
        if aug_smooth:
            raise HookscopeError(f"{param('aug_smooth')} flips the input, which would move a "
                                 f"{self.task} model's region or boxes; it is for classifiers.")

    def _raws(self, method: Method, step: Step, cap: Captured, sel: Selection, ctx: Context,
              x: torch.Tensor, full: FullBackward | None) -> list[torch.Tensor]:
        """The method's raw maps (ReLU'd) at each layer (once, for FullGrad)."""
        cache: dict[int, Captured] = {}
        grad_free = not method.needs & {"regrad", "hvp", "noisy"}
        name, raws = method.name, []  # the name picks its noise generator
        for layer in range(len(self.layer_sites) if method.layerwise else 1):
            inputs = CamInputs(
                acts=cap.nchw[layer], grads=cap.grads[layer], x=x, targets=list(sel.classes),
                score=partial(score, step, self.objective, sel), score_batch=self.score_batch,
                base_scores=cap.scores,
                ablate=partial(self.ablation.run, step, sel, cap, layer, x),
                regrad=partial(self.capture.regrad, cap, layer) if cap.graph_out is not None
                else None, logits=cap.out if self.task == "classification" else None,
                hvp=partial(self.capture.hvp, cap, layer) if cap.graph_grads else None,
                noisy=partial(self.noise.noisy, step, sel, ctx, x, name, cache, layer),
                noise=partial(self.noise.noise, name, x.device), full=full,
                attention=partial(self.attention.run, step, x, sel) if self.attention else None)
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
        ctx = Context.of(step.batch, step.start, len(step), self.transform)
        accs = {m.name: MapSum() for m in self.methods}
        sel: Selection | None = None
        for n, (flip, factor) in enumerate(self.augs):
            xa = (x.flip(-1) if flip else x) * factor
            cap, sel = self.capture.run(step, xa, sel, ctx, keep=self.keep_graph)
            if n == 0:  # the identity
                scores, target_probs = cap.scores.tolist(), self.objective.probs(cap.out, sel)
                self.layer_shapes = [list(a.shape[1:]) for a in cap.nchw]
            full = self.fullgrad.run(step, xa, sel) if self.fullgrad is not None else None
            for m in self.methods:
                raws = self._raws(m, step, cap, sel, ctx, xa, full)
                accs[m.name].add(raws, x.shape[-2:], flip, len(self.augs) > 1)
            del cap, full
        assert sel is not None
        guided = self.guided.run(step, x, sel).x_grad if self.guided is not None else None
        results = {m.name: make_result(m, accs[m.name], sel, scores, target_probs, guided,
                                        [s.name for s in self.layer_sites])
                   for m in self.methods}
        if self.metrics is not None:
            prob = partial(probs, step, self.objective, sel)
            for name, res in results.items():
                maps = torch.from_numpy(res.maps)
                results[name] = replace(res, metrics=self.metrics.evaluate(prob, x, maps, self.score_batch))
        explained = CamBatch(batch=step.batch, start=step.start, results=results,
                             boxes=ctx.boxes, skipped=list(sel.skipped), **self._layers())
        self.notes.update(dict.fromkeys(why for why in sel.skipped if why is not None))
        self.notes.update(dict.fromkeys(explained.notes))
        if self.sink is not None:
            self.sink(explained)
        else:
            self.kept.append(explained)

    def finish(self) -> CamReport:
        results = {m.name: CamResult.concat([b.results[m.name] for b in self.kept])
                   for m in self.methods} if self.kept else {}
        return CamReport(methods=[m.name for m in self.methods], results=results,
                         notes=list(self.notes), task=self.task, **self._layers())

    def _layers(self) -> dict[str, Any]:
        """The layer fields of each batch and of the report: the first layer and all."""
        shapes = [list(s) for s in self.layer_shapes]
        return {"layer": self.layer_sites[0].name, "layer_shape": shapes[0] if shapes else [],
                "layers": [s.name for s in self.layer_sites], "layer_shapes": shapes}


def explain(model: nn.Module, inputs: Any, *, layer: Layers | None = None,
            methods: Sequence[str] = ("gradcam",), targets: Targets | None = None,
            reshape: str = "auto", score_batch: int = 32, transform: Any = None,
            sink: Callable[[CamBatch], None] | None = None,
            progress: Callable[[int], None] | None = None, output_key: str | None = None,
            autocast: torch.dtype | None = None, task: str | None = None,
            mask: np.ndarray | None = None, box_index: Sequence[int] = (), iou: float = 0.5,
            min_score: float = 0.5, **options: Any) -> CamReport:
    """Every CAM method over ``inputs`` (a batch, or an iterable of batches).

    ``layer`` None picks :func:`default_layer` on the first input (logged). ``task``,
    ``targets``, ``output_key``, ``mask``, ``box_index``, ``iou`` and ``min_score`` make the
    objective (see :func:`hookscope.cam.targets.make_objective`); the other arguments and
    ``options`` are those of :class:`CamProbe`.

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
        first, batches = peek(inputs)
        sample = getattr(first, "tensor", first)
        sample = sample.unsqueeze(0) if sample.dim() == 3 else sample
        layer, shape = default_layer(model, sample[:1], autocast=autocast, task=task)
        log.info("using layer %s, %s (%s channels on a %sx%s grid)", layer,
                 "the default for this model" if task == "classification" else
                 "the backbone's last stage", *shape[1:])
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


def gradcam(model: nn.Module, inputs: torch.Tensor | Iterable[torch.Tensor],
            layer: Layers | None = None, *, method: str = "gradcam",
            target: int | str | Sequence[int | str] | None = None, reshape: str = "auto",
            categories: Sequence[str] | None = None, score_batch: int = 32,
            output_key: str | None = None, **options: Any) -> CamResult:
    """Class activation maps of ``model`` for ``inputs`` at ``layer``.

    Args:
        model: a classifier returning (N, classes) logits (or a segmentation model or
            detector, see :func:`explain`); left with no hook, no ``.grad`` and its
            ``training`` flags unchanged.
        inputs: a preprocessed batch (N, C, H, W) or one image (C, H, W), or an iterable
            of batches.
        layer: dotted module name or the module, or a list of them (fused); None picks
            :func:`default_layer` (logged).
        method: one of :func:`method_names`.
        target: None or ``"top1"`` for the top class, ``"topK"``, a class index, a label (with
            ``categories``), or one of those per input (a list or a comma string).
        reshape, score_batch, options: :func:`explain`'s (``aug_smooth``, ``task``...).

    Raises:
        HookscopeError: unknown layer or method, a layer without a spatial output, or a
            target list whose length does not match the number of inputs.
    """
    options["task"] = options.get("task") or infer_task(model)
    targets = None if target is None and options["task"] == "detection" else \
        as_targets(target, categories)
    batches = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    batches = [b.unsqueeze(0) if b.dim() == 3 else b for b in batches]
    if targets is not None:
        targets.check_count(sum(len(b) for b in batches))
    report = explain(model, batches, layer=layer, methods=(method,), targets=targets,
                     reshape=reshape, score_batch=score_batch, output_key=output_key,
                     **options)
    for note in report.notes:
        log.warning(note)
    return report.results[get_method(method).name]
