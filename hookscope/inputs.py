"""Input discovery, decoding and batching.

Inputs are image files (anything Pillow reads), directories of images, ``-`` for one image
on stdin, and ``.pt``/``.npy`` files holding an already-preprocessed float tensor. They
stream through in batches: only one batch (plus one being prefetched) is in memory.
"""

from __future__ import annotations

import io
import logging
import queue
import threading
import warnings
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from hookscope.errors import HookscopeError, param

log = logging.getLogger("hookscope")

TENSOR_SUFFIXES = {".pt", ".npy"}
STDIN = "-"


def image_suffixes() -> set[str]:
    """File suffixes Pillow can open (used to pick images out of a directory)."""
    return {ext.lower() for ext in Image.registered_extensions()}


@dataclass(frozen=True)
class InputItem:
    """One sample: an image, or one entry of a tensor file."""

    name: str
    kind: str  # "image", "tensor" or "stdin"
    path: Path | None = None
    index: int | None = None

    @property
    def stem(self) -> str:
        """A file-name stem for outputs derived from this input."""
        if self.path is None:
            return "stdin"
        return self.path.stem if self.index is None else f"{self.path.stem}_{self.index}"


@dataclass
class Source:
    """One input file (or stdin) after directory expansion."""

    name: str
    kind: str
    path: Path | None = None
    data: bytes | None = None
    count: int = 1
    batched: bool = False  # a tensor file with a leading N dimension

    def items(self) -> list[InputItem]:
        if not self.batched:
            return [InputItem(self.name, self.kind, self.path)]
        return [
            InputItem(f"{self.name}[{i}]", self.kind, self.path, i) for i in range(self.count)
        ]


@dataclass
class InputSet:
    """The resolved inputs of one command, in order."""

    sources: list[Source] = field(default_factory=list)

    @property
    def items(self) -> list[InputItem]:
        return [item for s in self.sources for item in s.items()]

    @property
    def names(self) -> list[str]:
        """One name per sample: the path, ``-`` for stdin, ``x.pt[3]`` for a tensor's row."""
        return [item.name for item in self.items]

    @property
    def stems(self) -> list[str]:
        """One output file stem per sample, unique (see :func:`unique_stems`)."""
        return unique_stems([item.stem for item in self.items])

    def __len__(self) -> int:
        return sum(s.count for s in self.sources)


@dataclass
class Batch:
    """A preprocessed batch and where each of its samples came from."""

    items: list[InputItem]
    tensor: torch.Tensor
    images: list[Image.Image | None]
    start: int

    def __len__(self) -> int:
        return len(self.items)


def unique_stems(stems: Sequence[str]) -> list[str]:
    """Make repeated stems unique, in order: ``cat``, ``cat-2``, ``cat-3``...

    A made-up name never takes a stem that appears elsewhere in the list, so
    ``['cat', 'cat', 'cat-2']`` becomes ``['cat', 'cat-3', 'cat-2']`` and no output file is
    written twice.
    """
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
            f"({Image.MAX_IMAGE_PIXELS} pixels); refusing to decode it. Downscale it first."
        )
    if isinstance(exc, UnidentifiedImageError):
        return HookscopeError(
            f"{name}: not an image Pillow can read (inputs are images, directories, '-', "
            "or .pt/.npy tensors)."
        )
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
    """Decode an image fully, apply EXIF orientation, convert to RGB.

    Raises:
        HookscopeError: missing, not an image, corrupt or truncated, or a decompression bomb.
    """
    img = _open(src, name, load=True)
    try:
        img = ImageOps.exif_transpose(img) or img
    except (OSError, ValueError, SyntaxError) as exc:
        raise _decode_error(name, exc) from None
    return to_rgb(img)


def _read_tensor(path: Path, name: str) -> torch.Tensor:
    try:
        if path.suffix.lower() == ".npy":
            arr = np.load(path, mmap_mode="c", allow_pickle=False)  # copy-on-write: lazy, writable
            if not np.issubdtype(arr.dtype, np.floating):
                raise HookscopeError(
                    f"{name}: holds a {arr.dtype} array; a preprocessed float tensor is expected."
                )
            return torch.from_numpy(np.asarray(arr))
        obj = _load_pt(path)
    except HookscopeError:
        raise
    except Exception as exc:  # torch.load and np.load raise many types for bad files
        raise HookscopeError(
            f"{name}: not a readable tensor file ({exc.__class__.__name__}: "
            f"{str(exc).splitlines()[0][:120] if str(exc) else ''})."
        ) from None
    if not isinstance(obj, torch.Tensor):
        raise HookscopeError(
            f"{name}: holds a {type(obj).__name__}, not a tensor; save one preprocessed float "
            "tensor with torch.save(tensor, path)."
        )
    return obj


def _load_pt(path: Path) -> Any:
    """A ``.pt`` file, memory-mapped when it is in the zip format (``torch.save``'s default
    since 1.6), read whole when it is in the legacy format, which cannot be mapped."""
    with warnings.catch_warnings():  # torch warns about pickle protocols on stderr
        warnings.simplefilter("ignore")
        if zipfile.is_zipfile(path):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return torch.load(path, map_location="cpu", weights_only=True)


def _check_tensor(t: torch.Tensor, name: str, ndim: int) -> torch.Tensor:
    if not t.is_floating_point():
        raise HookscopeError(
            f"{name}: tensor dtype is {t.dtype}; a preprocessed float tensor is expected."
        )
    layout = "(C,T,H,W) or (N,C,T,H,W)" if ndim == 5 else "(C,H,W) or (N,C,H,W)"
    if t.dim() not in (ndim - 1, ndim) or 0 in t.shape:
        raise HookscopeError(
            f"{name}: tensor shape is {list(t.shape)}; expected {layout}."
        )
    return t


