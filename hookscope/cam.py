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
grad mode restored, also when the forward pass raises.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hookscope.cam_methods import CamInputs, Method, get_method, method_names
from hookscope.errors import ForwardError, HookscopeError
from hookscope.hooks import (
    Hooks,
    Site,
    Tracer,
    all_sites,
    find_site,
    first_tensor,
    model_device,
)
from hookscope.targets import Targets, parse_targets

if TYPE_CHECKING:
    from hookscope.inputs import Batch

log = logging.getLogger("hookscope")

__all__ = [
    "CamBatch",
    "CamResult",
    "CamRunner",
    "RESHAPES",
    "crop_box",
    "default_layer",
    "explain_batches",
    "gradcam",
    "method_names",
]

RESHAPES = ("auto", "none", "vit", "swin")
_FORWARD_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, AssertionError)


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
        return "it is a token sequence (N, tokens, C); pass --reshape vit to use it"
    if reshape == "vit":
        return "--reshape vit needs token outputs (N, tokens, C)"
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


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Run in eval mode and restore every module's ``training`` flag afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def _classifier_output(output: Any, model: nn.Module) -> torch.Tensor:
    logits = first_tensor(output)
    if logits is None or logits.dim() != 2:
        what = "no tensor" if logits is None else f"shape {list(logits.shape)}"
        raise HookscopeError(
            f"{type(model).__name__} returned {what}; "
            "Grad-CAM explains classifiers whose output is (N, classes)."
        )
    return logits


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


def default_layer(model: nn.Module, sample: torch.Tensor) -> tuple[str, list[int]]:
    """The last module (in execution order) whose output is 4-D with a spatial size over 1x1.

    Runs one forward pass of ``sample`` (use one input) with a hook on every module.

    Raises:
        HookscopeError: no module has a spatial output.
    """
    found: dict[str, Any] = {}

    def on_exit(call: Any, args: Any, kwargs: Any, output: Any) -> None:
        t = first_tensor(output)
        if t is not None and t.dim() == 4 and t.shape[2] * t.shape[3] > 1:
            found["name"], found["shape"] = call.name, list(t.shape)

    sites = [s for s in all_sites(model) if s.name]
    with _eval_mode(model), torch.inference_mode(), Tracer(model, sites, on_exit=on_exit) as tr:
        try:
            model(sample.to(model_device(model)))
        except HookscopeError:
            raise
        except _FORWARD_ERRORS as exc:
            raise tr.forward_error(exc) from exc
    if not found:
        raise HookscopeError(
            f"{type(model).__name__} has no module with a spatial (N, C, H, W) output larger "
            "than 1x1; pass --layer (with --reshape vit|swin for token outputs)."
        )
    return found["name"], found["shape"]


def _resolve_site(model: nn.Module, layer: str | nn.Module) -> Site:
    if isinstance(layer, nn.Module):
        for site in all_sites(model):
            if site.module is layer:
                return site
        raise HookscopeError(f"The given layer ({type(layer).__name__}) is not part of the model.")
    return find_site(model, layer)


# ----------------------------------------------------------------------------- engine


