"""What the CAM engine returns (:class:`CamResult` per method, :class:`CamBatch` per batch,
:class:`CamReport` per run), how raw maps become a result, and :class:`CamRows`, the sink
that makes the ``gradcam`` document.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hookscope.cam.methods import Method, get_method, minmax, resize
from hookscope.cam.targets import Box, Focus

if TYPE_CHECKING:
    from hookscope.cam.probe import CamOptions
    from hookscope.inputs.resolve import Batch

#: A raw map whose range is within this fraction of its magnitude (128 float32 ulps) is
#: constant: its variation is the rounding of the sums that made it, not localisation.
CONSTANT_RTOL = 128 * float(torch.finfo(torch.float32).eps)


@dataclass(frozen=True)
class CamResult:
    """Class activation maps for a batch of inputs, one method.

    Attributes:
        maps: (N, H, W) float32 in [0, 1] at the input tensor's resolution ((N, L) for a
            signal input (N, C, L), (N, D, H, W) for a volume or clip (N, C, D, H, W)).
        raw: (N, h, w) float32 (or (N, l), (N, d, h, w)) at the first layer's resolution,
            after ReLU, before normalisation (FullGrad's is at the input's resolution);
            ``raws``: per layer.
        targets: the explained class index per input (-1: several classes).
        probs: the target's softmax probability per input (None where there is none).
        skipped: per input, why it was not explained (None when it was).
        guided: with ``guided``, (N, H, W, 3): the map times guided backpropagation.
        constant: per input, whether every raw map was constant (see
            :data:`CONSTANT_RTOL`): the map is then all zeros, not noise stretched to [0, 1].
    """

    method: str
    layers: list[str]
    maps: np.ndarray
    raws: list[np.ndarray]
    targets: list[int]
    scores: list[float]
    probs: list[float | None]
    notes: list[str] = field(default_factory=list)
    skipped: list[str | None] = field(default_factory=list)
    guided: np.ndarray | None = None
    regions: np.ndarray | None = None
    detections: list[list[dict[str, Any]]] | None = None
    metrics: dict[str, np.ndarray] = field(default_factory=dict)
    constant: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.targets)

    @property
    def layer(self) -> str:
        return self.layers[0]

    @property
    def raw(self) -> np.ndarray:
        return self.raws[0]

    @property
    def peaks(self) -> list[tuple[int, ...] | None]:
        """(y, x) of each map's maximum ((l,) of a signal's, (d, y, x) of a volume's); None for
        a blank map or a non-finite score."""
        return [tuple(int(v) for v in np.unravel_index(int(np.argmax(m)), m.shape))
                if m.max() > 0 and math.isfinite(score) else None
                for m, score in zip(self.maps, self.scores, strict=True)]

    @staticmethod
    def concat(parts: Sequence[CamResult]) -> CamResult:
        """Join per-batch results of one method and layer."""
        first = parts[0]
        joined: dict[str, Any] = {}
        for name in ("maps", "guided", "regions"):  # arrays, or None
            arrays = [getattr(p, name) for p in parts]
            joined[name] = None if any(a is None for a in arrays) else np.concatenate(arrays)
        for name in ("targets", "scores", "probs", "skipped", "constant", "detections"):
            values = [getattr(p, name) for p in parts]
            joined[name] = None if any(v is None for v in values) else list(chain(*values))
        return replace(
            first, **joined, notes=list(dict.fromkeys(n for p in parts for n in p.notes)),
            raws=[np.concatenate(r) for r in zip(*(p.raws for p in parts), strict=True)],
            metrics={k: np.concatenate([p.metrics[k] for p in parts]) for k in first.metrics})


def _constant(raws: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per input, whether every layer's raw (N, h, w) map has a range within
    :data:`CONSTANT_RTOL` of its largest magnitude (an all-zero map included)."""
    flat = [raw.flatten(1).float() for raw in raws]
    return torch.stack([f.amax(dim=1) - f.amin(dim=1) <= CONSTANT_RTOL * f.abs().amax(dim=1)
                        for f in flat]).all(dim=0)


