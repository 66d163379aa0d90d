"""Input discovery and batching: image files, directories, ``-`` (stdin) and ``.pt``/``.npy``
preprocessed tensors stream through in batches, so only one batch (plus one being prefetched)
is in memory.
"""

from __future__ import annotations

import logging
import random
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import groupby, islice
from pathlib import Path
from typing import IO, Any

import torch
from PIL import Image

from hookscope.core.errors import HookscopeError, at_least_one, param
from hookscope.core.run import Batch
from hookscope.inputs.data import DataSource
from hookscope.inputs.dataset import loader_samples
from hookscope.inputs.decode import (
    Decoder,
    InputItem,
    InputSet,
    Sample,
    lone_sample,
    open_image,
    unique_stems,
)
from hookscope.inputs.structure import count, signature, stack

__all__ = ["NOTHING", "STDIN", "Batch", "InputItem", "InputSet", "iter_batches", "read_once",
           "resolve_inputs", "unique_stems"]

log = logging.getLogger("hookscope")

TENSOR_SUFFIXES = {".pt", ".npy", ".safetensors"}
STDIN = "-"
#: The one input of a forward that takes no arguments (``forward(self)``).
NOTHING = InputItem("forward()", "none")
NO_INPUTS = ("No inputs given; pass image files, directories, '-', .pt/.safetensors/.npy tensor "
             f"files, or {param('data')}.")


def resolve_inputs(specs: Sequence[str], *, stdin: IO[bytes] | None = None, ndim: int = 4,
                   recursive: bool = False, limit: int | None = None, shuffle: bool = False,
                   seed: int = 0, data: DataSource | None = None, nothing: bool = False,
                   as_is: bool = False) -> InputSet:
    """Expand files, directories, ``-`` (one image on ``stdin``) and ``.pt``/``.npy`` tensor
    files; shuffle (by ``seed``), then keep ``limit`` of them; read each one's header, so a
    non-image fails before the model loads. ``recursive`` walks directories' whole trees. A
    directory whose images all sit in subdirectories is an ImageFolder layout: each image's
    ``label`` is its subdirectory's name. ``data``: a data set's items instead (``--data``).
    ``nothing``: no inputs are one call of no arguments (:data:`NOTHING`), for a model whose
    forward takes none (the caller checks it). ``as_is``: each tensor file is one forward's
    arguments, not sliced into samples.
    """
    if not specs and data is None:
        if nothing:
            return InputSet([NOTHING])
        raise HookscopeError(NO_INPUTS)
    at_least_one("limit", limit)
    items: list[InputItem] = data.items() if data is not None else []
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
            items.extend(_file_items(path, spec, ndim, as_is))
    if shuffle:
        random.Random(seed).shuffle(items)
    items = items[:limit] if limit is not None else items
    images = [item for item in items if item.kind == "image"]
    if images and ndim == 5:
        raise HookscopeError(f"{images[0].name}: video models take clips; pass a .pt/.npy tensor of "
                             "shape (C,T,H,W) or (N,C,T,H,W).")
    for item in images:
        open_image(item.source, item.name, load=False).close()
    return InputSet(items, data=data)


def _read_stdin(stdin: IO[bytes] | None) -> bytes:
    stream = stdin if stdin is not None else sys.stdin.buffer
    data = stream.read()
    if not data:
        raise HookscopeError("'-': stdin is empty; pipe one image into it.")
    open_image(data, "<stdin>", load=False)
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


def _file_items(path: Path, name: str, ndim: int, as_is: bool) -> list[InputItem]:
    """A tensor file's rows (read and checked now), or one image (checked later)."""
    data = read_once(path, name)
    if path.suffix.lower() not in TENSOR_SUFFIXES:
        return [InputItem(name, "image", path, data=data)]
    batch, lone = lone_sample(path, name, ndim, data, as_is=as_is)
    if lone:
        return [InputItem(name, "whole" if as_is else "tensor", path, data=data)]
    return [InputItem(f"{name}[{i}]", "tensor", path, i, data=data) for i in range(count(batch))]


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


def _group(samples: Iterable[Sample], batch_size: int, offset: int = 0) -> Iterator[Batch]:
    """Stack samples into batches of ``batch_size``; a sample whose shapes (or structure)
    differ from the batch's starts a new one. ``offset``: the position of the first sample
    among all."""
    start, number = offset, offset // batch_size
    for _, run in groupby(samples, key=lambda sample: signature(sample[1])):
        while chunk := list(islice(run, batch_size)):
            items, tensors, images = zip(*chunk, strict=True)
            yield Batch(list(items), stack(tensors), list(images), start, number)
            start, number = start + len(chunk), number + 1


def iter_batches(inputs: InputSet, preprocess: Callable[[Any], torch.Tensor], *, batch_size: int = 8,
                 keep_images: bool = False, ndim: int = 4, workers: int = 0) -> Iterator[Batch]:
    """Decode and preprocess inputs into batches, in input order: with ``workers`` 0 in this
    process (one batch ahead in a thread), else in that many DataLoader
    worker processes. Samples whose preprocessed shapes differ go into separate batches; a
    sample that cannot be decoded raises when its batch is reached.
    """
    at_least_one("batch_size", batch_size)
    if workers < 0:
        raise HookscopeError(f"{param('workers')} must be 0 or more, not {workers}.")
    decoder = Decoder(preprocess, ndim=ndim, keep_images=keep_images, data=inputs.data)
    if workers > 0 and inputs.items:
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