class CamRunner:
    """Computes one or more CAM methods for one layer, batch by batch.

    Args:
        model: a classifier returning (N, classes) logits.
        layer: dotted module name (or the module itself).
        methods: registered method names.
        targets: parsed targets (see :func:`hookscope.targets.parse_targets`).
        reshape: ``auto``, ``none``, ``vit`` (tokens with a CLS token) or ``swin`` (N, H, W, C).
        score_batch: masked inputs per forward pass for ScoreCAM.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: str | nn.Module,
        methods: Sequence[str] = ("gradcam",),
        targets: Targets | None = None,
        *,
        reshape: str = "auto",
        score_batch: int = 32,
    ) -> None:
        if reshape not in RESHAPES:
            raise HookscopeError(f"--reshape {reshape!r}: choose one of {', '.join(RESHAPES)}.")
        if not methods:
            raise HookscopeError("No CAM method given.")
        self.model = model
        self.site = _resolve_site(model, layer)
        self.methods: list[Method] = list({m.name: m for m in map(get_method, methods)}.values())
        self.targets = targets or parse_targets(None, None)
        self.reshape = _auto_layout(model, self.site.name) if reshape == "auto" else reshape
        self.score_batch = score_batch
        self.layer_shape: list[int] | None = None

    @property
    def needs_grad(self) -> bool:
        return any(m.gradients for m in self.methods)

    def _check(self, out: torch.Tensor) -> None:
        reason = _spatial_reason(list(out.shape), self.reshape)
        if reason is not None:
            raise HookscopeError(
                f"Layer {self.site.name!r} ({self.site.type}) outputs shape {list(out.shape)}, "
                f"which cannot give a class activation map: {reason}. Choose a convolutional "
                "layer (or leave --layer out for the last spatial one); `hookscope layers "
                "MODEL` lists the names and shapes."
            )

    def _capture(
        self, x: torch.Tensor, start: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, list[int]]:
        """One forward (and backward) pass: activations, gradients, logits, targets."""
        state: dict[str, torch.Tensor] = {}
        grad = self.needs_grad

        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            out = first_tensor(output)
            if out is None:
                raise HookscopeError(f"Layer {self.site.name!r} returned no tensor.")
            self._check(out)
            if not grad:
                state["acts"] = out.detach().clone()
                return None
            # Last call wins: a module run several times is explained at its last call.
            leaf = out.detach().clone().requires_grad_(True)
            state["acts"] = leaf
            torch.set_grad_enabled(True)
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

        with torch.inference_mode(False), torch.no_grad(), Hooks() as hooks:
            hooks.forward(self.site.module, hook)
            try:
                output = self.model(x)
            except HookscopeError:
                raise
            except _FORWARD_ERRORS as exc:
                message = " ".join(str(exc).split()) or exc.__class__.__name__
                raise ForwardError(f"The forward pass failed: {message}", cause=exc) from exc
            finally:
                hooks.remove()
            logits = _classifier_output(output, self.model)
            if "acts" not in state:
                raise HookscopeError(
                    f"Layer {self.site.name!r} did not run during the forward pass; choose a "
                    "layer the model uses."
                )
            chosen = self.targets.resolve(logits, start)
            acts = state["acts"]
            grads = None
            if grad:
                index = torch.tensor(chosen, device=logits.device).unsqueeze(1)
                if not logits.requires_grad:
                    raise self._disconnected()
                with torch.enable_grad():
                    score = logits.gather(1, index).sum()
                    (grads,) = torch.autograd.grad(score, acts, allow_unused=True)
                if grads is None:
                    raise self._disconnected()
                acts = acts.detach()
            logits = logits.detach()
        return acts, grads, logits, chosen

    def _disconnected(self) -> HookscopeError:
        return HookscopeError(
            f"The model's output does not depend on layer {self.site.name!r}, so it has no "
            "gradient; choose a layer on the path to the classifier."
        )

    def _forward_masked(self, x: torch.Tensor) -> torch.Tensor:
        return _classifier_output(self.model(x), self.model)

    def run(self, x: torch.Tensor, start: int = 0) -> dict[str, CamResult]:
        """Every method for one batch ``x`` (N, C, H, W); ``start`` indexes per-input targets."""
        if x.dim() == 3:
            x = x.unsqueeze(0)
        if x.dim() != 4:
            raise HookscopeError(
                f"Grad-CAM takes image batches (N, C, H, W); got shape {list(x.shape)}."
            )
        entries = len(self.targets.entries)
        if self.targets.per_input and start + x.shape[0] > entries:
            raise HookscopeError(
                f"--target lists {entries} targets for at least {start + x.shape[0]} input(s); "
                "give one target for all inputs or exactly one per input."
            )
        x = x.detach().to(model_device(self.model))
        with _eval_mode(self.model):
            acts, grads, logits, chosen = self._capture(x, start)
            acts = _to_nchw(acts, self.reshape).float()
            if grads is not None:
                grads = _to_nchw(grads, self.reshape).float()
            self.layer_shape = list(acts.shape[1:])
            probs = torch.softmax(logits.float(), dim=1)
            index = torch.tensor(chosen, device=logits.device).unsqueeze(1)
            scores = logits.float().gather(1, index).squeeze(1).tolist()
            target_probs = probs.gather(1, index).squeeze(1).tolist()
            inputs = CamInputs(acts=acts, grads=grads, x=x, targets=chosen,
                               forward=self._forward_masked, score_batch=self.score_batch)
            results: dict[str, CamResult] = {}
            for method in self.methods:
                with torch.inference_mode():
                    cam = method.fn(inputs)
                    raw = torch.nan_to_num(cam.float(), nan=0.0).clamp(min=0)
                    up = F.interpolate(raw.unsqueeze(1), size=tuple(x.shape[-2:]),
                                       mode="bilinear", align_corners=False).squeeze(1)
                    maps = _normalise(up)
                    notes = []
                    if bool((raw.reshape(raw.shape[0], -1).amax(dim=1) <= 0).any()):
                        notes.append(
                            f"{method.name}: some maps are zero everywhere at layer "
                            f"{self.site.name!r} (the target score does not increase with any "
                            "position's activations there; for ViT, pick a block before the "
                            "last one or its ln_1)."
                        )
                    results[method.name] = CamResult(
                        method=method.name,
                        layer=self.site.name,
                        maps=maps.cpu().numpy().astype(np.float32, copy=False),
                        raw=raw.cpu().numpy().astype(np.float32, copy=False),
                        targets=list(chosen),
                        scores=[float(s) for s in scores],
                        probs=[float(p) for p in target_probs],
                        notes=notes,
                    )
        return results


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
    batches: Iterable[torch.Tensor]
    if isinstance(inputs, torch.Tensor):
        batches = [inputs.unsqueeze(0) if inputs.dim() == 3 else inputs]
        targets.check_count(batches[0].shape[0])
    else:
        batches = inputs
    runner: CamRunner | None = None
    parts: list[CamResult] = []
    start = 0
    for batch in batches:
        batch = batch.unsqueeze(0) if batch.dim() == 3 else batch
        if runner is None:
            name = layer
            if name is None:
                name, shape = default_layer(model, batch[:1])
                log.info("using layer %s (the last module with a spatial output, %s)", name,
                         "x".join(map(str, shape[1:])))
            runner = CamRunner(model, name, (method,), targets, reshape=reshape,
                               score_batch=score_batch)
        parts.append(runner.run(batch, start)[runner.methods[0].name])
        start += batch.shape[0]
    if not parts:
        raise HookscopeError("No inputs given.")
    if targets.per_input:
        targets.check_count(start)
    result = CamResult.concat(parts)
    for note in result.notes:
        log.warning(note)
    return result


@dataclass(frozen=True)
class CamBatch:
    """One batch of inputs with every method's maps, as :func:`explain_batches` yields it.

    Attributes:
        batch: the inputs, their preprocessed tensor and (for image files) original images.
        results: per method name, the maps of the whole batch.
        layer: dotted name of the explained layer.
        layer_shape: the layer's output shape (C, h, w) for this batch.
        boxes: per input, where the model's input lies in the original image (a centre
            crop), or None for tensor inputs.
        peaks: per method, each input's (y, x) peak in original-image pixels (at the input
            tensor's resolution for tensor inputs).
    """

    batch: Batch
    results: dict[str, CamResult]
    layer: str
    layer_shape: list[int]
    boxes: list[tuple[float, float, float, float] | None]
    peaks: dict[str, list[tuple[int, int]]]

    def __len__(self) -> int:
        return len(self.batch)

    @property
    def notes(self) -> list[str]:
        """Every method's notes, in order, without repeats."""
        return list(dict.fromkeys(n for res in self.results.values() for n in res.notes))


