"""Input discovery, decoding and batching: image files, directories, ``-`` (stdin) and
``.pt``/``.npy`` preprocessed tensors stream through in batches, so only one batch (plus one
being prefetched) is in memory.
"""

from __future__ import annotations

import io
import logging
import pickle
import random
import stat
import sys
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import groupby, islice
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from hookscope.core.errors import HookscopeError, clip, param

log = logging.getLogger("hookscope")

TENSOR_SUFFIXES = {".pt", ".npy"}
STDIN = "-"


@dataclass(frozen=True)
class InputItem:
    """One sample: an image, or one entry of a tensor file."""

    name: str  # the path as given; ``x.pt[3]`` for a tensor's row, ``-`` for stdin
    kind: str  # "image", "tensor" or "stdin"
    path: Path | None = None  # None for stdin
    index: int | None = None  # the row of a tensor file with a leading N dimension
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
        if self.path is None:
            return "stdin"
        return self.path.stem if self.index is None else f"{self.path.stem}_{self.index}"


@dataclass
class InputSet:
    """The resolved inputs of one command, in order (or one rank's contiguous part of them)."""

    items: list[InputItem] = field(default_factory=list)
    offset: int = 0  # the position of items[0] among all inputs

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
        """Each sample's class folder when every sample has one (an ImageFolder), else None."""
        labels = [item.label for item in self.items]
        return None if not labels or None in labels else labels  # type: ignore[return-value]

    def part(self, lo: int, hi: int) -> InputSet:
        """Samples ``lo`` to ``hi`` (exclusive), which keep their positions."""
        return InputSet(self.items[lo:hi], self.offset + lo)

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class Batch:
    """A preprocessed batch and where each of its samples came from."""

    items: list[InputItem]
    tensor: torch.Tensor  # the stacked, preprocessed samples
    images: list[Image.Image | None]  # the decoded images when kept (else None each)
    start: int  # the position of its first sample among all inputs
    number: int | None = None  # its position among all batches (None: counted by the driver)

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


# ---------------------------------------------------------------------------- decoding


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


def _open(src: Path | bytes, name: str, *, load: bool) -> Image.Image:
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
    img = _open(src, name, load=True)
    try:
        img = ImageOps.exif_transpose(img) or img
    except (OSError, ValueError, SyntaxError) as exc:
        raise _decode_error(name, exc) from None
    return to_rgb(img)


def _read_tensor(path: Path, name: str, ndim: int, data: bytes | None = None) -> torch.Tensor:
    """The float tensor of ``ndim`` - 1 or ``ndim`` dimensions in ``path`` (or in ``data``, its
    bytes already read). A file is mapped, not read whole: a ``.npy`` copy-on-write, a ``.pt``
    in the zip format (not the legacy one)."""
    src = io.BytesIO(data) if data is not None else path
    try:
        if path.suffix.lower() == ".npy":
            arr = np.load(src, mmap_mode="c" if data is None else None, allow_pickle=False)
            if not np.issubdtype(arr.dtype, np.floating):
                raise HookscopeError(
                    f"{name}: holds a {arr.dtype} array; a preprocessed float tensor is expected.")
            obj = torch.from_numpy(np.asarray(arr))
        else:
            with warnings.catch_warnings():  # torch warns about pickle protocols on stderr
                warnings.simplefilter("ignore")
                obj = torch.load(src, map_location="cpu", weights_only=True,
                                 mmap=data is None and zipfile.is_zipfile(path))
    except HookscopeError:
        raise
    except pickle.UnpicklingError:  # objects whose code would run, not only tensors
        raise HookscopeError(
            f"{name}: holds Python objects besides tensors, which hookscope does not unpickle; "
            "save one preprocessed float tensor with torch.save(tensor, path).") from None
    except Exception as exc:  # torch.load and np.load raise many types for bad files
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise HookscopeError(
            f"{name}: not a readable tensor file ({exc.__class__.__name__}: {clip(first, 120)}).") from None
    if not isinstance(obj, torch.Tensor):
        raise HookscopeError(
            f"{name}: holds a {type(obj).__name__}, not a tensor; save one preprocessed float "
            "tensor with torch.save(tensor, path).")
    if not obj.is_floating_point():
        raise HookscopeError(f"{name}: tensor dtype is {obj.dtype}; a preprocessed float tensor is expected.")
    layout = "(C,T,H,W) or (N,C,T,H,W)" if ndim == 5 else "(C,H,W) or (N,C,H,W)"
    if obj.dim() not in (ndim - 1, ndim) or 0 in obj.shape:
        raise HookscopeError(f"{name}: tensor shape is {list(obj.shape)}; expected {layout}.")
    return obj


