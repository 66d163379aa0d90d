"""Grad-CAM and its family, with the autograd graph started at the target layer(s): see
"How it is fast" in docs/gradcam.md. Each kind of pass is its own object
(:mod:`hookscope.cam.passes`); the model is left as it was found, also when it raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from hookscope.cam.attention import AttentionPass
from hookscope.cam.faithfulness import class_scorer, metric_plan
from hookscope.cam.layer import default_layer, why_chosen
from hookscope.cam.methods import CamInputs, Method, get_method, method_names, project
from hookscope.cam.passes import BatchRun, CapturePass, InputPass, Placed, Switch, has_bias
from hookscope.cam.result import CamBatch, CamReport, CamResult, MapSum, make_result
from hookscope.cam.targets import Aim, Focus, Objective, Origins, aim_targets, infer_task
from hookscope.core.arguments import placement, rows, take
from hookscope.core.errors import HookscopeError, param
from hookscope.core.run import Step, drive, peek
from hookscope.core.select import Site, all_sites, find_site
from hookscope.numerics.layout import token_hint

log = logging.getLogger("hookscope")

__all__ = ["AUGMENTATIONS", "CamBatch", "CamOptions", "CamProbe", "CamReport", "CamResult",
           "RESHAPES", "check_explain", "default_layer", "explain", "gradcam", "method_names"]

RESHAPES = ("auto", "none", "vit", "swin")

#: pytorch-grad-cam's ``aug_smooth``: (horizontal flip, intensity factor), the identity first.
AUGMENTATIONS = ((False, 1.0), (False, 0.9), (False, 1.1), (True, 0.9), (True, 1.0),
                 (True, 1.1))
Layers = str | nn.Module | Sequence[str | nn.Module]


@dataclass(frozen=True)
class CamOptions(Aim):
    """The ``gradcam`` command's options (docs/gradcam.md), given once to :func:`explain`:
    :class:`~hookscope.cam.targets.Aim`'s, and the CAM's own."""

    methods: Sequence[str] = ("gradcam",)
    reshape: str = "auto"
    score_batch: int = 32
    aug_smooth: bool = False
    eigen_smooth: bool = False
    guided: bool = False
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    overlay_input: int | str | None = None


def _site(model: nn.Module, layer: str | nn.Module) -> Site:
    if not isinstance(layer, nn.Module):
        return find_site(model, layer)
    found = next((s for s in all_sites(model) if s.module is layer), None)
    if found is None:
        raise HookscopeError(f"The given layer ({type(layer).__name__}) is not part of the model.")
    return found


class CamProbe(Switch[CamReport]):
    """Computes one or more CAM methods at one or more layers, batch by batch.

    ``layer``: a dotted name or the module itself, or several (their maps are fused);
    ``transform``: the preprocessing, to place maps on the original images; ``sink``:
    receives each :class:`CamBatch` (without one, the report keeps the maps); ``objective``:
    replaces the one ``options`` make.
    """

    grad = "off"  # autograd starts at the layer: its hook switches it on

    def __init__(self, model: nn.Module, layer: Layers, options: CamOptions = CamOptions(), *,
                 transform: Any = None, sink: Callable[[CamBatch], None] | None = None,
                 objective: Objective | None = None) -> None:
        if options.reshape not in RESHAPES:
            raise HookscopeError(f"{param('reshape')} {options.reshape!r}: choose one of "
                                 f"{', '.join(RESHAPES)}.")
        if not options.methods:
            raise HookscopeError(f"No CAM method given ({param('method')}).")
        layers = [layer] if isinstance(layer, (str, nn.Module)) else list(layer)
        if not layers:
            raise HookscopeError(f"No layer given ({param('layer')}).")
        self.options, self.transform, self.sink = options, transform, sink
        self.layer_sites = list({s.name: s for s in (_site(model, i) for i in layers)}.values())
        self.methods: list[Method] = list({m.name: m for m in map(get_method, options.methods)
                                           }.values())
        self.objective = objective or options.objective(model)
        self.task = self.objective.kind
        self.augs = AUGMENTATIONS if options.aug_smooth else AUGMENTATIONS[:1]
        self.metrics = metric_plan(options.metrics, options.percentiles, options.seed, self.task)
        self._check_methods()
        needs = frozenset().union(*(m.needs for m in self.methods))
        self.keep_graph = bool(needs & {"regrad", "hvp"})
        self.noise = {m.name: torch.Generator().manual_seed(options.seed) for m in self.methods}
        self.notes: dict[str, None] = {}
        self._make_passes(model, needs)
        self.layer_shapes: list[list[int]] = []
        self.kept: list[CamBatch] = []

    def _make_passes(self, model: nn.Module, needs: frozenset[str]) -> None:
        """One object per kind of pass, and the union of their modules as the probe's sites."""
        objective, hint, guided = self.objective, token_hint(model), self.options.guided
        self.capture = CapturePass(self, objective, self.layer_sites, hint, self.options.reshape,
                                   any(m.gradients for m in self.methods), "hvp" in needs)
        everything = all_sites(model) if "full" in needs or guided else []
        bias = [s for s in everything if has_bias(s.module)] if "full" in needs else []
        relus = [s for s in everything if isinstance(s.module, nn.ReLU)] if guided else []
        self.fullgrad = InputPass(self, objective, bias, guided=False) if "full" in needs else None
        self.guided = InputPass(self, objective, relus, guided=True) if guided else None
        if guided and not relus:
            self.notes[f"{type(model).__name__} has no nn.ReLU module, so guided "
                       "backpropagation is the plain input gradient."] = None
        self.attention = None
        if "attention" in needs:
            self.attention = AttentionPass(self, objective, model, hint, self.options.head_fusion,
                                           self.options.discard_ratio)
        attention = self.attention.sites if self.attention is not None else []
        self.sites = list({id(s.module): s for s in [*self.layer_sites, *bias, *relus,
                                                     *attention]}.values())

    def _check_methods(self) -> None:
        """Refuse, before any pass, a method or option that cannot work with this model."""
        if self.task == "classification":
            return
        for m in self.methods:
            if m.classifier:
                raise HookscopeError(f"{m.name} compares a classifier's classes; this is a "
                                     f"{self.task} model ({param('method')}).")
        if self.options.aug_smooth:
            raise HookscopeError(f"{param('aug_smooth')} flips the input, which would move a "
                                 f"{self.task} model's region or boxes; it is for classifiers.")

    def _check_nd(self, x: torch.Tensor) -> None:
        """Refuse what needs an image for a signal (N, C, L) or volume (N, C, D, H, W)."""
        what = "a 1-D signal (N, C, L)" if x.dim() == 3 else "a volume or clip (N, C, D, H, W)"
        for m in self.methods:
            if m.image_only:
                raise HookscopeError(f"{m.name} {m.image_only}; the input is {what} "
                                     f"({param('method')}).")
        for name, why in (("guided", "draws the input gradient as an RGB image"),
                          ("aug_smooth", "flips and rescales images"),
                          ("metrics", "perturb images")):
            if getattr(self.options, name):
                raise HookscopeError(f"{param(name)} {why}; the input is {what}.")
        if self.task != "classification":
            raise HookscopeError(f"Grad-CAM of {what} explains classifiers; this is a "
                                 f"{self.task} model.")

    def _raws(self, method: Method, run: BatchRun) -> list[torch.Tensor]:
        """The method's raw maps (ReLU'd) at each layer (once, for FullGrad)."""
        grad_free = {"regrad", "hvp", "noisy"}.isdisjoint(method.needs)
        raws = []
        for layer in range(len(self.layer_sites) if method.layerwise else 1):
            inputs = CamInputs(run.cap.nchw[layer], run.cap.grads[layer], run.x,  # type: ignore[arg-type]
                               list(run.focus.classes), run, layer, method.name)
            with torch.set_grad_enabled(not grad_free):  # not inference mode: see PLAIN
                res = method.fn(inputs).float()
                if res.dim() == inputs.acts.dim():  # weighted activations, not a map
                    res = project(res) if self.options.eigen_smooth else res.sum(dim=1)
                raws.append(torch.nan_to_num(res, nan=0.0).clamp(min=0))
        return raws

    def step(self, plain: Step) -> None:
        place = placement(plain.x, self.options.overlay_input)
        x, step = place.shown, Placed.of(plain, place)
        if x.dim() != 4:
            self._check_nd(x)
        origins = Origins.of(step.batch, step.start, len(step), self.transform)
        accs = {m.name: MapSum() for m in self.methods}
        focus: Focus | None = None
        for n, (flip, factor) in enumerate(self.augs):
            xa = (x.flip(-1) if flip else x) * factor
            cap, focus = self.capture.run(step, xa, focus, origins, keep=self.keep_graph)
            if n == 0:  # the identity
                scores, target_probs = cap.scores.tolist(), self.objective.probs(cap.out, focus)
                self.layer_shapes = [list(a.shape[1:]) for a in cap.nchw]
            full = self.fullgrad.run(step, xa, focus) if self.fullgrad is not None else None
            run = BatchRun(self, step, cap, focus, origins, xa, full)
            for m in self.methods:
                accs[m.name].add(self._raws(m, run), x.shape[2:], flip, len(self.augs) > 1)
            del cap, full, run
        assert focus is not None
        guided = self.guided.run(step, x, focus).x_grad if self.guided is not None else None
        results = {m.name: make_result(m, accs[m.name], focus, scores, target_probs, guided,
                                        [s.name for s in self.layer_sites])
                   for m in self.methods}
        if self.metrics is not None:  # plain passes of perturbed inputs
            score = class_scorer(step, self.objective.output, focus.classes, step.place)
            results = {name: replace(res, metrics=self.metrics.evaluate(
                           score, x, torch.from_numpy(res.maps), self.options.score_batch))
                       for name, res in results.items()}
        explained = CamBatch(batch=step.batch, start=step.start, results=results,
                             boxes=origins.boxes, skipped=list(focus.skipped),
                             shown=x.detach().float().cpu())
        self.notes.update(dict.fromkeys(why for why in focus.skipped if why is not None))
        self.notes.update(dict.fromkeys(explained.notes))
        (self.sink or self.kept.append)(explained)

    def finish(self) -> CamReport:
        results = {m.name: CamResult.concat([b.results[m.name] for b in self.kept])
                   for m in self.methods} if self.kept else {}
        return CamReport(methods=[m.name for m in self.methods], results=results,
                         notes=list(self.notes), layers=[s.name for s in self.layer_sites],
                         layer_shapes=self.layer_shapes, task=self.task, options=self.options)


