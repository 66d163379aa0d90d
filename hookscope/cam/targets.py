"""What a class activation map explains, for each kind of model ("Segmentation and
detection" in docs/gradcam.md). An :class:`Objective` chooses from the clean pass what each
input explains (a :class:`Focus`), then scores any output against it, differentiably:
gradients, extra passes and metrics share one definition of "the target score".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hookscope.cam.methods import resize
from hookscope.core.classes import Targets, as_targets, parse_targets
from hookscope.core.errors import HookscopeError, param
from hookscope.core.logits import class_logits, select_logits

if TYPE_CHECKING:
    from hookscope.inputs.resolve import Batch

__all__ = ["Aim", "Focus", "Objective", "Origins", "TASKS", "aim_targets", "box_score", "infer_task",
           "load_mask", "task_targets"]

TASKS = ("classification", "segmentation", "detection")
Box = tuple[float, float, float, float]


@dataclass
class Focus:
    """What each input of a batch explains: its class (-1: several, for detection), its
    region (segmentation: (N, H, W) float at the output's size) or its detections (their
    ``boxes``, ``labels`` and ``scores``), and why it cannot be explained (None when it can)."""

    classes: list[int]
    masks: torch.Tensor | None = None
    detections: list[dict[str, torch.Tensor]] = field(default_factory=list)
    skipped: list[str | None] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Origins:
    """Where a batch's inputs came from: names, original sizes and crop boxes."""

    names: list[str]
    sizes: list[tuple[int, int] | None]
    boxes: list[Box | None]

    @staticmethod
    def of(batch: Batch | None, start: int, count: int, transform: Any) -> Origins:
        """A batch's context; ``transform`` places the crop (see :func:`crop_box`)."""
        if batch is None:
            return Origins([f"input {start + i}" for i in range(count)],
                           [None] * count, [None] * count)
        images = batch.images or [None] * count
        sizes = [image.size if image is not None else None for image in images]
        return Origins([item.name for item in batch.items], sizes,
                       [crop_box(transform, size) if size is not None else None
                        for size in sizes])


class Objective:
    """The target score of a classifier: the target class's logit."""

    kind = "classification"

    def __init__(self, targets: Targets | None = None, output_key: str | None = None) -> None:
        self.targets = targets or parse_targets(None, None)
        self.output_key = output_key

    def output(self, raw: Any) -> Any:
        """The part of the model's output that is scored."""
        return class_logits(raw, self.output_key, "Grad-CAM")

    def select(self, out: Any, x: torch.Tensor, start: int, origins: Origins) -> Focus:
        """What each input explains, from the clean pass's output."""
        return Focus(self.targets.resolve(out, start), skipped=[None] * len(x))

    def score(self, out: Any, focus: Focus, rows: Sequence[int]) -> torch.Tensor:
        """The target score of each output row, row j against input ``rows[j]``."""
        index = torch.tensor([focus.classes[r] for r in rows], device=out.device)
        return out.gather(1, index.unsqueeze(1)).squeeze(1)

    def probs(self, out: Any, focus: Focus) -> list[float | None]:
        """The target's probability per input (None where there is none)."""
        return class_probs(out, focus.classes).tolist()


class SegmentationObjective(Objective):
    """The summed logits of the target class over its predicted region (or a mask)."""

    kind = "segmentation"

    def __init__(self, targets: Targets | None = None, output_key: str | None = None,
                 mask: np.ndarray | None = None) -> None:
        super().__init__(targets, output_key)
        self.mask = mask

    def output(self, raw: Any) -> Any:
        out = select_logits(raw, self.output_key)
        if out is None or out.dim() != 4:
            shape = "nothing" if out is None else f"shape {list(out.shape)}"
            raise HookscopeError(f"A segmentation model must return (N, classes, H, W) "
                                 f"logits (torchvision's 'out'); it returned {shape}.")
        return out

    def _classes(self, out: torch.Tensor, start: int) -> list[int]:
        """The target classes, ``topK`` ranking classes by their predicted pixels."""
        n, k = out.shape[:2]
        pred = out.argmax(dim=1).reshape(n, -1)
        counts = torch.stack([torch.bincount(p, minlength=k) for p in pred]).float()
        counts[(counts[:, 1:] > 0).any(dim=1), 0] = -1.0  # background last, unless alone
        ranked = torch.argsort(counts, dim=1, descending=True, stable=True)
        return self.targets.resolve(out, start, ranked)

    def select(self, out: Any, x: torch.Tensor, start: int, origins: Origins) -> Focus:
        classes = self._classes(out, start)
        size = tuple(out.shape[-2:])
        notes = []
        if self.mask is not None:
            masks = torch.stack([_fit_mask(self.mask, x.shape[-2:], size, origins.sizes[i],
                                           origins.boxes[i], origins.names[i])
                                 for i in range(len(x))]).to(out.device, out.dtype)
        else:
            pred = out.argmax(dim=1)
            masks = (pred == torch.tensor(classes, device=out.device)[:, None, None]).to(
                out.dtype)
            notes = [f"{origins.names[i]}: class {c} is predicted on no pixel, so its map is "
                     "empty; give the region as a mask file."
                     for i, c in enumerate(classes) if not bool(masks[i].any())]
        return Focus(classes, masks=masks, skipped=[None] * len(x), notes=notes)

    def score(self, out: Any, focus: Focus, rows: Sequence[int]) -> torch.Tensor:
        idx = torch.tensor(list(rows), device=out.device)
        cls = torch.tensor([focus.classes[r] for r in rows], device=out.device)
        picked = out[torch.arange(len(idx), device=out.device), cls]
        assert focus.masks is not None
        return (picked * focus.masks[idx].to(picked.dtype)).sum(dim=(1, 2))

    def probs(self, out: Any, focus: Focus) -> list[float | None]:
        assert focus.masks is not None
        prob = torch.softmax(out.float(), dim=1)
        found: list[float | None] = []
        for i, c in enumerate(focus.classes):
            area = float(focus.masks[i].sum())
            found.append(float((prob[i, c] * focus.masks[i]).sum()) / area if area else None)
        return found