def fuse(raws: Sequence[torch.Tensor], size: Sequence[int]) -> torch.Tensor:
    """One pass's map at ``size`` from the raw maps of one or more layers, as
    pytorch-grad-cam: each scaled (its ``scale_cam_image``), resized, averaged over layers
    and scaled again, with its 1e-7 in each denominator (so a pass with tiny maps weighs
    less in ``aug_smooth``)."""
    dims = len(size)
    return minmax(torch.stack([resize(minmax(r, 1e-7, dims), size) for r in raws]).mean(dim=0),
                  1e-7, dims)


@dataclass(frozen=True)
class CamBatch:
    """One batch of inputs with every method's maps: what a sink receives. ``batch`` is
    None for plain tensors; ``start`` is its first input's index; per input, ``boxes`` say
    where the model's input lies in the original image (or None) and ``skipped`` why it was
    not explained (None when it was: no file is written for it)."""

    batch: Batch | None
    start: int
    results: dict[str, CamResult]
    boxes: list[Box | None]
    skipped: list[str | None] = field(default_factory=list)
    #: The input the maps are drawn on, on the CPU in float32 (see
    #: :func:`hookscope.core.arguments.placement`); None for a sink that does not need it.
    shown: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(next(iter(self.results.values())))

    @property
    def notes(self) -> list[str]:
        """Every method's notes, in order, without repeats."""
        return list(dict.fromkeys(n for res in self.results.values() for n in res.notes))


@dataclass(frozen=True)
class CamReport:
    """What :class:`CamProbe` returns: ``results`` is empty when a ``sink`` took the batches;
    ``layer`` and ``layer_shape`` are the first of ``layers`` and ``layer_shapes``;
    ``options``, the run's."""

    methods: list[str]
    results: dict[str, CamResult]
    notes: list[str]
    layers: list[str]
    layer_shapes: list[list[int]]
    task: str
    options: CamOptions

    @property
    def layer(self) -> str:
        return self.layers[0]

    @property
    def layer_shape(self) -> list[int]:
        return self.layer_shapes[0] if self.layer_shapes else []


def deprocess(values: np.ndarray) -> np.ndarray:
    """pytorch-grad-cam's ``deprocess_image``: standardise, scale by 0.1 around 0.5, uint8."""
    img = values - np.mean(values)
    img = img / (np.std(img) + 1e-5)
    return (np.clip(img * 0.1 + 0.5, 0, 1) * 255).astype(np.uint8)


def peak_in_box(peak: tuple[int, int], map_size: tuple[int, int], box: Box) -> tuple[int, int]:
    """Map a (y, x) peak of an (h, w) map onto original-image pixels inside ``box``."""
    (y, x), (h, w) = peak, map_size
    left, top, right, bottom = box
    py = top + (y + 0.5) * (bottom - top) / h
    px = left + (x + 0.5) * (right - left) / w
    return (int(py), int(px))