def explain(model: nn.Module, inputs: Any, options: CamOptions | None = None, *,
            layer: Layers | None = None, transform: Any = None,
            sink: Callable[[CamBatch], None] | None = None,
            progress: Callable[[int], None] | None = None,
            autocast: torch.dtype | None = None, **fields: Any) -> CamReport:
    """Every CAM method over ``inputs`` (a batch, or an iterable of batches).

    ``layer`` None picks :func:`default_layer` on the first input (logged); ``options`` and
    ``fields`` (which replace some of them) are :class:`CamOptions`' (``methods``,
    ``targets``, ``task``...), the others :class:`CamProbe`'s.

    Raises:
        HookscopeError: unknown layer or method, a layer without a spatial output, or an
            option that does not fit the model.
        ForwardError: the model's forward pass raised.
    """
    opts = replace(options or CamOptions(), **fields)
    objective = opts.objective(model)
    batches: Any = inputs
    if layer is None:
        first, batches = peek(inputs)
        sample = take(getattr(first, "tensor", first), slice(0, 1))
        placement(sample, opts.overlay_input)  # refused before the model runs
        layer, shape = default_layer(model, sample, autocast=autocast, task=objective.kind,
                                     overlay=opts.overlay_input)
        if any(get_method(m).layerwise for m in opts.methods):  # else no method uses it
            log.info("using layer %s, %s (%s channels on a %s grid)", layer,
                     why_chosen(layer, objective.kind), shape[1], "x".join(map(str, shape[2:])))
    probe = CamProbe(model, layer, opts, transform=transform, sink=sink, objective=objective)
    return drive(model, batches, probe, progress=progress, autocast=autocast)


