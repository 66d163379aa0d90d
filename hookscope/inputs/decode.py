"""One input: what it is (:class:`InputItem`, one sample of an image file, a tensor file's
row or stdin; :class:`InputSet`, a command's inputs in order) and how it is decoded
(:class:`Decoder`, in process or in a DataLoader worker).
"""

from __future__ import annotations

import io
import pickle
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from hookscope.core.errors import HookscopeError, clip
from hookscope.inputs.structure import as_arguments, count, from_named, row, whole

__all__ = ["Decoder", "InputItem", "InputSet", "Sample", "load_image", "lone_sample",
           "open_image", "to_rgb", "unique_stems"]


@dataclass(frozen=True)
class InputItem:
    """One sample: an image, or one entry of a tensor file."""

    name: str  # the path as given; ``x.pt[3]`` for a tensor's row, ``-`` for stdin
    #: "image", "tensor", "stdin", "data" (an item of --data), "none" (no arguments) or
    #: "whole" (a tensor file read --as-is: one forward's arguments)
    kind: str
    path: Path | None = None  # None for stdin
    index: int | None = None  # the row of a tensor file, or the item of a data set
    label: str | None = None  # its class folder in an ImageFolder layout (photos/cat/1.jpg)
    #: The bytes, read once when resolved, of stdin or a file that can be read only once (a
    #: FIFO, ``<(cat x.jpg)``, a device); None for a regular file.
    data: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def source(self) -> Path | bytes:
        """What to read: the bytes already read, else the file."""
        return self.data if self.data is not None else self.path  # type: ignore[return-value]

    @property
    def stem(self) -> str:
        """A file-name stem for outputs derived from this input."""
        if self.kind in ("data", "none"):
            return f"data_{self.index}" if self.kind == "data" else "forward"
        if self.path is None:
            return "stdin"
        return self.path.stem if self.index is None else f"{self.path.stem}_{self.index}"


@dataclass
class InputSet:
    """The resolved inputs of one command, in order (or one rank's contiguous part of them)."""

    items: list[InputItem] = field(default_factory=list)
    offset: int = 0  # the position of items[0] among all inputs
    data: Any = None  # the hookscope.inputs.data.DataSource of its "data" items (--data)

    @property
    def names(self) -> list[str]:
        """One name per sample: the path, ``-`` for stdin, ``x.pt[3]`` for a tensor's row."""
        return [item.name for item in self.items]

    @property
    def stems(self) -> list[str]:
        """One output file stem per sample, unique (see :func:`unique_stems`)."""
        return unique_stems([item.stem for item in self.items])

    @property
    def labels(self) -> list[str] | None:
        """Each sample's class folder when every sample has one (an ImageFolder), or its
        data set item's label (``--data``), else None."""
        if self.data is not None:
            return self.data.labels([item.index for item in self.items])
        labels = [item.label for item in self.items]
        return None if not labels or None in labels else labels  # type: ignore[return-value]

    def part(self, lo: int, hi: int) -> InputSet:
        """Samples ``lo`` to ``hi`` (exclusive), which keep their positions."""
        return InputSet(self.items[lo:hi], self.offset + lo, self.data)

    def __len__(self) -> int:
        return len(self.items)


def unique_stems(stems: Sequence[str]) -> list[str]:
    """Make repeated stems unique, in order: ``cat``, ``cat-2``, ``cat-3``... A made-up name
    never takes a stem given elsewhere: ``['cat', 'cat', 'cat-2']`` gives ``cat-3`` second."""
    given = set(stems)
    used: set[str] = set()
    out: list[str] = []
    for stem in stems:
        unique, n = stem, 1
        while unique in used or (unique != stem and unique in given):
            n += 1
            unique = f"{stem}-{n}"
        used.add(unique)
        out.append(unique)
    return out


#: One decoded sample: where it came from, its preprocessed tensor (or tuple or dict of
#: tensors) and, when kept, its image.
Sample = tuple[InputItem, Any, "Image.Image | None"]


def _decode_error(name: str, exc: BaseException) -> HookscopeError:
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return HookscopeError(
            f"{name}: image is over Pillow's decompression-bomb limit "
            f"({Image.MAX_IMAGE_PIXELS} pixels); refusing to decode it. Downscale it first.")
    if isinstance(exc, UnidentifiedImageError):
        return HookscopeError(
            f"{name}: not an image Pillow can read (inputs are images, directories, '-', "
            "or .pt/.npy tensors).")
    if isinstance(exc, FileNotFoundError):
        return HookscopeError(f"{name}: no such file.")
    return HookscopeError(f"{name}: corrupt or truncated image ({exc}).")