class CamRows:
    """A sink for :func:`hookscope.cam.probe.explain` that keeps the ``gradcam`` document's
    rows (one per input and method) and the inputs skipped; :meth:`document` is the document.

    Args:
        plans: per input of the whole run, per method, its files' paths (see
            :func:`hookscope.render.heatmap.output_paths`).
        label: the class name of an index, or None (``LoadedModel.label``).
        save_raw: the raw ``.npy`` maps are written (each row names them).
    """

    def __init__(self, plans: Sequence[dict[str, dict[str, Path | None]]],
                 label: Callable[[int], str | None] = lambda index: None, *,
                 save_raw: bool = False) -> None:
        self.plans, self.label, self.save_raw = plans, label, save_raw
        self.rows: list[dict[str, Any]] = []
        self.skipped: list[dict[str, str]] = []

    def __call__(self, explained: CamBatch) -> None:
        batch = explained.batch
        if batch is None:
            raise ValueError(f"{type(self).__name__} needs batches from "
                             "hookscope.inputs.resolve.iter_batches")
        peaks = {name: res.peaks for name, res in explained.results.items()}
        for i, item in enumerate(batch.items):
            why = explained.skipped[i] if explained.skipped else None
            if why is not None:
                self.skipped.append({"input": item.name, "reason": why})
                continue
            for name, res in explained.results.items():
                peak, box = peaks[name][i], explained.boxes[i]
                if peak is not None and len(peak) == 2 and box is not None:
                    peak = peak_in_box((peak[0], peak[1]), res.maps.shape[1:], box)
                self.rows.append(self._row(item.name, name, res, i,
                                           self.plans[batch.start + i][name], peak))

    def _row(self, input_name: str, method: str, res: CamResult, i: int,
             paths: dict[str, Path | None], peak: tuple[int, ...] | None) -> dict[str, Any]:
        target = res.targets[i] if res.targets[i] >= 0 else None
        layer = res.layer if get_method(method).layerwise else None  # FullGrad, rollout...
        row: dict[str, Any] = {
            "input": input_name, "method": method, "layer": layer, "target": target,
            "label": self.label(target) if target is not None else None,
            "score": res.scores[i], "prob": res.probs[i],
            "overlay": str(paths["overlay"]), "heatmap": str(paths["heatmap"]),
            "raw": str(paths["raw"]) if paths["raw"] is not None else None,
            "peak": None, "layers": list(res.layers),
            "constant": bool(res.constant[i]) if res.constant else False,
        }
        if peak is not None and not row["constant"]:  # a blank map has no peak
            row["peak"] = list(peak)
        if len(res.layers) > 1:
            row["raw_layers"] = {layer: str(paths[f"raw.{layer}"]) if self.save_raw else None
                                 for layer in res.layers}
        if paths.get("guided") is not None:
            row["guided"] = str(paths["guided"])
        if res.metrics:
            row["metrics"] = {k: float(v[i]) for k, v in res.metrics.items()}
        if res.regions is not None:
            row["region_pixels"] = int(res.regions[i].sum())
        if res.detections is not None:
            row["detections"] = [d | {"label_name": self.label(d["label"])}
                                 for d in res.detections[i]]
        return row

    def document(self, report: CamReport, *, out: Path, layer_default: bool) -> dict[str, Any]:
        """The ``gradcam`` document after the envelope, for the ``report`` that ``explain``
        returned with this sink."""
        opts = report.options
        return {
            "layer": report.layer, "layer_default": layer_default,
            "layer_shape": report.layer_shape, "methods": report.methods, "out": str(out),
            "results": self.rows, "layers": report.layers, "layer_shapes": report.layer_shapes,
            "task": report.task, "aug_smooth": opts.aug_smooth, "eigen_smooth": opts.eigen_smooth,
            "guided": opts.guided, "metrics": metric_means(self.rows), "skipped": self.skipped}