def check_explain(model: nn.Module, *, layer: Layers | None = None, **fields: Any) -> None:
    """Raise what :func:`explain` with these arguments would refuse, without running the
    model (so a command that runs other analyses first refuses before any of them)."""
    sites = [s for s in all_sites(model) if s.name]
    if layer is not None or sites:
        CamProbe(model, layer if layer is not None else sites[-1].name, CamOptions(**fields))


def gradcam(model: nn.Module, inputs: torch.Tensor | Iterable[torch.Tensor],
            layer: Layers | None = None, *, method: str = "gradcam",
            target: int | str | Sequence[int | str] | None = None,
            categories: Sequence[str] | None = None, **options: Any) -> CamResult:
    """Class activation maps of ``model`` for ``inputs`` at ``layer``.

    Args:
        model: a classifier returning (N, classes) logits (or a segmentation model or
            detector, see :func:`explain`); left with no hook, no ``.grad`` and its
            ``training`` flags unchanged.
        inputs: a preprocessed batch (N, C, H, W) or one image (C, H, W), a signal batch
            (N, C, L) or a volume or clip batch (N, C, D, H, W) in a 1-tuple ``(x,)`` (the
            forward's arguments; a 5-D tensor also alone), a tuple or dict of the forward's
            arguments (the maps drawn on ``overlay_input``'s), or an iterable of batches.
        layer: dotted module name or the module, or a list of them (fused); None picks
            :func:`default_layer` (logged).
        method: one of :func:`method_names`.
        target: None or ``"top1"`` for the top class, ``"topK"``, a class index, a label (with
            ``categories``), or one of those per input (a list or a comma string).
        options: :class:`CamOptions`' (``reshape``, ``score_batch``, ``aug_smooth``,
            ``task``...).

    Raises:
        HookscopeError: unknown layer or method, a layer without a spatial output, or a
            target list whose length does not match the number of inputs.
    """
    task = options.pop("task", None) or infer_task(model)
    batches = [inputs] if isinstance(inputs, (torch.Tensor, tuple, dict)) else list(inputs)
    batches = [b.unsqueeze(0) if isinstance(b, torch.Tensor) and b.dim() == 3 else b
               for b in batches]
    targets = aim_targets(task, target, categories, sum(rows(b) for b in batches))
    report = explain(model, batches, layer=layer, methods=(method,), targets=targets, task=task,
                     **options)
    for note in report.notes:
        log.warning(note)
    return report.results[get_method(method).name]