def box_score(out: dict[str, torch.Tensor], boxes: torch.Tensor, labels: torch.Tensor,
              iou: float) -> torch.Tensor:
    """pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` on one image's detections: for each
    reference box, the output box with the largest IoU adds its IoU plus its score, if that
    IoU is above ``iou`` and the labels match."""
    from torchvision.ops import box_iou

    found = out["boxes"]
    total = torch.zeros((), device=found.device, dtype=found.dtype)
    if len(found) == 0 or len(boxes) == 0:
        return total
    ious = box_iou(boxes.to(found), found)
    best, index = ious.max(dim=1)
    hit = (best > iou) & (out["labels"][index] == labels.to(out["labels"].device))
    return total + ((best + out["scores"][index]) * hit.to(found.dtype)).sum()


class DetectionObjective(Objective):
    """The summed box scores of chosen detections (``FasterRCNNBoxScoreTarget``)."""

    kind = "detection"

    def __init__(self, targets: Targets | None = None, *, box_index: Sequence[int] = (),
                 iou: float = 0.5, min_score: float = 0.5) -> None:
        super().__init__(targets)
        self.labelled = targets is not None
        if targets is not None and targets.ranks:
            raise HookscopeError(f"{param('target')} {','.join(map(str, targets.entries))}: "
                                 "a detector's target is a class label or index, not a rank.")
        self.box_index, self.iou, self.min_score = list(box_index), iou, min_score

    def output(self, raw: Any) -> Any:
        if not (isinstance(raw, (list, tuple)) and raw and all(
                isinstance(r, dict) and {"boxes", "labels", "scores"} <= set(r) for r in raw)):
            raise HookscopeError("A detector must return one dict of boxes, labels and "
                                 f"scores per image (torchvision's); it returned "
                                 f"{type(raw).__name__}.")
        return list(raw)

    def _chosen(self, det: dict[str, torch.Tensor], label: int | None, name: str
                ) -> tuple[torch.Tensor, str | None]:
        keep = torch.nonzero(det["scores"] >= self.min_score).flatten()
        if label is not None:
            keep = keep[det["labels"][keep] == label]
        what = f" of class {label}" if label is not None else ""
        if len(keep) == 0:
            return keep, (f"{name}: no detection{what} above min_score={self.min_score:g} "
                          "(--min-score); skipped.")
        if self.box_index:
            bad = [i for i in self.box_index if not 0 <= i < len(keep)]
            if bad:
                raise HookscopeError(
                    f"{param('box_index')} {bad[0]} is out of range: {name} has {len(keep)} "
                    f"detection(s){what} above {param('min_score')} {self.min_score:g} "
                    f"(0 to {len(keep) - 1}).")
            keep = keep[torch.tensor(self.box_index, device=keep.device)]
        return keep, None

    def select(self, out: Any, x: torch.Tensor, start: int, origins: Origins) -> Focus:
        self.targets.check_batch(start, len(out))
        focus = Focus([])
        for i, det in enumerate(out):
            label = int(self.targets.entries[start + i if self.targets.per_input else 0]) \
                if self.labelled else None
            keep, why = self._chosen(det, label, origins.names[i])
            focus.classes.append(label if label is not None else -1)
            focus.detections.append({k: det[k][keep].detach() for k in ("boxes", "labels",
                                                                         "scores")})
            focus.skipped.append(why)
        return focus

    def score(self, out: Any, focus: Focus, rows: Sequence[int]) -> torch.Tensor:
        return torch.stack([box_score(out[j], focus.detections[r]["boxes"],
                                      focus.detections[r]["labels"], self.iou)
                            for j, r in enumerate(rows)])

    def probs(self, out: Any, focus: Focus) -> list[float | None]:
        return [None] * len(out)


def class_probs(logits: torch.Tensor, classes: Sequence[int]) -> torch.Tensor:
    """The softmax probability of ``classes[i]`` in row i of ``logits`` (computed in float32)."""
    index = torch.tensor(list(classes), device=logits.device)
    return torch.softmax(logits.float(), dim=1).gather(1, index[:, None]).squeeze(1)


