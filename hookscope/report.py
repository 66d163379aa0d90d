"""One report over a model and its inputs: statistics, gradient flow and Grad-CAM together.

:func:`build_report` drives the three probes over the same inputs, and one sample for the FLOP
count, into a plain :class:`Report` with the findings (first non-finite output, dead layers,
vanishing or exploding gradients). :mod:`hookscope.render.report` draws it; nothing here
writes files.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from hookscope.cam.attribution import AttributionProbe, attr_options, overlay_map
from hookscope.cam.methods import PLAIN
from hookscope.cam.probe import check_explain, explain
from hookscope.cam.result import CamBatch, CamReport
from hookscope.cam.targets import task_targets
from hookscope.core.arguments import take
from hookscope.core.errors import ForwardError, HookscopeError
from hookscope.core.run import drive
from hookscope.core.select import LEAVES, Selection
from hookscope.numerics.health import DEAD
from hookscope.probes.grads import GradReport, GradsProbe
from hookscope.probes.stats import Prediction, StatsProbe, StatsReport
from hookscope.probes.structure import model_structure

if TYPE_CHECKING:
    from hookscope.inputs.resolve import Batch
from hookscope.sources import LoadedModel

__all__ = ["Attributions", "CamInput", "CamTarget", "DEAD", "Finding", "Report", "ReportOptions",
           "build_report", "find_issues", "left_out"]


Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class ReportOptions:
    """What each analysis of the report is asked to do: ``select`` and ``train_mode`` are
    ``stats``' and ``grads``', ``target`` Grad-CAM's and ``grads``' (see
    :func:`~hookscope.probes.grads.collect_grads` and :func:`~hookscope.cam.probe.explain`).
    """

    select: Selection = LEAVES
    target: str | None = None
    loss: str = "logit"
    label: str | None = None
    vanish: float = 1e-3
    explode: float = 1e3
    layer: str | None = None
    methods: Sequence[str] = ("gradcam",)
    reshape: str = "auto"
    score_batch: int = 32
    train_mode: bool = False
    max_side: int = 512  # the long side of the thumbnails kept for the page, in pixels
    attribution: str | None = "saliency"  # the method drawn beside the CAM (None: none)


@dataclass(frozen=True)
class CamTarget:
    """The class one CAM method explained for one input."""

    index: int
    label: str | None
    score: float
    prob: float | None


@dataclass(frozen=True)
class CamInput:
    """One input as the page shows it: its thumbnail (None for a tensor input, then ``tensor``
    holds it, preprocessed), where the model's input lies in it (``box``; None: all of it), per
    method the (H, W) map in [0, 1] and the class explained, the top-5 predictions (None: the
    logits held NaN or Inf), and why it was ``skipped`` (then ``maps`` is empty)."""

    name: str
    image: Image.Image | None
    box: Box | None
    maps: dict[str, np.ndarray]
    targets: dict[str, CamTarget]
    predictions: list[Prediction] | None = field(default_factory=list)
    tensor: torch.Tensor | None = field(default=None, repr=False)
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        predictions = None if self.predictions is None else [p.to_dict() for p in self.predictions]
        return {"input": self.name, "size": list(self.image.size) if self.image is not None else None,
                "targets": {m: asdict(t) for m, t in self.targets.items()},
                "predictions": predictions, "skipped": self.skipped}


@dataclass(frozen=True)
class Finding:
    """Something hookscope flags (``nonfinite``, ``dead``, ``grad_nonfinite``, ``vanish`` or
    ``explode``), as an ``error`` or a ``warning``, and the row of the table (``stats`` or
    ``grads``) that shows it."""

    kind: str
    severity: str
    table: str
    row: int
    name: str
    call: int
    detail: str


@dataclass(frozen=True)
class Attributions:
    """The attribution drawn beside each input's CAM (``hookscope attribute``'s): per input
    its overlay's (H, W) map in [0, 1], its target (no probability) and its sum."""

    method: str
    maps: list[np.ndarray]
    targets: list[CamTarget]
    sums: list[float]

    def to_dict(self, names: Sequence[str]) -> dict[str, Any]:
        return {"method": self.method, "inputs": [
            {"input": n, "target": asdict(t), "sum": s}
            for n, t, s in zip(names, self.targets, self.sums, strict=True)]}


def _attributions(loaded: LoadedModel, batches: Iterable[Batch], probe: AttributionProbe,
                  progress: Callable[[int], None] | None) -> Attributions:
    """Run ``probe`` (one method) and keep what the page draws."""
    (res,) = drive(loaded.model, batches, probe, autocast=loaded.autocast).results.values()
    if progress is not None:
        progress(len(res.targets))  # the inputs, not the rows the method evaluates
    targets = [CamTarget(t, loaded.label(t), s, None)
               for t, s in zip(res.targets, res.scores, strict=True)]
    return Attributions(res.method, [overlay_map(a) for a in res.attributions], targets,
                        res.sums)