class Decoder:
    """Decodes and preprocesses one sample at a time (in the main process or a DataLoader
    worker); the last tensor file read stays open for its next rows. ``ndim``: the model's
    input rank (5 for video clips); ``keep_images``: also return each decoded image."""

    def __init__(self, preprocess: Callable[[Any], torch.Tensor], *, ndim: int = 4,
                 keep_images: bool = False) -> None:
        self.preprocess, self.ndim, self.keep_images = preprocess, ndim, keep_images
        self._file: tuple[Path, torch.Tensor] | None = None

    def __call__(self, item: InputItem) -> tuple[torch.Tensor, Image.Image | None]:
        """The preprocessed sample and, when kept, its image; a HookscopeError when the file is
        missing, corrupt, or not what it was when resolved."""
        if item.kind == "tensor":
            return self._row(item), None
        img = load_image(item.source, item.name)
        return self.preprocess(img), img if self.keep_images else None

    def _row(self, item: InputItem) -> torch.Tensor:
        assert item.path is not None  # tensor items always have a file
        file = item.name if item.index is None else item.name.rpartition("[")[0]
        if self._file is None or self._file[0] != item.path:
            self._file = None  # let the previous file's mapping go first
            tensor = _read_tensor(item.path, file, self.ndim, item.data)
            self._file = (item.path, tensor if tensor.dim() == self.ndim else tensor.unsqueeze(0))
        rows = self._file[1]
        if (item.index or 0) >= rows.shape[0]:
            raise HookscopeError(f"{item.name}: the file has only {rows.shape[0]} rows now.")
        return rows[item.index or 0].to(torch.float32).clone()


# ---------------------------------------------------------------------------- resolving


def resolve_inputs(specs: Sequence[str], *, stdin: IO[bytes] | None = None, ndim: int = 4,
                   recursive: bool = False, limit: int | None = None, shuffle: bool = False,
                   seed: int = 0) -> InputSet:
    """Expand files, directories, ``-`` (one image on ``stdin``) and ``.pt``/``.npy`` tensor
    files; shuffle (by ``seed``), then keep ``limit`` of them; read each one's header, so a
    non-image fails before the model loads. ``recursive`` walks directories' whole trees. A
    directory whose images all sit in subdirectories is an ImageFolder layout: each image's
    ``label`` is its subdirectory's name.
    """
    if not specs:
        raise HookscopeError("No inputs given; pass image files, directories, '-' or .pt/.npy.")
    if limit is not None and limit < 1:
        raise HookscopeError(f"{param('limit')} must be at least 1, not {limit}.")
    items: list[InputItem] = []
    for spec in specs:
        if spec == STDIN:
            if any(item.kind == "stdin" for item in items):
                raise HookscopeError("'-' (stdin) can be given only once.")
            items.append(InputItem("-", "stdin", data=_read_stdin(stdin)))
            continue
        path = Path(spec).expanduser()
        if path.is_dir():
            items.extend(_expand_dir(path, spec, recursive))
        elif not path.exists():
            raise HookscopeError(f"{spec}: no such file or directory.")
        else:
            items.extend(_file_items(path, spec, ndim))
    if shuffle:
        random.Random(seed).shuffle(items)
    items = items[:limit] if limit is not None else items
    images = [item for item in items if item.kind == "image"]
    if images and ndim == 5:
        raise HookscopeError(f"{images[0].name}: video models take clips; pass a .pt/.npy tensor of "
                             "shape (C,T,H,W) or (N,C,T,H,W).")
    for item in images:
        _open(item.source, item.name, load=False).close()
    return InputSet(items)


def _read_stdin(stdin: IO[bytes] | None) -> bytes:
    stream = stdin if stdin is not None else sys.stdin.buffer
    data = stream.read()
    if not data:
        raise HookscopeError("'-': stdin is empty; pipe one image into it.")
    _open(data, "<stdin>", load=False)
    return data


def read_once(path: Path, name: str) -> bytes | None:
    """The bytes of a file that cannot be read twice (a FIFO, ``<(...)``, a device), read
    now; None for a regular file, which is read when its batch comes."""
    try:
        if stat.S_ISREG(path.stat().st_mode):
            return None
        return path.read_bytes()
    except OSError as exc:
        raise HookscopeError(f"{name}: cannot be read ({exc.strerror or exc}).") from None


def _file_items(path: Path, name: str, ndim: int) -> list[InputItem]:
    """A tensor file's rows (read and checked now), or one image (checked later)."""
    data = read_once(path, name)
    if path.suffix.lower() not in TENSOR_SUFFIXES:
        return [InputItem(name, "image", path, data=data)]
    t = _read_tensor(path, name, ndim, data)
    if t.dim() != ndim:
        return [InputItem(name, "tensor", path, data=data)]
    return [InputItem(f"{name}[{i}]", "tensor", path, i, data=data) for i in range(t.shape[0])]


