"""Runs under ``torchrun``: each rank drives its own contiguous part of the same inputs
(:func:`shard`), and rank 0 merges the reports in rank order with their exact ``merge`` and
alone prints and writes. A failing rank prints its own error line and exits non-zero;
``HOOKSCOPE_DIST_TIMEOUT`` (seconds, default 60) bounds joining and every collective. A
training script's own process group is a :class:`Group` too (``hookscope.watch``)."""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from functools import reduce
from typing import Any, NoReturn, TypeVar

from hookscope.core.errors import HookscopeError

__all__ = ["CollectiveFailed", "Group", "Launch", "shard", "timeout_seconds"]

T = TypeVar("T")
TIMEOUT_ENV = "HOOKSCOPE_DIST_TIMEOUT"


@dataclass(frozen=True)
class Launch:
    """This process's place among those torchrun started."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Launch | None:
        """The launch the environment describes; None for a single process. Raises a
        :class:`HookscopeError` when the variables are not integers."""
        if "WORLD_SIZE" not in env or "RANK" not in env:
            return None
        try:
            world, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
            local = int(env.get("LOCAL_RANK", rank))
            local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        except ValueError:
            raise HookscopeError("torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE "
                                 "must be integers.") from None
        return cls(rank, world, local, local_world) if world > 1 else None


def timeout_seconds(env: Mapping[str, str] = os.environ) -> float:
    """``HOOKSCOPE_DIST_TIMEOUT`` (default 60 s); a :class:`HookscopeError` unless positive."""
    text = env.get(TIMEOUT_ENV, "")
    with suppress(ValueError):
        value = float(text or 60)
        if value > 0:  # not NaN
            return value
    raise HookscopeError(f"{TIMEOUT_ENV}={text!r}: give the collective timeout in seconds, "
                         "a positive number.")


def shard(count: int, batch_size: int, rank: int, world: int) -> tuple[int, int]:
    """The inputs ``[lo, hi)`` of ``rank``: a contiguous run of whole batches, as even as
    possible; the parts are disjoint and cover every input once (a rank may get none)."""
    batches = -(-count // batch_size)
    lo, hi = rank * batches // world, (rank + 1) * batches // world
    return min(lo * batch_size, count), min(hi * batch_size, count)


class CollectiveFailed(HookscopeError):
    """A collective did not complete: another rank stopped, or the timeout passed (exit 1)."""

    exit_code = 1


def fingerprint(names: Sequence[str]) -> tuple[int, str]:
    """How many ``names`` there are, and a hash of them in order."""
    return len(names), hashlib.sha256("\n".join(names).encode()).hexdigest()


def check_agreed(fingerprints: Sequence[tuple[int, str]], what: str = "inputs") -> None:
    """Check that every rank's :func:`fingerprint` of its ``what`` is rank 0's, else raise
    a :class:`HookscopeError` naming the ranks that differ and how many each resolved."""
    differ = [rank for rank, theirs in enumerate(fingerprints) if theirs != fingerprints[0]]
    if differ:
        counts = ", ".join(f"rank {rank}: {fingerprints[rank][0]}" for rank in [*differ, 0])
        raise HookscopeError(
            f"rank{'s' if len(differ) > 1 else ''} {', '.join(map(str, differ))} resolved "
            f"other {what} than rank 0 ({counts}, or in another order): every machine needs "
            "the same files at the same paths.")


class Group:
    """This process's place in a run: the only process (``launch`` None), one of torchrun's
    ranks once :meth:`join` found its variables, or one of the ranks of a process group that
    a training script initialised (:meth:`current`)."""

    def __init__(self, launch: Launch | None = None) -> None:
        self.launch = launch
        self.broken = False  # a collective failed: see :meth:`abandon`

    @classmethod
    def current(cls) -> Group:
        """The default process group, when one is initialised with several ranks."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            rank, world = dist.get_rank(), dist.get_world_size()
            return cls(Launch(rank, world, rank, world))
        return cls()

    @property
    def rank(self) -> int:
        return 0 if self.launch is None else self.launch.rank

    @property
    def size(self) -> int:
        return 1 if self.launch is None else self.launch.world_size

    @property
    def leader(self) -> bool:
        """Whether this process prints and writes (rank 0, or the only process)."""
        return self.rank == 0

    @property
    def local_size(self) -> int:
        """How many processes of this run share this machine."""
        return 1 if self.launch is None else self.launch.local_world_size

    def join(self, command: str | None, commands: Sequence[str]) -> None:
        """Under torchrun, join the other ranks (ranks but 0 log nothing). Raises a
        :class:`HookscopeError` for a command not among ``commands`` (those that run under
        torchrun), or when the other ranks cannot be reached in time."""
        launch = Launch.from_env()
        if launch is None:
            return
        self.launch = launch
        if launch.rank != 0:
            logging.getLogger("hookscope").setLevel(logging.CRITICAL + 1)
        if command not in commands:
            raise HookscopeError(f"`hookscope {command}` does not run under torchrun "
                                 f"(WORLD_SIZE={launch.world_size}); run it as one process. "
                                 f"Under torchrun: {', '.join(commands)}.")
        timeout = timeout_seconds()
        import torch
        import torch.distributed as dist

        if torch.cuda.is_available():  # `--device auto` or `cuda`: the GPU of its local rank
            torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
        try:
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
        except (RuntimeError, ValueError) as exc:  # DistStoreError, DistNetworkError, a bad port
            raise HookscopeError(
                f"could not join the other {launch.world_size - 1} processes within "
                f"{timeout:g} s ({_first_line(exc)}); check torchrun's --rdzv-endpoint, or "
                f"raise {TIMEOUT_ENV}.") from None

    def line(self, message: str, *, stopped: bool = False) -> str | None:
        """The error line this process prints, naming its rank, or None: a run ``stopped``
        (torchrun stops every rank once one has exited) is said by rank 0 only."""
        if self.launch is None:
            return message
        if stopped and not self.leader:
            return None
        return f"rank {self.rank}: {message}"

    def agree(self, names: Sequence[str]) -> None:
        """Check that every rank resolved the same input ``names`` in the same order (one
        machine missing a file would shift every part after it): see :func:`check_agreed`."""
        if self.launch is None:
            return
        import torch.distributed as dist

        everyone: list[Any] = [None] * self.size
        self._collective("comparing the inputs", dist.all_gather_object, everyone, fingerprint(names))
        check_agreed(everyone)

    def gathered(self, report: T) -> T | None:
        """Every rank's ``report`` merged in rank order, on rank 0; None on the others. Every
        rank calls it; :class:`CollectiveFailed` when a rank stopped or the timeout passed."""
        if self.launch is None:
            return report
        import torch
        import torch.distributed as dist

        packed = io.BytesIO()
        torch.save(report, packed)  # tensors on whatever device the rank used
        gathered: list[Any] | None = [None] * self.size if self.leader else None
        self._collective("gathering the reports", dist.gather_object, packed.getvalue(), gathered, 0)
        # A rank leaves only once rank 0 holds every report, so none tears its group down
        # while gloo may still be sending its part ("terminate called without an active
        # exception").
        self._collective("gathering the reports", dist.barrier)
        if gathered is None:
            return None
        # Every tensor onto the CPU, so reports from other devices merge; the bytes come from
        # this job's own ranks, so the full unpickler is used.
        reports = [torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
                   for data in gathered]
        return reduce(lambda a, b: a.merge(b), reports)  # type: ignore[no-any-return]

    # A training job's collectives (``hookscope.watch``): every rank makes the same calls in
    # the same order, so none waits for a call another skipped.

    def failing(self, score: Any) -> list[int]:
        """The ranks whose ``score`` (a device number, non-finite where a value may be; None:
        nothing checked) is set, in one ``all_reduce``: the one host read of a training step."""
        if self.launch is None:
            return [0] if score is not None and not math.isfinite(score.item()) else []
        import torch
        import torch.distributed as dist

        device = torch.device("cpu")
        if "nccl" in str(dist.get_backend()):
            device = score.device if score is not None and score.device.type == "cuda" \
                else torch.device("cuda", torch.cuda.current_device())
        flags = torch.zeros(self.size, device=device)
        if score is not None:
            flags[self.rank] = (~torch.isfinite(score)).to(device).float()
        dist.all_reduce(flags)
        return [rank for rank, value in enumerate(flags.tolist()) if value]

    def first_failure(self, failure: str | None) -> str | None:
        """Every rank learns the first failure any rank had (None: none had one)."""
        if self.launch is None:
            return failure
        import torch.distributed as dist

        everyone: list[Any] = [None] * self.size
        dist.all_gather_object(everyone, failure)
        return next((f"rank {r}: {f}" for r, f in enumerate(everyone) if f is not None), None)

    def share(self, payload: T, source: int) -> T:
        """``payload`` from rank ``source``, on every rank."""
        if self.launch is None:
            return payload
        import torch.distributed as dist

        box: list[Any] = [payload if self.rank == source else None]
        dist.broadcast_object_list(box, src=source)
        return box[0]  # type: ignore[no-any-return]

    def _collective(self, what: str, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)``, a collective of ``torch.distributed``; its failure (a peer closed
        the connection, or the timeout passed) as one :class:`CollectiveFailed` line."""
        try:
            return call(*args)
        except RuntimeError as exc:  # gloo raises RuntimeError, DistError (a subclass) else
            self.broken = True
            raise CollectiveFailed(f"{what} failed ({_first_line(exc)}): another rank stopped, "
                                   "or the process group's timeout passed.") from None

    def close(self) -> None:
        """Leave the process group, if this process joined one and it is not broken."""
        if self.launch is not None and not self.broken:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def abandon(self, code: int) -> NoReturn:
        """End this process with ``code`` at once, its output flushed: once a collective has
        failed, or on a rank other than 0 once its report is sent. The group's C++ threads
        (gloo's, still waiting on a peer) are joinable ``std::thread``s: tearing the group
        down, in :meth:`close` or in the destructors run at interpreter shutdown, can destroy
        them unjoined, and ``std::terminate`` aborts the process ("terminate called without an
        active exception", SIGABRT) instead of exiting with hookscope's code. ``os._exit``
        runs no destructor, so none is reached."""
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):  # closed, or a reader that left
                stream.flush()
        os._exit(code)


def _first_line(exc: BaseException) -> str:
    """The first sentence of ``exc``'s message, less gloo's ``[file.cc:line]`` prefix."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip())
    return (text.splitlines() or [type(exc).__name__])[0].split(". ")[0][:160]