@dataclass(frozen=True)
class Report:
    """Everything one page shows; :meth:`to_dict` is its plain-data form."""

    envelope: dict[str, Any]
    created: str
    params: int | None  # None: a lazy parameter never initialised
    flops: int | None
    flops_shape: list[int] | None
    stats: StatsReport
    grads: GradReport | None
    cam_layer: str
    cam_layer_default: bool
    methods: list[str]
    inputs: list[CamInput]
    findings: list[Finding]
    notes: list[str]
    options: ReportOptions
    #: Each section left out (``gradients`` for a kind of model, ``gradcam`` for inputs a map
    #: cannot be drawn on), with why.
    left_out: dict[str, str] = field(default_factory=dict)
    attribution: Attributions | None = None

    def to_dict(self) -> dict[str, Any]:
        """The envelope, then each analysis's document (as its command writes it)."""
        return self.envelope | {
            "created": self.created, "params": self.params, "flops": self.flops,
            "flops_input_shape": self.flops_shape, "stats": self.stats.to_dict(),
            "grads": self.grads.to_dict() if self.grads is not None else None,
            "left_out": dict(self.left_out),
            "gradcam": {"layer": self.cam_layer, "layer_default": self.cam_layer_default,
                        "methods": self.methods, "inputs": [i.to_dict() for i in self.inputs]},
            "attribution": None if self.attribution is None else self.attribution.to_dict(
                [i.name for i in self.inputs]),
            "findings": [asdict(f) for f in self.findings], "notes": list(self.notes),
            "thresholds": {"dead": DEAD, "vanish": self.options.vanish, "explode": self.options.explode}}


def find_issues(stats: StatsReport, grads: GradReport | None) -> list[Finding]:
    """The first non-finite output, dead calls, the first non-finite gradient, and vanishing or
    exploding ones."""
    found: list[Finding] = []
    first = next((i for i, r in enumerate(stats.layers) if r.nonfinite), None)
    if first is not None:
        row = stats.layers[first]
        found.append(Finding("nonfinite", "error", "stats", first, row.name, row.call,
                             f"first non-finite output: {row.nonfinite} NaN/Inf value(s)"))
    for i, row in enumerate(stats.layers):
        if math.isfinite(row.zero_fraction) and row.zero_fraction >= DEAD:
            found.append(Finding("dead", "warning", "stats", i, row.name, row.call,
                                 f"dead: {row.zero_fraction:.1%} of its outputs are zero"))
    if grads is None:
        return found
    median = grads.median_norm
    for i, layer in enumerate(grads.layers):
        if layer.flag == "nonfinite" and not any(f.kind == "grad_nonfinite" for f in found):
            found.append(Finding("grad_nonfinite", "error", "grads", i, layer.name, layer.call,
                                 f"first non-finite gradient (backward order): "
                                 f"{layer.nonfinite} NaN/Inf value(s)"))
        elif layer.flag in ("vanish", "explode"):
            ratio = layer.norm / median if median > 0 else math.nan
            word = "vanishing" if layer.flag == "vanish" else "exploding"
            found.append(Finding(layer.flag, "warning" if layer.flag == "vanish" else "error",
                                 "grads", i, layer.name, layer.call, f"{word} gradient: norm "
                                 f"{layer.norm:.3g}, {ratio:.3g}x the median call's"))
    return found


def left_out(task: str) -> dict[str, str]:
    """The sections a model of kind ``task`` leaves out of the report, each with why."""
    if task in ("detection", "segmentation"):
        return {"gradients": f"a {task} model has no (N, classes) class logits to "
                             "differentiate; its statistics and Grad-CAM are drawn"}
    return {}


class _CamCollector:
    """CAM sink: keeps a thumbnail, the maps and the targets of every input."""

    def __init__(self, loaded: LoadedModel, max_side: int) -> None:
        self.loaded, self.max_side = loaded, max_side
        self.inputs: list[CamInput] = []

    def __call__(self, explained: CamBatch) -> None:
        batch = explained.batch
        if batch is None:
            raise ValueError("the report needs batches from hookscope.inputs.resolve.iter_batches")
        skipped = explained.skipped or [None] * len(batch.items)
        for i, item in enumerate(batch.items):
            image, box = self._thumbnail(batch.images[i], explained.boxes[i])
            results = {} if skipped[i] else explained.results
            targets = {name: CamTarget(res.targets[i], self.loaded.label(res.targets[i]), res.scores[i],
                                       res.probs[i]) for name, res in results.items()}
            self.inputs.append(CamInput(
                name=item.name, image=image, box=box, targets=targets, skipped=skipped[i],
                maps={name: res.maps[i] for name, res in results.items()},
                tensor=explained.shown[i] if image is None and explained.shown is not None else None))

    def _thumbnail(self, image: Image.Image | None, box: Box | None
                   ) -> tuple[Image.Image | None, Box | None]:
        if image is None:
            return None, None
        small = image.convert("RGB")
        small.thumbnail((self.max_side, self.max_side), Image.Resampling.LANCZOS)
        if box is None:
            return small, None
        sx, sy = small.width / image.width, small.height / image.height
        return small, (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)


