"""How images become a model's input: resize, centre crop, channels, normalisation.

One :class:`Preprocess` describes and applies it, whatever the model's source, and records
what it does (:meth:`Preprocess.to_dict`, in every JSON envelope).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from hookscope.core.errors import HookscopeError, param

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "Preprocess", "check_side", "check_values",
           "with_overrides"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MIN_SIZE, MAX_SIZE = 8, 8192  # input sides accepted, in pixels


def _side(value: int | Sequence[int] | None) -> int | None:
    if isinstance(value, (list, tuple)):
        value = value[0]
    return None if value is None else int(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Preprocess:
    """Resize the shorter side (``stretch``: both sides), centre-crop, convert to
    ``channels``, normalise. ``transform``, when given, is applied instead (the weights' own,
    or timm's); the fields still describe what it does."""

    resize: int | None = 256  # None: no resize
    crop: int | None = 224  # None: no crop
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    channels: int = 3  # or 1 (grayscale)
    interpolation: str = "bilinear"  # or bicubic, nearest
    origin: str = "default"  # where the settings came from: weights, timm, options...
    stretch: bool = False
    transform: Callable[[Any], torch.Tensor] | None = field(default=None, compare=False, repr=False)

    @property
    def resize_size(self) -> list[int] | None:
        """torchvision presets' name for :attr:`resize`."""
        if self.resize is None:
            return None
        return [self.resize, self.resize] if self.stretch else [self.resize]

    @property
    def crop_size(self) -> list[int] | None:
        """torchvision presets' name for :attr:`crop`."""
        return [self.crop] if self.crop is not None else None

    @property
    def input_size(self) -> tuple[int, int]:
        """(height, width) of one preprocessed image."""
        side = self.crop or self.resize or 224
        return (side, side)

    def __call__(self, image: Any) -> torch.Tensor:
        if self.transform is not None:
            return self.transform(image)
        return self._pipeline()(image)

    def _pipeline(self) -> Callable[[Any], torch.Tensor]:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import v2 as T

        steps: list[Any] = []
        if self.resize is not None:
            side = (self.resize, self.resize) if self.stretch else self.resize
            steps.append(T.Resize(side, InterpolationMode(self.interpolation), antialias=True))
        if self.crop is not None:
            steps.append(T.CenterCrop(self.crop))
        if self.channels == 1:
            steps.append(T.Grayscale(1))
        steps += [T.PILToTensor(), T.ToDtype(torch.float32, scale=True),
                  T.Normalize(list(self.mean), list(self.std))]
        return T.Compose(steps)

    def to_dict(self) -> dict[str, Any]:
        """What the JSON envelope records as ``preprocessing``."""
        found = {k: v for k, v in vars(self).items() if k not in ("stretch", "transform")}
        found |= {"mean": list(self.mean), "std": list(self.std)}  # JSON arrays, also in Python
        return found | {"stretch": True} if self.stretch else found

    @classmethod
    def from_preset(cls, preset: Any, origin: str) -> Preprocess:
        """Describe torchvision's ``ImageClassification``-like preset, and apply it as is."""
        mode = getattr(preset, "interpolation", None)
        return cls(resize=_side(getattr(preset, "resize_size", None)),
                   crop=_side(getattr(preset, "crop_size", None)),
                   mean=tuple(getattr(preset, "mean", IMAGENET_MEAN)),
                   std=tuple(getattr(preset, "std", IMAGENET_STD)),
                   interpolation=getattr(mode, "value", str(mode or "bilinear")),
                   origin=origin, transform=preset)


def check_side(name: str, value: int | None, where: str | None = None) -> None:
    """Refuse a size (``size``, ``resize``, ``crop``) out of range, in one line; ``where``
    names the file and field it came from (default: the option ``name``)."""
    if value is not None and not MIN_SIZE <= value <= MAX_SIZE:
        raise HookscopeError(f"{where or param(name)} must be between {MIN_SIZE} and {MAX_SIZE} "
                             f"pixels, not {value}.")


def check_values(name: str, values: Sequence[Any], channels: int,
                 where: str | None = None) -> tuple[float, ...]:
    """``mean`` or ``std`` (``name``) as one float per channel (one value: repeated); refuse,
    in one line, a count other than 1 or ``channels``, a value that is no finite number, a
    std of zero. ``where`` names the file and field they came from (default: the option)."""
    label = where or param(name)
    if len(values) not in (1, channels):
        raise HookscopeError(f"{label} has {len(values)} values; give 1 or {channels} (one per "
                             "channel).")
    try:
        found = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise HookscopeError(f"{label} must be numbers, not {list(values)!r}.") from None
    if not all(math.isfinite(v) for v in found):
        raise HookscopeError(f"{label} must be finite numbers, not "
                             f"{','.join(str(v) for v in values)}.")
    if name == "std" and any(v == 0 for v in found):
        raise HookscopeError(f"{label} must not be zero.")
    return found * (channels if len(found) == 1 else 1)


def with_overrides(base: Preprocess, *, size: int | None = None, resize: int | None = None,
                   crop: int | None = None, mean: Sequence[float] | None = None,
                   std: Sequence[float] | None = None,
                   input_channels: int | None = None) -> Preprocess:
    """``base`` with the user's options applied; any option replaces ``base``'s transform.
    ``size`` scales the crop to ``size`` and the resize alike; ``resize`` and ``crop`` set
    either side exactly; ``input_channels`` converts images to 1 or 3 channels. The sides
    are the caller's to check (:func:`check_side`)."""
    channels = input_channels
    if channels is not None and channels not in (1, 3):
        raise HookscopeError(f"{param('input_channels')} must be 1 or 3, not {channels}.")
    changes: dict[str, Any] = {}
    if size is not None:
        side = base.crop or base.resize or 224
        changes["crop"] = size if base.crop is not None or base.resize is None else None
        if base.resize is not None:
            changes["resize"] = round(base.resize * size / side)
    if resize is not None:
        changes["resize"] = resize
    if crop is not None:
        changes["crop"] = crop
    n = channels or base.channels
    for name, values in (("mean", mean), ("std", std)):
        if values is not None:
            changes[name] = check_values(name, values, n)
    if channels is not None and channels != base.channels:
        changes["channels"] = channels
        for name in ("mean", "std"):  # three values do not fit one channel: their average
            if name not in changes:
                values = getattr(base, name)
                changes[name] = (round(sum(values) / len(values), 4),) if channels == 1 else \
                    (values * 3 if len(values) == 1 else values)
    if any(v == 0 for v in changes.get("std", ())):
        raise HookscopeError(f"{param('std')} must not be zero.")
    if not changes:
        return base
    new = replace(base, transform=None, origin="options", **changes)
    if new.crop is not None and new.resize is not None and new.crop > new.resize:
        raise HookscopeError(
            f"The centre crop ({new.crop} px) is larger than the resized image's shorter side "
            f"({new.resize} px), so it would be padded with zeros; give a {param('crop')} no "
            f"larger than {param('resize')}.")
    return new
