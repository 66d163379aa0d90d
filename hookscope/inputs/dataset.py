"""Decoding in ``torch.utils.data.DataLoader`` worker processes, in input order.

The resolved inputs are a map-style :class:`InputDataset`; each worker decodes and
preprocesses a run of ``batch_size`` consecutive samples (the DataLoader's default
sequential sampler keeps the order), and the main process stacks them into the very
batches :func:`hookscope.inputs.resolve.iter_batches` makes in process, shape changes included.

A sample that cannot be decoded is not raised in the worker, where the DataLoader would
wrap it in a multi-line message: the worker hands back the :class:`HookscopeError`
itself, which is raised in the main process when its position is reached, as the same
one line the in-process path gives.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Dataset

from hookscope.core.errors import HookscopeError

if TYPE_CHECKING:  # inputs imports this module; it needs their types only
    from hookscope.inputs.resolve import Decoder, InputItem, InputSet, Sample

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
    kinds = [item.kind for item in inputs.items]
    if "stdin" in kinds or kinds.count("image") < 2 * batch_size:
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
    """Each sample, decoded in ``workers`` processes, in input order.

    Raises:
        HookscopeError: a sample's decoding error, when its position is reached.
    """
    # Collated as a plain list: batches are made in the main process, so that a shape
    # change splits them exactly as in process.
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
        # The iterator has no public shutdown; without its private one, dropping the last
        # reference runs the same shutdown (its __del__).
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
    that came to its handler.

    Forking runs ``os.register_at_fork`` callbacks in this process, such as logging's
    ``_releaseLock``. A signal handler that raises inside one (Ctrl-C's, or hookscope's
    SIGTERM handler) has its exception printed as "Exception ignored in" and dropped: the
    signal is lost, the run goes on, and logging's lock stays held. So the Python handlers
    only note the signal meanwhile. The signals are also blocked in this thread, and so in
    the workers forked from it, until :func:`_worker_signals` has set the workers' own
    handling: before that, torch's worker start-up turns a SIGTERM from anyone but this
    process into a kill, which the DataLoader reports here as a worker killed by a signal.
    Outside the main thread, where no handler runs, this does nothing.
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
    process's to handle (it stops the workers). SIGTERM ends a worker at once with status 0:
    killed by a signal, it would make the DataLoader raise in the main process, over the main
    process's own one line when the whole group got the SIGTERM."""
    for name in ("SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _leave)
    if hasattr(signal, "pthread_sigmask"):  # blocked by held_signals in the main process
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def _leave(signum: int, frame: object) -> None:
    os._exit(0)