def open_image(src: Path | bytes, name: str, *, load: bool) -> Image.Image:
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(src) if isinstance(src, bytes) else src)
            if load:
                img.load()
            return img
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning,
                Image.DecompressionBombError) as exc:
            raise _decode_error(name, exc) from None


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert any Pillow image to 8-bit RGB: 16-bit and float scaled, alpha over white."""
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        arr = np.asarray(img, dtype=np.float64)
        peak = float(arr.max()) if arr.size else 0.0
        if img.mode == "F" and peak <= 1.0:
            arr = arr * 255.0
        elif peak > 255.0:
            arr = arr / 257.0
        img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), mode="L")
    has_alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info
    if has_alpha:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def load_image(src: Path | bytes, name: str) -> Image.Image:
    """Decode an image fully, apply EXIF orientation, convert to RGB; a HookscopeError when
    it is missing, not an image, corrupt, or a decompression bomb."""
    img = open_image(src, name, load=True)
    try:
        img = ImageOps.exif_transpose(img) or img
    except (OSError, ValueError, SyntaxError) as exc:
        raise _decode_error(name, exc) from None
    return to_rgb(img)


def lone_sample(path: Path, name: str, ndim: int, data: bytes | None = None, *,
                as_is: bool = False) -> tuple[Any, bool]:
    """The batch in a ``.pt``, ``.safetensors`` or ``.npy`` file (or in ``data``, its bytes
    already read), checked by :func:`~hookscope.inputs.structure.as_arguments`, and whether
    it is one sample made a batch: a lone floating-point tensor of ``ndim`` - 1 dimensions (a
    (C,H,W) image for an image model). ``as_is``: its content is one forward's arguments, as
    they are. A file is mapped, not read whole: a ``.npy`` copy-on-write, a zip-format ``.pt``.
    """
    obj = as_arguments(_load(path, name, data), name, whole=as_is)
    if as_is:
        return obj, True
    if isinstance(obj, torch.Tensor) and obj.is_floating_point() and obj.dim() == ndim - 1:
        return obj.unsqueeze(0), True
    return obj, False


def _load(path: Path, name: str, data: bytes | None) -> Any:
    src = io.BytesIO(data) if data is not None else path
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            arr = np.load(src, mmap_mode="c" if data is None else None, allow_pickle=False)
            if arr.dtype.kind not in "biuf":
                raise HookscopeError(f"{name}: holds a {arr.dtype} array; a numeric or bool "
                                     "array is expected.")
            return torch.from_numpy(np.asarray(arr))
        if suffix == ".safetensors":
            from safetensors.torch import load, load_file

            return from_named(load(data) if data is not None else load_file(str(path)))
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr
            warnings.simplefilter("ignore")
            return torch.load(src, map_location="cpu", weights_only=True,
                              mmap=data is None and zipfile.is_zipfile(path))
    except HookscopeError:
        raise
    except pickle.UnpicklingError:  # objects whose code would run, not only tensors
        raise HookscopeError(
            f"{name}: holds Python objects besides tensors, which hookscope does not unpickle; "
            "save a tensor, a tuple or a dict of tensors with torch.save(x, path).") from None
    except Exception as exc:  # torch.load, np.load and safetensors raise many types
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise HookscopeError(
            f"{name}: not a readable tensor file ({exc.__class__.__name__}: {clip(first, 120)}).") from None


class Decoder:
    """Decodes and preprocesses one sample at a time (in the main process or a DataLoader
    worker); the last tensor file read stays open for its next rows. ``ndim``: the model's
    input rank (5 for video clips); ``keep_images``: also return each decoded image."""

    def __init__(self, preprocess: Callable[[Any], torch.Tensor], *, ndim: int = 4,
                 keep_images: bool = False, data: Any = None) -> None:
        self.preprocess, self.ndim, self.keep_images = preprocess, ndim, keep_images
        self.data = data  # the hookscope.inputs.data.DataSource of "data" items
        self._file: tuple[Path, Any] | None = None

    def __call__(self, item: InputItem) -> tuple[Any, Image.Image | None]:
        """The preprocessed sample and, when kept, its image; a HookscopeError when the file is
        missing, corrupt, or not what it was when resolved."""
        if item.kind == "tensor":
            return self._row(item), None
        if item.kind == "whole":
            assert item.path is not None  # a tensor file
            return whole(lone_sample(item.path, item.name, self.ndim, item.data, as_is=True)[0],
                         item.name), None
        if item.kind == "data":
            return self.data.sample(item, self.preprocess, self.keep_images)
        if item.kind == "none":
            return (), None
        img = load_image(item.source, item.name)
        return self.preprocess(img), img if self.keep_images else None

    def _row(self, item: InputItem) -> Any:
        assert item.path is not None  # tensor items always have a file
        file = item.name if item.index is None else item.name.rpartition("[")[0]
        if self._file is None or self._file[0] != item.path:
            self._file = None  # let the previous file's mapping go first
            self._file = (item.path, lone_sample(item.path, file, self.ndim, item.data)[0])
        batch = self._file[1]
        if (item.index or 0) >= count(batch):
            raise HookscopeError(f"{item.name}: the file has only {count(batch)} rows now.")
        return row(batch, item.index or 0, file)
