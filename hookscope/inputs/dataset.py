"""Decoding in ``torch.utils.data.DataLoader`` worker processes, in input order.

Workers decode runs of consecutive samples; the main process stacks them into the very
batches :func:`hookscope.inputs.resolve.iter_batches` makes in process. A sample's decoding
error is handed back, not raised in the worker (where the DataLoader would wrap it in a
multi-line message), and raised when its position is reached, as the same one line.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torch.utils.data import DataLoader, Dataset

from hookscope.core.errors import HookscopeError
from hookscope.inputs.decode import Decoder, InputItem, InputSet, Sample

__all__ = ["InputDataset", "default_workers", "loader_samples"]

MAX_DEFAULT_WORKERS = 4  # decoding seldom keeps more busy


def default_workers(inputs: InputSet, batch_size: int, processes: int = 1) -> int:
    """The ``workers`` used when none are given: 0 (in process) for stdin, tensor files and
    under two batches of images or data set items; else one CPU fewer than this process's share (``processes``
    share the machine), at most MAX_DEFAULT_WORKERS, when that is at least 2 (one worker does
    no more than the prefetching thread)."""
    kinds = [item.kind for item in inputs.items]
    if "stdin" in kinds or kinds.count("image") + kinds.count("data") < 2 * batch_size:
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


def loader_samples(items: Sequence[InputItem], decoder: Decoder, batch_size: int,
                   workers: int) -> Iterator[Sample]:
    """Each sample, decoded in ``workers`` processes, in input order; a sample's decoding
    error is raised when its position is reached."""
    # Collated as a plain list: the main process makes the batches, splitting them at a
    # shape change exactly as in process.
    loader = DataLoader(InputDataset(items, decoder), batch_size=batch_size, shuffle=False,
                        num_workers=workers, collate_fn=list, worker_init_fn=_worker_signals)
    it = None
    try:
        with held_signals():  # the workers fork here
            it = iter(loader)
        for chunk in it:
            for i, tensor, image, error in chunk:
                if error is not None:
                    raise error
                yield items[i], tensor, image
    finally:
        # At once, not when the iterator is collected: Ctrl-C and errors stop the workers.
        # Without the private shutdown, dropping the last reference runs it (__del__).
        shutdown = getattr(it, "_shutdown_workers", None)
        del it
        if shutdown is not None:
            shutdown()


#: Signals :func:`held_signals` holds back.
HELD = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
             if hasattr(signal, name))


@contextmanager
def held_signals() -> Iterator[None]:
    """Hold back SIGINT, SIGTERM and SIGHUP while worker processes fork, then hand a signal
    that came to its handler (in the main thread; elsewhere no handler runs).

    A handler that raises inside an ``os.register_at_fork`` callback (logging's
    ``_releaseLock``) has its exception dropped: the signal is lost and logging's lock stays
    held. So the handlers only note the signal meanwhile. The signals stay blocked in the
    workers until :func:`_worker_signals` sets their handling: before that, torch's worker
    start-up turns a SIGTERM into a kill the DataLoader reports as a crash.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {number: signal.signal(number, lambda signum, _: came.append(signum))
                for number in HELD if callable(signal.getsignal(number))}
    mask = getattr(signal, "pthread_sigmask", None)
    blocked = mask(signal.SIG_BLOCK, HELD) if mask is not None else None
    try:
        yield
    finally:
        if mask is not None:
            mask(signal.SIG_SETMASK, blocked)  # a pending signal is noted now
        for number, handler in previous.items():
            signal.signal(number, handler)
        handler = previous.get(came[0]) if came else None
        if callable(handler):
            handler(came[0], None)


def _worker_signals(_: int) -> None:
    """In a worker: Ctrl-C and hang-ups, sent to the whole process group, are the main
    process's to handle. SIGTERM ends a worker at once with status 0: killed by a signal, it
    would make the DataLoader raise over the main process's own one line."""
    for name in ("SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    if hasattr(signal, "pthread_sigmask"):  # blocked by held_signals in the main process
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