# ---------------------------------------------------------------------------- resolving


def resolve_inputs(
    specs: Sequence[str], *, stdin: IO[bytes] | None = None, ndim: int = 4
) -> InputSet:
    """Expand files, directories, ``-`` and tensor files; check each one cheaply.

    Headers are read here (so a non-image fails before the model loads); pixels are
    decoded later, batch by batch.

    Raises:
        HookscopeError: no inputs, missing files, empty directories, unreadable files.
    """
    if not specs:
        raise HookscopeError("No inputs given; pass image files, directories, '-' or .pt/.npy.")
    sources: list[Source] = []
    for spec in specs:
        if spec == STDIN:
            if any(s.kind == "stdin" for s in sources):
                raise HookscopeError("'-' (stdin) can be given only once.")
            stream = stdin if stdin is not None else __import__("sys").stdin.buffer
            data = stream.read()
            if not data:
                raise HookscopeError("'-': stdin is empty; pipe one image into it.")
            _open(data, "<stdin>", load=False)
            sources.append(Source("-", "stdin", None, data))
            continue
        path = Path(spec).expanduser()
        if path.is_dir():
            sources.extend(_expand_dir(path, spec, ndim))
        elif not path.exists():
            raise HookscopeError(f"{spec}: no such file or directory.")
        else:
            sources.append(_source_for_file(path, spec, ndim))
    return InputSet(sources)


def _source_for_file(path: Path, name: str, ndim: int) -> Source:
    if path.suffix.lower() in TENSOR_SUFFIXES:
        t = _check_tensor(_read_tensor(path, name), name, ndim)
        batched = t.dim() == ndim
        return Source(name, "tensor", path, count=t.shape[0] if batched else 1, batched=batched)
    if ndim == 5:
        raise HookscopeError(
            f"{name}: video models take clips; pass a .pt/.npy tensor of shape (C,T,H,W) "
            "or (N,C,T,H,W)."
        )
    _open(path, name, load=False).close()
    return Source(name, "image", path)


def _expand_dir(path: Path, spec: str, ndim: int) -> list[Source]:
    known = image_suffixes()
    images: list[Source] = []
    skipped: list[str] = []
    for entry in sorted(path.iterdir()):
        if entry.is_file() and entry.suffix.lower() in known:
            images.append(_source_for_file(entry, str(entry), ndim))
        else:
            skipped.append(entry.name)
    if skipped:
        shown = ", ".join(skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        log.info("%s: skipped %d entr%s that are not images: %s", spec, len(skipped),
                 "y" if len(skipped) == 1 else "ies", shown)
    if not images:
        raise HookscopeError(f"{spec}: the directory holds no images.")
    return images


# ---------------------------------------------------------------------------- batching


def _samples(
    inputs: InputSet, preprocess: Callable[[Any], torch.Tensor], keep_images: bool, ndim: int
) -> Iterator[tuple[InputItem, torch.Tensor, Image.Image | None]]:
    for src in inputs.sources:
        if src.kind == "tensor":
            assert src.path is not None
            t = _check_tensor(_read_tensor(src.path, src.name), src.name, ndim)
            items = src.items()
            rows = t if t.dim() == ndim else t.unsqueeze(0)
            for item, row in zip(items, rows, strict=True):
                yield item, row.to(torch.float32).clone(), None
        else:
            img = load_image(src.data if src.kind == "stdin" else src.path, src.name)  # type: ignore[arg-type]
            tensor = preprocess(img)
            yield src.items()[0], tensor, img if keep_images else None


def _batches(
    inputs: InputSet,
    preprocess: Callable[[Any], torch.Tensor],
    batch_size: int,
    keep_images: bool,
    ndim: int,
) -> Iterator[Batch]:
    pending: list[tuple[InputItem, torch.Tensor, Image.Image | None]] = []
    start = 0

    def flush() -> Batch:
        nonlocal start
        batch = Batch(
            items=[p[0] for p in pending],
            tensor=torch.stack([p[1] for p in pending]),
            images=[p[2] for p in pending],
            start=start,
        )
        start += len(pending)
        pending.clear()
        return batch

    for sample in _samples(inputs, preprocess, keep_images, ndim):
        if pending and sample[1].shape != pending[0][1].shape:
            yield flush()
        pending.append(sample)
        if len(pending) >= batch_size:
            yield flush()
    if pending:
        yield flush()


def iter_batches(
    inputs: InputSet,
    preprocess: Callable[[Any], torch.Tensor],
    *,
    batch_size: int = 8,
    keep_images: bool = False,
    ndim: int = 4,
    prefetch: bool = True,
) -> Iterator[Batch]:
    """Decode and preprocess inputs into batches, one batch ahead in a background thread.

    Samples whose preprocessed shapes differ go into separate batches.
    """
    if batch_size < 1:
        raise HookscopeError(f"{param('batch_size')} must be at least 1, not {batch_size}.")
    gen = _batches(inputs, preprocess, batch_size, keep_images, ndim)
    return _prefetched(gen) if prefetch else gen


_DONE = object()


def _prefetched(gen: Iterator[Batch], depth: int = 1) -> Iterator[Batch]:
    """Run ``gen`` one step ahead in a daemon thread; errors re-raise in the consumer."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for batch in gen:
                if not put(batch):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer
            put(exc)

    thread = threading.Thread(target=work, name="hookscope-decode", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