@dataclass(frozen=True)
class Aim:
    """What an explanation explains, Grad-CAM's and attribution's options alike: the
    ``targets`` of a model of ``task`` (None: from the model's class) at ``output_key``; a
    segmentation's region ``mask`` (None: where the model predicts the target); a detector's
    ``box_index``, ``iou`` and ``min_score``; and the faithfulness ``metrics`` and
    ``percentiles`` of the maps, seeded with ``seed`` (as the noisy methods)."""

    targets: Targets | None = None
    task: str | None = None
    output_key: str | None = None
    mask: np.ndarray | None = None
    box_index: Sequence[int] = ()
    iou: float = 0.5
    min_score: float = 0.5
    seed: int = 0
    metrics: Sequence[str] = ()
    percentiles: Sequence[float] | None = None

    def objective(self, model: Any) -> Objective:
        """The objective for the task; HookscopeError for an option that does not apply."""
        task = self.task or infer_task(model)
        if task not in TASKS:
            raise HookscopeError(f"{param('task')} {task!r}: choose one of {', '.join(TASKS)}.")
        if task != "detection" and self.box_index:
            raise HookscopeError(f"{param('box_index')} selects detections; this is a {task} "
                                 "model.")
        if task != "segmentation" and self.mask is not None:
            raise HookscopeError(f"{param('mask')} sets a segmentation region; this is a "
                                 f"{task} model.")
        if not 0.0 <= self.iou <= 1.0 or not 0.0 <= self.min_score <= 1.0:
            raise HookscopeError(f"{param('iou')} and {param('min_score')} must be within 0 "
                                 "and 1.")
        if task == "segmentation":
            return SegmentationObjective(self.targets, self.output_key, self.mask)
        if task == "detection":
            return DetectionObjective(self.targets, box_index=self.box_index, iou=self.iou,
                                      min_score=self.min_score)
        return Objective(self.targets, self.output_key)


def infer_task(model: Any) -> str:
    """``segmentation`` or ``detection`` for torchvision's model classes, else
    ``classification``."""
    names = {cls.__name__ for cls in type(model).__mro__}
    if names & {"GeneralizedRCNN", "RetinaNet", "FCOS", "SSD"}:
        return "detection"
    if names & {"_SimpleSegmentationModel", "LRASPP"}:
        return "segmentation"
    return "classification"


def load_mask(path: str | Path) -> np.ndarray:
    """A region from an image file: its non-zero pixels, as an (H, W) bool array
    (HookscopeError if the file cannot be read as an image)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            arr = np.asarray(img.convert("L") if img.mode not in ("L", "1", "I", "F") else img)
    except (OSError, UnidentifiedImageError) as exc:
        raise HookscopeError(f"{param('mask')} {str(path)!r} cannot be read as an image "
                             f"({exc.__class__.__name__}).") from None
    return arr != 0


def _fit_mask(mask: np.ndarray, input_hw: Sequence[int], out_hw: Sequence[int],
              size: tuple[int, int] | None, box: Box | None, name: str) -> torch.Tensor:
    """The mask at the output's resolution, from the input's size or the original image's
    (else HookscopeError)."""
    h, w = mask.shape
    t = torch.from_numpy(mask.astype(np.float32))
    if (h, w) == tuple(input_hw):
        fitted = t
    elif size is not None and (w, h) == tuple(size):
        left, top, right, bottom = box or (0.0, 0.0, float(w), float(h))
        crop = t[int(round(top)):int(round(bottom)), int(round(left)):int(round(right))]
        fitted = resize(crop[None], input_hw, "nearest")[0]
    else:
        sizes = f"{input_hw[1]}x{input_hw[0]} (the model input)"
        if size is not None:
            sizes = f"{size[0]}x{size[1]} (the image) or " + sizes
        raise HookscopeError(f"{param('mask')} is {w}x{h} pixels; for {name} it must be "
                             f"{sizes}.")
    return resize(fitted[None], out_hw, "nearest")[0]


def aim_targets(task: str, target: Any, categories: Sequence[str] | None,
                n_inputs: int) -> Targets | None:
    """``target`` (as :func:`~hookscope.core.classes.as_targets` takes it) for a ``task``
    model, checked against the number of inputs; None for a detector without one (every
    detection)."""
    if target is None and task == "detection":
        return None
    targets = as_targets(target, categories)
    targets.check_count(n_inputs)
    return targets


def task_targets(loaded: Any, target: str | None, n_inputs: int) -> tuple[str, Targets | None]:
    """A loaded model's task and its parsed ``target`` (see :func:`aim_targets`)."""
    task = loaded.task if loaded.task in TASKS else infer_task(loaded.model)
    return task, aim_targets(task, target, loaded.categories, n_inputs)


def crop_box(transform: Any, size: tuple[int, int]) -> Box:
    """Where the model's input lies in the original image of ``size`` (width, height):
    (left, top, right, bottom), for torchvision's classification presets (the shorter side
    resized to ``resize_size``, a centre crop of ``crop_size``); else the whole image."""
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