def metric_means(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per method, each metric's mean over the rows (inputs) that have it."""
    sums: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        for key, value in (row.get("metrics") or {}).items():
            sums.setdefault(row["method"], {}).setdefault(key, []).append(value)
    return {m: {k: float(np.mean(v)) for k, v in found.items()} for m, found in sums.items()}


class MapSum:
    """One method's maps summed over augmentations."""

    def __init__(self) -> None:
        self.maps: torch.Tensor | None = None
        self.raws: list[torch.Tensor] = []
        self.count = 0

    def add(self, raws: list[torch.Tensor], size: Sequence[int], flip: bool, smooth: bool
            ) -> None:
        maps = fuse(raws, size)
        if smooth:  # each raw map scaled, then averaged over augmentations
            raws = [minmax(r, 1e-7, r.dim() - 1) for r in raws]
        if flip:
            maps, raws = maps.flip(-1), [r.flip(-1) for r in raws]
        self.maps = maps if self.maps is None else self.maps + maps
        self.raws = raws if not self.raws else [a + b for a, b in
                                                zip(self.raws, raws, strict=True)]
        self.count += 1

    def result(self) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """The maps in [0, 1], the raw maps, and which inputs' maps are constant (zeros)."""
        assert self.maps is not None
        raws = self.raws if self.count == 1 else [r / self.count for r in self.raws]
        constant = _constant(raws)
        dims = self.maps.dim() - 1
        maps = torch.where(constant.reshape(-1, *[1] * dims), torch.zeros_like(self.maps),
                           # a constant map's 0 / 0 becomes zeros
                           torch.nan_to_num(minmax(self.maps / self.count, 0.0, dims), nan=0.0))
        return maps, raws, constant


def make_result(method: Method, acc: MapSum, focus: Focus, scores: list[float],
                probs: list[float | None], guided: torch.Tensor | None, layers: Sequence[str]
                ) -> CamResult:
    """One method's result for a batch: its averaged maps, with notes on blank ones."""
    maps, raws, constant = acc.result()
    notes = list(focus.notes)
    finite = [math.isfinite(float(s)) or why is not None  # a skipped input has no score
              for s, why in zip(scores, focus.skipped, strict=True)]
    if not all(finite):  # NaN or Inf in the input, or the model made them
        notes.append(
            f"{method.name}: the target score of {finite.count(False)} input(s) is not "
            "finite (NaN or Inf: check the input, or where `hookscope debug` finds the "
            "first non-finite output); their maps are blank.")
        maps = maps * torch.tensor(finite, dtype=maps.dtype, device=maps.device).reshape(
            -1, *[1] * (maps.dim() - 1))
    zero = [float(r.amax()) <= 0 and why is None and ok for r, why, ok in
            zip(raws[0], focus.skipped, finite, strict=True)]
    if any(zero):
        notes.append(
            f"{method.name}: some maps are zero everywhere at layer "
            f"{layers[0]!r} (the target score does not increase with any "
            "position's activations there; for ViT, pick a block before the last one or "
            "its ln_1).")
    if any(c and not z and why is None
           for c, z, why in zip(constant.tolist(), zero, focus.skipped, strict=True)):
        notes.append(
            f"{method.name}: some maps are constant at layer {layers[0]!r} "
            "(their range is float rounding, so they carry no localisation) and are "
            "drawn blank; choose a layer whose spatial grid is larger than 1x1 at this "
            "input size.")
    mixed = None if guided is None else (maps.unsqueeze(1) * guided).permute(0, 2, 3, 1).cpu().numpy()
    raw_np = [r.cpu().numpy().astype(np.float32, copy=False) for r in raws]
    return CamResult(
        method=method.name, maps=maps.cpu().numpy().astype(np.float32, copy=False),
        targets=list(focus.classes), scores=[float(s) for s in scores], probs=list(probs),
        notes=notes, layers=list(layers),
        raws=raw_np * (1 if method.layerwise else len(layers)),
        skipped=list(focus.skipped), guided=mixed, regions=_regions(focus, maps.shape[-2:]),
        detections=detection_rows(focus), constant=constant.tolist())


def _regions(focus: Focus, size: Sequence[int]) -> np.ndarray | None:
    if focus.masks is None:
        return None
    return (resize(focus.masks.float(), size, "nearest") > 0.5).cpu().numpy()


def detection_rows(focus: Focus) -> list[list[dict[str, Any]]] | None:
    if not focus.detections:
        return None
    return [[{"box": [float(v) for v in box], "label": int(label), "score": float(score)}
             for box, label, score in zip(*(d[k].tolist() for k in ("boxes", "labels", "scores")),
                                          strict=True)]
            for d in focus.detections]