def _first_sample(batches: Callable[[], Iterable[Batch]]) -> Any:
    """The first input's arguments (a one-row batch), or None for no input."""
    it = iter(batches())
    try:
        first = next(it, None)
    finally:
        getattr(it, "close", lambda: None)()
    return None if first is None else take(first.tensor, slice(0, 1))


def _explain(loaded: LoadedModel, batches: Callable[[], Iterable[Batch]],
             collector: _CamCollector, options: dict[str, Any]) -> tuple[CamReport | None, str | None]:
    """Grad-CAM over the inputs, or None and why it does not apply: no input a map can be
    drawn on, or (with no layer given) no layer with a grid output."""
    try:
        return explain(loaded.model, batches(), transform=loaded.preprocess, sink=collector,
                       **options), None
    except HookscopeError as exc:
        if collector.inputs or options["layer"] is not None or isinstance(exc, ForwardError):
            raise
        return None, str(exc).rstrip(".")


class _PlainStats(StatsProbe):
    """``stats`` in passes the later gradient passes can follow (see
    :data:`hookscope.cam.methods.PLAIN`)."""

    grad = PLAIN


def build_report(loaded: LoadedModel, batches: Callable[[], Iterable[Batch]], names: Sequence[str],
                 options: ReportOptions | None = None, *,
                 progress: Callable[[int], None] | None = None) -> Report:
    """Run ``stats``, ``grads`` and Grad-CAM over the inputs and gather one report; every
    option is checked (HookscopeError) before the first forward pass. ``batches`` makes a fresh
    iterable of the batches, with their images (``keep_images=True``), once per analysis;
    ``progress`` is called with the inputs done, each analysis counting every input once.
    """
    opts = options or ReportOptions()
    model, categories, key = loaded.model, loaded.categories, loaded.output_key
    run: dict[str, Any] = {"autocast": loaded.autocast, "progress": progress}
    task, targets = task_targets(loaded, opts.target, len(names))
    skipped = left_out(task)
    for section, why in skipped.items():
        logging.getLogger("hookscope").info(f"{section} left out: {why}")
    cam_options: dict[str, Any] = {
        "layer": opts.layer, "methods": opts.methods, "targets": targets, "task": task,
        "reshape": opts.reshape, "score_batch": opts.score_batch, "output_key": key}
    check_explain(model, **cam_options)
    attr_probe = None if opts.attribution is None else AttributionProbe(model, attr_options(
        [opts.attribution], targets=targets, task=task, output_key=key))
    stats_probe = _PlainStats(model, categories=categories, output_key=key, select=opts.select)
    # With the cross-entropy loss, the target is Grad-CAM's alone (grads uses the label).
    grad_target = opts.target if opts.loss == "logit" else None
    grads_probe = None if "gradients" in skipped else GradsProbe(
        model, target=grad_target, loss=opts.loss, label=opts.label, vanish=opts.vanish,
        explode=opts.explode, categories=categories, n_inputs=len(names), output_key=key, select=opts.select)
    stats = drive(model, batches(), stats_probe, train_mode=opts.train_mode, **run)
    grads = None if grads_probe is None else drive(model, batches(), grads_probe,
                                                   train_mode=opts.train_mode, **run)
    collector = _CamCollector(loaded, opts.max_side)
    sample = _first_sample(batches)
    cam, no_cam = _explain(loaded, batches, collector, cam_options | run)
    if no_cam is not None:
        skipped["gradcam"] = no_cam
        logging.getLogger("hookscope").info(f"gradcam left out: {no_cam}")
    # An attribution is drawn over one image input: not beside a CAM left out, nor for a
    # forward of several inputs.
    image = cam is not None and isinstance(sample, torch.Tensor) and sample.dim() == 4
    attribution = _attributions(loaded, batches(), attr_probe, progress) \
        if attr_probe is not None and image else None
    counted = model_structure(model, sample, autocast=loaded.autocast)  # the first input's FLOPs
    shape = None if sample is None or stats.input_shape is None else [1, *stats.input_shape]
    predictions = stats.predictions or [[] for _ in collector.inputs]
    inputs = [replace(item, predictions=None if preds is None else list(preds))
              for item, preds in zip(collector.inputs, predictions, strict=False)]
    return Report(
        envelope=loaded.envelope("report", list(names)),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), params=counted.params,
        flops=None if sample is None else counted.flops,
        flops_shape=shape, stats=stats, grads=grads, cam_layer=cam.layer if cam else "",
        methods=cam.methods if cam else [], cam_layer_default=opts.layer is None, inputs=inputs,
        findings=find_issues(stats, grads), notes=cam.notes if cam else [], options=opts,
        left_out=skipped, attribution=attribution)
