"""Decoding in ``torch.utils.data.DataLoader`` worker processes, in input order.

The resolved inputs are a map-style :class:`InputDataset`; each worker decodes and
preprocesses a run of ``batch_size`` consecutive samples (the DataLoader's default
sequential sampler keeps the order), and the main process stacks them into the very
batches :func:`hookscope.inputs.iter_batches` makes in process, shape changes included.

A sample that cannot be decoded is not raised in the worker, where the DataLoader would
wrap it in a multi-line message: the worker hands back the :class:`HookscopeError`
itself, which is raised in the main process when its position is reached, as the same
one line the in-process path gives.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Dataset

from hookscope.errors import HookscopeError

if TYPE_CHECKING:  # inputs imports this module; it needs their types only
    from hookscope.inputs import Decoder, InputItem, InputSet, Sample

__all__ = ["InputDataset", "default_workers", "loader_samples"]

#: The most worker processes chosen by default: decoding seldom keeps more busy.
MAX_DEFAULT_WORKERS = 4


def default_workers(inputs: InputSet, batch_size: int, processes: int = 1) -> int:
    """The ``workers`` used when none are given.

    0 (decode in this process, one batch ahead in a thread) for stdin, tensor files and
    fewer than two batches of images, where starting processes costs more than it saves;
    otherwise one CPU fewer than this process's share of the CPUs (``processes`` run on
    this machine), at most :data:`MAX_DEFAULT_WORKERS`, when that is at least 2. One worker
    does what the prefetching thread does (measured on 2 CPUs: 1.00x its images/s), at the
    cost of a process.
    """
    images = sum(1 for item in inputs.items if item.kind == "image")
    if inputs.stdin is not None or images < 2 * batch_size:
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = min(MAX_DEFAULT_WORKERS, (cpus or 1) // max(processes, 1) - 1)
    return workers if workers >= 2 else 0


class InputDataset(Dataset[tuple[int, Any, Any, HookscopeError | None]]):
    """The samples as a map-style dataset: ``dataset[i]`` is ``(i, tensor, image, error)``,
    with ``error`` the sample's decoding error (and no tensor) instead of a raise."""

    def __init__(self, items: Sequence[InputItem], decoder: Decoder) -> None:
        self.items, self.decoder = list(items), decoder

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[int, Any, Any, HookscopeError | None]:
        try:
            tensor, image = self.decoder(self.items[i])
        except HookscopeError as exc:
            return i, None, None, exc
        return i, tensor, image, None


def _as_list(samples: list[Any]) -> list[Any]:
    """The DataLoader's collate: the samples as they are (batches are made in the main
    process, so that a shape change splits them exactly as in process)."""
    return samples


def loader_samples(items: Sequence[InputItem], decoder: Decoder, batch_size: int,
                   workers: int) -> Iterator[Sample]:
    """Each sample, decoded in ``workers`` processes, in input order.

    Raises:
        HookscopeError: a sample's decoding error, when its position is reached.
    """
    loader = DataLoader(InputDataset(items, decoder), batch_size=batch_size, shuffle=False,
                        num_workers=workers, collate_fn=_as_list)
    it = iter(loader)
    try:
        for chunk in it:
            for i, tensor, image, error in chunk:
                if error is not None:
                    raise error
                yield items[i], tensor, image
    finally:
        # At once, not when the iterator is collected: Ctrl-C and errors stop the workers.
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