def explain_batches(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    layer: str | None,
    methods: Sequence[str],
    targets: Targets,
    reshape: str = "auto",
    score_batch: int = 32,
    transform: Any = None,
) -> Iterator[CamBatch]:
    """Stream batches through every CAM method, one :class:`CamBatch` at a time.

    Args:
        model: a classifier returning (N, classes) logits.
        batches: batches from :func:`hookscope.inputs.iter_batches` (``keep_images=True``
            for peaks in original-image pixels).
        layer: dotted module name; None picks the last module with a spatial output larger
            than 1x1, found on the first batch (logged).
        methods: registered method names.
        targets: parsed targets (see :func:`hookscope.targets.parse_targets`).
        reshape: ``auto``, ``none``, ``vit`` or ``swin``.
        score_batch: masked inputs per forward pass for ScoreCAM.
        transform: the preprocessing, to find where the model's input lies in each original
            image (see :func:`crop_box`).

    Raises:
        HookscopeError: unknown layer or method, or a layer without a spatial output.
    """
    runner: CamRunner | None = None
    for batch in batches:
        if runner is None:
            name = layer
            if name is None:
                name, shape = default_layer(model, batch.tensor[:1])
                log.info("--layer not given; using %s, the last module with a spatial "
                         "output (%s)", name, "x".join(str(d) for d in shape[1:]))
            runner = CamRunner(model, name, methods, targets, reshape=reshape,
                               score_batch=score_batch)
        results = runner.run(batch.tensor, batch.start)
        boxes = [crop_box(transform, image.size) if image is not None else None
                 for image in batch.images]
        peaks: dict[str, list[tuple[int, int]]] = {}
        for mname, res in results.items():
            peaks[mname] = [peak if box is None else peak_in_box(peak, res.maps.shape[1:], box)
                            for peak, box in zip(res.peaks, boxes, strict=True)]
        yield CamBatch(batch=batch, results=results, layer=runner.site.name,
                       layer_shape=list(runner.layer_shape or []), boxes=boxes, peaks=peaks)


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

