"""Grad-CAM and its family, with the autograd graph started at the target layer.

Speed: the forward pass runs with gradients disabled up to the target layer. That layer's
forward hook snapshots its output as a fresh leaf tensor, switches gradients on for the rest
of the forward pass and hands the model a clone of the leaf. ``torch.autograd.grad`` of the
summed target logits then reaches only the leaf: nothing before the layer keeps autograd
state, and no parameter gradient is ever computed, so a Grad-CAM costs about one forward pass.

Correctness: the snapshot is taken inside the hook, before any later in-place operation
(VGG's ``ReLU(inplace=True)``) can change the tensor, and the gradient is the one with respect
to the layer's own output.

The model is left as it was found: no hook, no ``.grad``, ``training`` flags and the
grad mode restored, also when the forward pass raises. :class:`CamProbe` is the analysis;
the one driver (:func:`hookscope.run.drive`) runs it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hookscope.cam_methods import CamInputs, Method, get_method, method_names
from hookscope.errors import HookscopeError, param
from hookscope.hooks import Call, Site, all_sites, find_site, first_tensor
from hookscope.outputs import class_logits
from hookscope.run import Probe, Step, drive, peek
from hookscope.targets import Targets, parse_targets

if TYPE_CHECKING:
    from hookscope.inputs import Batch

log = logging.getLogger("hookscope")

__all__ = [
    "CamBatch",
    "CamProbe",
    "CamReport",
    "CamResult",
    "RESHAPES",
    "crop_box",
    "default_layer",
    "explain",
    "gradcam",
    "method_names",
]

RESHAPES = ("auto", "none", "vit", "swin")


@dataclass(frozen=True)
class CamResult:
    """Class activation maps for a batch of inputs, one method, one layer.

    Attributes:
        method: the registered method name.
        layer: dotted module name of the target layer.
        maps: (N, H, W) float32 in [0, 1] at the input tensor's resolution.
        raw: (N, h, w) float32 at the layer's resolution, after ReLU, before normalisation.
        targets: the explained class index per input.
        scores: the target logit per input.
        probs: the target's softmax probability per input.
    """

    method: str
    layer: str
    maps: np.ndarray
    raw: np.ndarray
    targets: list[int]
    scores: list[float]
    probs: list[float]
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.targets)

    @property
    def peaks(self) -> list[tuple[int, int]]:
        """(y, x) of each map's maximum at input resolution."""
        out = []
        for m in self.maps:
            flat = int(np.argmax(m))
            out.append((flat // m.shape[1], flat % m.shape[1]))
        return out

    @staticmethod
    def concat(parts: Sequence[CamResult]) -> CamResult:
        """Join per-batch results of one method and layer."""
        first = parts[0]
        if len(parts) == 1:
            return first
        notes = list(dict.fromkeys(n for p in parts for n in p.notes))
        return CamResult(
            method=first.method,
            layer=first.layer,
            maps=np.concatenate([p.maps for p in parts]),
            raw=np.concatenate([p.raw for p in parts]),
            targets=[t for p in parts for t in p.targets],
            scores=[s for p in parts for s in p.scores],
            probs=[s for p in parts for s in p.probs],
            notes=notes,
        )


# ----------------------------------------------------------------------------- helpers


def _is_square(n: int) -> bool:
    return n > 1 and math.isqrt(n) ** 2 == n


def _spatial_reason(shape: Sequence[int], reshape: str) -> str | None:
    """Why an output of this shape cannot give a map (None when it can)."""
    dims = len(shape)
    if reshape in ("auto", "none") and dims == 4:
        return None if shape[2] * shape[3] > 1 else (
            f"its spatial size is {shape[2]}x{shape[3]}, so there is nowhere to point at")
    if reshape == "swin" and dims == 4:
        return None if shape[1] * shape[2] > 1 else (
            f"its spatial size is {shape[1]}x{shape[2]} (read as N, H, W, C)")
    if dims == 3 and reshape in ("auto", "vit", "swin"):
        tokens = shape[1]
        if _is_square(tokens - 1) or _is_square(tokens):
            return None
        return (f"its {tokens} tokens are not a square grid (with or without one CLS token)")
    if reshape == "none" and dims == 3:
        return f"it is a token sequence (N, tokens, C); set {param('reshape')} vit to use it"
    if reshape == "vit":
        return f"{param('reshape')} vit needs token outputs (N, tokens, C)"
    if dims < 3:
        return "it has no spatial dimensions"
    return f"it is {dims}-D; Grad-CAM needs (N, C, H, W) or ViT tokens (N, 1+h*w, C)"


def _auto_layout(model: nn.Module, layer: str) -> str:
    """``swin`` for torchvision Swin layers before its ``permute`` (channels-last), else auto."""
    if "Swin" in type(model).__name__ and (layer == "norm" or layer.startswith("features")):
        return "swin"
    return "auto"


def _to_nchw(t: torch.Tensor, reshape: str) -> torch.Tensor:
    """Bring an activation (or its gradient) to (N, C, h, w)."""
    if t.dim() == 4:
        return t.permute(0, 3, 1, 2) if reshape == "swin" else t
    n, tokens, c = t.shape
    if not _is_square(tokens):  # a CLS token first, then a square grid
        t = t[:, 1:]
        tokens -= 1
    side = math.isqrt(tokens)
    return t.reshape(n, side, side, c).permute(0, 3, 1, 2)


def _normalise(maps: torch.Tensor) -> torch.Tensor:
    """Min-max scale each (h, w) map to [0, 1]; a constant map becomes zeros."""
    flat = maps.reshape(maps.shape[0], -1)
    lo = flat.amin(dim=1).reshape(-1, 1, 1)
    span = (flat.amax(dim=1).reshape(-1, 1, 1) - lo)
    safe = torch.where(span > 0, span, torch.ones_like(span))
    return torch.where(span > 0, (maps - lo) / safe, torch.zeros_like(maps))


def _as_targets(target: Any, categories: Sequence[str] | None) -> Targets:
    if target is None:
        return parse_targets(None, categories)
    if isinstance(target, Targets):
        return target
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        return parse_targets(str(int(target)), categories)
    if isinstance(target, str):
        return parse_targets(target, categories)
    if isinstance(target, torch.Tensor):
        target = target.reshape(-1).tolist()
    return parse_targets(",".join(str(int(t) if not isinstance(t, str) else t) for t in target),
                         categories)


# ----------------------------------------------------------------------------- layers


class _LastSpatial(Probe[tuple[str, list[int]] | None]):
    """Remember the last module (in execution order) with a 4-D output larger than 1x1."""

    def __init__(self, model: nn.Module) -> None:
        self.sites = [s for s in all_sites(model) if s.name]
        self.found: tuple[str, list[int]] | None = None

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        t = first_tensor(output)
        if t is not None and t.dim() == 4 and t.shape[2] * t.shape[3] > 1:
            self.found = (call.name, list(t.shape))

    def finish(self) -> tuple[str, list[int]] | None:
        return self.found


def default_layer(model: nn.Module, sample: torch.Tensor, *,
                  autocast: torch.dtype | None = None) -> tuple[str, list[int]]:
    """The last module (in execution order) whose output is 4-D with a spatial size over 1x1.

    Runs one forward pass of ``sample`` (use one input) with a hook on every module.

    Raises:
        HookscopeError: no module has a spatial output.
    """
    found = drive(model, sample, _LastSpatial(model), autocast=autocast)
    if found is None:
        raise HookscopeError(
            f"{type(model).__name__} has no module with a spatial (N, C, H, W) output larger "
            f"than 1x1; choose {param('layer')} (with {param('reshape')} vit or swin for token "
            "outputs)."
        )
    return found


def _resolve_site(model: nn.Module, layer: str | nn.Module) -> Site:
    if isinstance(layer, nn.Module):
        for site in all_sites(model):
            if site.module is layer:
                return site
        raise HookscopeError(f"The given layer ({type(layer).__name__}) is not part of the model.")
    return find_site(model, layer)


# ----------------------------------------------------------------------------- engine


@dataclass(frozen=True)
class CamBatch:
    """One batch of inputs with every method's maps, as :class:`CamProbe` makes it.

    Attributes:
        batch: the inputs, their preprocessed tensor and (for image files) original images;
            None when the inputs were plain tensors.
        start: the index of the batch's first input among all inputs.
        results: per method name, the maps of the whole batch.
        layer: dotted name of the explained layer.
        layer_shape: the layer's output shape (C, h, w) for this batch.
        boxes: per input, where the model's input lies in the original image (a centre
            crop), or None for tensor inputs.
        peaks: per method, each input's (y, x) peak in original-image pixels (at the input
            tensor's resolution for tensor inputs).
    """

    batch: Batch | None
    start: int
    results: dict[str, CamResult]
    layer: str
    layer_shape: list[int]
    boxes: list[tuple[float, float, float, float] | None]
    peaks: dict[str, list[tuple[int, int]]]

    def __len__(self) -> int:
        return len(next(iter(self.results.values())))

    @property
    def notes(self) -> list[str]:
        """Every method's notes, in order, without repeats."""
        return list(dict.fromkeys(n for res in self.results.values() for n in res.notes))


@dataclass(frozen=True)
class CamReport:
    """What :class:`CamProbe` returns.

    ``results`` holds each method's maps over all inputs, unless a ``sink`` took the
    batches (then it is empty and only the layer and notes are kept).
    """

    layer: str
    layer_shape: list[int]
    methods: list[str]
    results: dict[str, CamResult]
    notes: list[str]


class CamProbe(Probe[CamReport]):
    """Computes one or more CAM methods at one layer, batch by batch.

    Args:
        model: a classifier returning (N, classes) logits.
        layer: dotted module name (or the module itself).
        methods: registered method names.
        targets: parsed targets (see :func:`hookscope.targets.parse_targets`).
        reshape: ``auto``, ``none``, ``vit`` (tokens with a CLS token) or ``swin`` (N, H, W, C).
        score_batch: masked inputs per forward pass for ScoreCAM.
        transform: the preprocessing, to place maps on the original images (see
            :func:`crop_box`).
        sink: receives each :class:`CamBatch` (e.g. to write its files); without one, the
            maps are kept and concatenated into the report.
        output_key: the entry of a dict or tuple output holding the logits (see
            :func:`hookscope.outputs.select_logits`).
    """

    grad = "off"  # autograd starts at the layer: its hook switches it on

    def __init__(self, model: nn.Module, layer: str | nn.Module,
                 methods: Sequence[str] = ("gradcam",), targets: Targets | None = None, *,
                 reshape: str = "auto", score_batch: int = 32, transform: Any = None,
                 sink: Callable[[CamBatch], None] | None = None,
                 output_key: str | None = None) -> None:
        if reshape not in RESHAPES:
            raise HookscopeError(f"{param('reshape')} {reshape!r}: choose one of "
                                 f"{', '.join(RESHAPES)}.")
        if not methods:
            raise HookscopeError(f"No CAM method given ({param('method')}).")
        self.model = model
        self.site = _resolve_site(model, layer)
        self.sites = [self.site]
        self.methods: list[Method] = list({m.name: m for m in map(get_method, methods)}.values())
        self.targets = targets or parse_targets(None, None)
        self.reshape = _auto_layout(model, self.site.name) if reshape == "auto" else reshape
        self.score_batch, self.transform, self.sink = score_batch, transform, sink
        self.output_key = output_key
        self.needs_grad = any(m.gradients for m in self.methods)
        self.capturing = False
        self.acts: torch.Tensor | None = None
        self.layer_shape: list[int] = []
        self.kept: list[CamBatch] = []
        self.notes: dict[str, None] = {}

    def _check(self, out: torch.Tensor) -> None:
        reason = _spatial_reason(list(out.shape), self.reshape)
        if reason is not None:
            raise HookscopeError(
                f"Layer {self.site.name!r} ({self.site.type}) outputs shape {list(out.shape)}, "
                f"which cannot give a class activation map: {reason}. Choose a convolutional "
                f"layer (or leave {param('layer')} out for the last spatial one); `hookscope "
                "layers MODEL` lists the names and shapes."
            )

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> Any:
        if not self.capturing:  # ScoreCAM's masked passes
            return None
        out = first_tensor(output)
        if out is None:
            raise HookscopeError(f"Layer {self.site.name!r} returned no tensor.")
        self._check(out)
        if not self.needs_grad:
            self.acts = out.detach().clone()
            return None
        # Last call wins: a module run several times is explained at its last call.
        leaf = out.detach().clone().requires_grad_(True)
        self.acts = leaf
        torch.set_grad_enabled(True)  # for the rest of this forward pass only
        # The model gets a non-leaf copy, so a following in-place op cannot touch the leaf.
        replacement = leaf.clone()
        if isinstance(output, torch.Tensor):
            return replacement
        if isinstance(output, (tuple, list)) and output and output[0] is out:
            return type(output)([replacement, *output[1:]])
        raise HookscopeError(
            f"Layer {self.site.name!r} returns a {type(output).__name__}; Grad-CAM needs a "
            "layer that returns a tensor (or a tuple starting with one)."
        )

    def _capture(self, step: Step) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor,
                                             list[int]]:
        """One forward (and backward) pass: activations, gradients, logits, targets."""
        self.capturing, self.acts = True, None
        try:
            logits = class_logits(step.forward(), self.output_key, "Grad-CAM")
        finally:
            self.capturing = False
        acts = self.acts
        if acts is None:
            raise HookscopeError(f"Layer {self.site.name!r} did not run during the forward "
                                 "pass; choose a layer the model uses.")
        chosen = self.targets.resolve(logits, step.start)
        grads = None
        if self.needs_grad:
            if not logits.requires_grad:
                raise self._disconnected()
            with torch.inference_mode(False), torch.enable_grad():
                index = torch.tensor(chosen, device=logits.device).unsqueeze(1)
                score = logits.gather(1, index).sum()
                (grads,) = torch.autograd.grad(score, acts, allow_unused=True)
            if grads is None:
                raise self._disconnected()
        return acts.detach(), grads, logits.detach(), chosen

    def _disconnected(self) -> HookscopeError:
        return HookscopeError(
            f"The model's output does not depend on layer {self.site.name!r}, so it has no "
            "gradient; choose a layer on the path to the classifier."
        )

    def step(self, step: Step) -> None:
        x = step.x
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise HookscopeError(f"Grad-CAM takes image batches (N, C, H, W); got {shape}.")
        acts, grads, logits, chosen = self._capture(step)
        acts = _to_nchw(acts, self.reshape).float()
        grads = _to_nchw(grads, self.reshape).float() if grads is not None else None
        self.layer_shape = list(acts.shape[1:])
        inputs = CamInputs(acts=acts, grads=grads, x=x, targets=chosen,
                           forward=lambda masked: class_logits(
                               step.forward(masked, grad="inference"), self.output_key,
                               "Grad-CAM"),
                           score_batch=self.score_batch)
        index = torch.tensor(chosen, device=logits.device).unsqueeze(1)
        scores = logits.float().gather(1, index).squeeze(1).tolist()
        probs = torch.softmax(logits.float(), dim=1).gather(1, index).squeeze(1).tolist()
        results = {m.name: self._method(m, inputs, tuple(x.shape[-2:]), chosen, scores, probs)
                   for m in self.methods}
        self._emit(step, results)

    def _method(self, method: Method, inputs: CamInputs, size: tuple[int, ...],
                chosen: list[int], scores: list[float], probs: list[float]) -> CamResult:
        with torch.inference_mode():
            raw = torch.nan_to_num(method.fn(inputs).float(), nan=0.0).clamp(min=0)
            up = F.interpolate(raw.unsqueeze(1), size=size, mode="bilinear",
                               align_corners=False).squeeze(1)
            maps = _normalise(up)
            notes = []
            if bool((raw.reshape(raw.shape[0], -1).amax(dim=1) <= 0).any()):
                notes.append(
                    f"{method.name}: some maps are zero everywhere at layer {self.site.name!r} "
                    "(the target score does not increase with any position's activations "
                    "there; for ViT, pick a block before the last one or its ln_1)."
                )
            return CamResult(
                method=method.name, layer=self.site.name,
                maps=maps.cpu().numpy().astype(np.float32, copy=False),
                raw=raw.cpu().numpy().astype(np.float32, copy=False),
                targets=list(chosen), scores=[float(s) for s in scores],
                probs=[float(p) for p in probs], notes=notes,
            )

    def _emit(self, step: Step, results: dict[str, CamResult]) -> None:
        images = step.batch.images if step.batch is not None else [None] * len(step)
        boxes = [crop_box(self.transform, image.size) if image is not None else None
                 for image in images]
        peaks = {name: [peak if box is None else peak_in_box(peak, res.maps.shape[1:], box)
                        for peak, box in zip(res.peaks, boxes, strict=True)]
                 for name, res in results.items()}
        explained = CamBatch(batch=step.batch, start=step.start, results=results,
                             layer=self.site.name, layer_shape=list(self.layer_shape),
                             boxes=boxes, peaks=peaks)
        self.notes.update(dict.fromkeys(explained.notes))
        if self.sink is not None:
            self.sink(explained)
        else:
            self.kept.append(explained)

    def finish(self) -> CamReport:
        results = {m.name: CamResult.concat([b.results[m.name] for b in self.kept])
                   for m in self.methods} if self.kept else {}
        return CamReport(layer=self.site.name, layer_shape=self.layer_shape,
                         methods=[m.name for m in self.methods], results=results,
                         notes=list(self.notes))


def explain(
    model: nn.Module,
    inputs: Any,
    *,
    layer: str | nn.Module | None = None,
    methods: Sequence[str] = ("gradcam",),
    targets: Targets | None = None,
    reshape: str = "auto",
    score_batch: int = 32,
    transform: Any = None,
    sink: Callable[[CamBatch], None] | None = None,
    progress: Callable[[int], None] | None = None,
    output_key: str | None = None,
    autocast: torch.dtype | None = None,
) -> CamReport:
    """Every CAM method over ``inputs`` (a batch, or an iterable of batches).

    ``layer`` None picks the last module with a spatial output larger than 1x1, found on the
    first input (logged). Other arguments are those of :class:`CamProbe`.

    Raises:
        HookscopeError: unknown layer or method, or a layer without a spatial output.
        ForwardError: the model's forward pass raised.
    """
    batches: Any = inputs
    if layer is None:
        first, batches = peek(inputs)
        sample = getattr(first, "tensor", first)
        sample = sample.unsqueeze(0) if sample.dim() == 3 else sample
        layer, shape = default_layer(model, sample[:1], autocast=autocast)
        log.info("using layer %s, the last module with a spatial output (%s)",
                 layer, "x".join(str(d) for d in shape[1:]))
    probe = CamProbe(model, layer, methods, targets, reshape=reshape, score_batch=score_batch,
                     transform=transform, sink=sink, output_key=output_key)
    return drive(model, batches, probe, progress=progress, autocast=autocast)


def gradcam(
    model: nn.Module,
    inputs: torch.Tensor | Iterable[torch.Tensor],
    layer: str | nn.Module | None = None,
    *,
    method: str = "gradcam",
    target: int | str | Sequence[int | str] | None = None,
    reshape: str = "auto",
    categories: Sequence[str] | None = None,
    score_batch: int = 32,
    output_key: str | None = None,
) -> CamResult:
    """Class activation maps of ``model`` for ``inputs`` at ``layer``.

    Args:
        model: a classifier returning (N, classes) logits; it is left with no hook, no
            ``.grad`` and its ``training`` flags unchanged.
        inputs: a preprocessed batch (N, C, H, W) or one image (C, H, W), or an iterable
            of batches.
        layer: dotted module name or the module; None picks the last module with a spatial
            output larger than 1x1 (logged).
        method: one of :func:`method_names`.
        target: None or ``"top1"`` for the top class, ``"topK"``, a class index, a label (with
            ``categories``), or one of those per input (a list or a comma string).
        reshape: ``auto`` (ViT tokens with a CLS token are reshaped automatically), ``none``,
            ``vit`` or ``swin`` (channels-last (N, H, W, C) or square token outputs).
        categories: class labels, for label targets.
        score_batch: masked inputs per forward pass for ScoreCAM.

    Returns:
        The maps, the raw layer-resolution maps, the targets and their scores.

    Raises:
        HookscopeError: unknown layer or method, a layer without a spatial output, or a
            target list whose length does not match the number of inputs.
    """
    targets = _as_targets(target, categories)
    if isinstance(inputs, torch.Tensor):
        inputs = inputs.unsqueeze(0) if inputs.dim() == 3 else inputs
        targets.check_count(inputs.shape[0])
    else:
        inputs = [b.unsqueeze(0) if b.dim() == 3 else b for b in inputs]
        targets.check_count(sum(b.shape[0] for b in inputs))
    report = explain(model, inputs, layer=layer, methods=(method,), targets=targets,
                     reshape=reshape, score_batch=score_batch, output_key=output_key)
    for note in report.notes:
        log.warning(note)
    return report.results[get_method(method).name]


# ----------------------------------------------------------------------------- geometry


def crop_box(transform: Any, size: tuple[int, int]) -> tuple[float, float, float, float]:
    """Where the model's input lies in the original image: (left, top, right, bottom).

    Follows torchvision's classification presets: the shorter side resized to
    ``resize_size``, then a centre crop of ``crop_size``. Other transforms map to the
    whole image.

    Args:
        transform: the preprocessing (e.g. ``weights.transforms()``).
        size: the original image's (width, height).
    """
    width, height = size
    resize = getattr(transform, "resize_size", None)
    crop = getattr(transform, "crop_size", None)
    if not resize or not crop or width < 1 or height < 1:
        return (0.0, 0.0, float(width), float(height))
    sizes = list(resize) if isinstance(resize, (list, tuple)) else [resize]
    c = list(crop) if isinstance(crop, (list, tuple)) else [crop]
    ch, cw = int(c[0]), int(c[-1])
    if len(sizes) > 1:  # an explicit (h, w) resize
        rh, rw = int(sizes[0]), int(sizes[1])
    elif width <= height:
        rw, rh = int(sizes[0]), int(int(sizes[0]) * height / width)
    else:
        rh, rw = int(sizes[0]), int(int(sizes[0]) * width / height)
    if ch > rh or cw > rw:  # the crop pads; keep the whole image
        return (0.0, 0.0, float(width), float(height))
    top = int(round((rh - ch) / 2.0))
    left = int(round((rw - cw) / 2.0))
    sx, sy = width / rw, height / rh
    return (left * sx, top * sy, (left + cw) * sx, (top + ch) * sy)


def peak_in_box(
    peak: tuple[int, int], map_size: tuple[int, int], box: tuple[float, float, float, float]
) -> tuple[int, int]:
    """Map a (y, x) peak of an (h, w) map onto original-image pixels inside ``box``."""
    (y, x), (h, w) = peak, map_size
    left, top, right, bottom = box
    py = top + (y + 0.5) * (bottom - top) / h
    px = left + (x + 0.5) * (right - left) / w
    return (int(py), int(px))