def _images_in(folder: Path, recursive: bool) -> tuple[list[Path], list[str]]:
    """The images in ``folder`` (with ``recursive``, in its whole tree), sorted by their
    path's parts, and the names of the other files, which are skipped."""
    known = {ext.lower() for ext in Image.registered_extensions()}  # what Pillow can open
    images: list[Path] = []
    skipped: list[str] = []
    for entry in sorted(folder.rglob("*") if recursive else folder.iterdir(),
                        key=lambda p: p.relative_to(folder).parts):
        if entry.is_dir():
            continue
        if entry.suffix.lower() in known and entry.is_file():
            images.append(entry)
        else:
            skipped.append(str(entry.relative_to(folder)))
    return images, sorted(skipped)


def _expand_dir(path: Path, spec: str, recursive: bool) -> list[InputItem]:
    """A directory's images: its own (its tree's, with ``recursive``), or, when it holds
    none itself, those of its subdirectories labelled with their names (ImageFolder)."""
    images, skipped = _images_in(path, recursive=False)
    if images:
        if recursive:
            images, skipped = _images_in(path, recursive=True)
        _note_skipped(spec, skipped)
        subdirs = [] if recursive else sorted(p.name for p in path.iterdir() if p.is_dir())
        if subdirs:
            one = len(subdirs) == 1
            log.info("%s: %d %s (%s); --recursive includes %s", spec, len(subdirs),
                     "subdirectory not walked" if one else "subdirectories not walked",
                     _few(subdirs), "it" if one else "them")
        return [InputItem(str(p), "image", p) for p in images]
    items: list[InputItem] = []
    classes: list[str] = []
    for sub in sorted(p for p in path.iterdir() if p.is_dir()):
        found, other = _images_in(sub, recursive)
        skipped += [f"{sub.name}/{name}" for name in other]
        if found:
            classes.append(sub.name)
            items += [InputItem(str(p), "image", p, label=sub.name) for p in found]
    if not items:
        hint = "" if recursive or not any(p.is_dir() for p in path.iterdir()) else \
            f" (to walk its subdirectories, pass {param('recursive')})"
        raise HookscopeError(f"{spec}: the directory holds no images{hint}.")
    log.info("%s: an ImageFolder layout: %d images in %d class folders (%s)", spec, len(items),
             len(classes), _few(classes))
    _note_skipped(spec, skipped)
    return items


def _few(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def _note_skipped(spec: str, skipped: list[str]) -> None:
    if skipped:
        one = len(skipped) == 1
        log.info("%s: skipped %d %s: %s", spec, len(skipped),
                 "file that is not an image" if one else "files that are not images",
                 _few(skipped))


# ---------------------------------------------------------------------------- batching

Sample = tuple[InputItem, torch.Tensor, "Image.Image | None"]


def _group(samples: Iterable[Sample], batch_size: int, offset: int = 0) -> Iterator[Batch]:
    """Stack samples into batches of ``batch_size``; a sample whose shape differs from the
    batch's starts a new one. ``offset``: the position of the first sample among all."""
    start, number = offset, offset // batch_size
    for _, run in groupby(samples, key=lambda sample: sample[1].shape):
        while chunk := list(islice(run, batch_size)):
            items, tensors, images = zip(*chunk, strict=True)
            yield Batch(list(items), torch.stack(tensors), list(images), start, number)
            start, number = start + len(chunk), number + 1


def iter_batches(inputs: InputSet, preprocess: Callable[[Any], torch.Tensor], *, batch_size: int = 8,
                 keep_images: bool = False, ndim: int = 4, workers: int = 0) -> Iterator[Batch]:
    """Decode and preprocess inputs into batches, in input order: with ``workers`` 0 in this
    process (one batch ahead in a thread), else in that many DataLoader
    worker processes. Samples whose preprocessed shapes differ go into separate batches; a
    sample that cannot be decoded raises when its batch is reached.
    """
    if batch_size < 1:
        raise HookscopeError(f"{param('batch_size')} must be at least 1, not {batch_size}.")
    if workers < 0:
        raise HookscopeError(f"{param('workers')} must be 0 or more, not {workers}.")
    decoder = Decoder(preprocess, ndim=ndim, keep_images=keep_images)
    if workers > 0 and inputs.items:
        from hookscope.inputs.dataset import loader_samples

        return _group(loader_samples(inputs.items, decoder, batch_size, workers), batch_size, inputs.offset)
    return _prefetched(_group(((item, *decoder(item)) for item in inputs.items), batch_size, inputs.offset))


def _prefetched(gen: Iterator[Batch]) -> Iterator[Batch]:
    """Run ``gen`` one batch ahead in a background thread; errors re-raise in the consumer."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="hookscope-decode")
    try:
        ahead = pool.submit(next, gen, None)
        while (batch := ahead.result()) is not None:
            ahead = pool.submit(next, gen, None)
            yield batch
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
