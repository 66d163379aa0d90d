"""Runs under ``torchrun``: each rank drives its own part of the inputs, rank 0 merges.

torchrun (or any launcher that sets ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``) starts one hookscope per rank. Each joins one process
group (gloo; on CUDA machines NCCL for CUDA tensors and gloo for the CPU), loads the model,
and runs a contiguous, disjoint part of the inputs (:func:`shard`: whole batches, nothing
repeated or padded) through the same probe and the one driver. The reports are then
gathered to rank 0 with ``torch.distributed.gather_object`` (as ``torch.save`` bytes, loaded
there with every tensor on the CPU, whichever GPU each rank used) and merged in rank order with
their own exact ``merge`` (Chan's update for moments, sums of counts, min/max, sketches
bucket by bucket), which is the report of one run over all inputs in order. No probe knows
about ranks: :class:`~hookscope.session.Session` does this around the driver.

Only rank 0 prints and writes. The other ranks, once their report is sent, wait for rank
0's exit code and exit with it (:class:`Follow`).

Failures never hang. Beside the collectives, the ranks share torchrun's key-value store:

* a rank that fails (a bad image, the model's forward raising, a signal) posts its error
  there before it exits; every other rank looks for it before each batch and while it
  waits, and exits with that error and exit code (rank 0 prints it, naming the rank; the
  others leave only once it has, since torchrun stops every rank as soon as one exits);
* each rank beats a counter every second and watches the next rank's (a ring), so a rank
  that dies without a word (killed, out of memory) is noticed after the timeout;
* the timeout (``HOOKSCOPE_DIST_TIMEOUT`` seconds, default 60) also bounds joining the
  group and every collective.

Before any work each rank also checks that it resolved the same inputs as rank 0
(:meth:`Group.agree`): a machine missing one file would shift every part after it.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from hookscope.core.errors import HookscopeError

__all__ = ["COMMANDS", "Follow", "Group", "JoinError", "Launch", "PeerFailed", "gather_merged",
           "shard", "timeout_seconds"]

T = TypeVar("T")
TIMEOUT_ENV = "HOOKSCOPE_DIST_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
#: The commands whose reports merge, and so run under torchrun.
COMMANDS = ("stats", "grads", "debug", "ablate", "check")
_POLL = 0.05


@dataclass(frozen=True)
class Launch:
    """This process's place among those torchrun started."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Launch | None:
        """The launch the environment describes; None for a single process.

        Raises:
            HookscopeError: the variables are not integers.
        """
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

    @property
    def same_node_as_leader(self) -> bool:
        """Whether this rank runs on rank 0's machine (torchrun numbers ranks node by node),
        and so shares its stderr."""
        return self.rank - self.local_rank == 0


def timeout_seconds(env: Mapping[str, str] = os.environ) -> float:
    """``HOOKSCOPE_DIST_TIMEOUT`` (default 60 s).

    Raises:
        HookscopeError: not a positive number.
    """
    text = env.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        value = -1.0
    if not value > 0:
        raise HookscopeError(f"{TIMEOUT_ENV}={text!r}: give the collective timeout in seconds, "
                             "a positive number.")
    return value


def shard(count: int, batch_size: int, rank: int, world: int) -> tuple[int, int]:
    """The inputs ``[lo, hi)`` of ``rank``: a contiguous run of whole batches, as even as
    possible; the parts are disjoint and cover every input once (a rank may get none)."""
    batches = -(-count // batch_size)
    lo, hi = rank * batches // world, (rank + 1) * batches // world
    return min(lo * batch_size, count), min(hi * batch_size, count)


class PeerFailed(HookscopeError):
    """Another rank failed (its message, and its exit code), or stopped responding.

    Attributes:
        loud: this rank prints it too (rank 0, which would have, is gone).
    """

    def __init__(self, message: str, exit_code: int = 1, *, loud: bool = False) -> None:
        super().__init__(message)
        self.exit_code, self.loud = exit_code, loud


class JoinError(HookscopeError):
    """This process could not join the others (every rank prints it)."""


class Follow(BaseException):
    """Raised on ranks other than 0 once their report is sent: rank 0 writes the output,
    and the others exit with its exit code."""


def _packed(report: Any) -> bytes:
    """A report as bytes, its tensors (on whatever GPU the rank used) included."""
    import torch

    buffer = io.BytesIO()
    torch.save(report, buffer)
    return buffer.getvalue()


def _unpacked(data: bytes) -> Any:
    """A rank's report with every tensor on the CPU, so that reports from ranks on other
    GPUs (or machines with fewer) merge; rank 0's own goes the same way. The bytes come from
    this job's own ranks, so the full unpickler is used."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def gather_merged(report: T) -> T | None:
    """Every rank's ``report`` merged in rank order with its own exact ``merge``, on rank 0;
    None on the other ranks. A collective: every rank of the job calls it."""
    import torch.distributed as dist

    gathered: list[Any] | None = [None] * dist.get_world_size() \
        if dist.get_rank() == 0 else None
    dist.gather_object(_packed(report), gathered, dst=0)
    if gathered is None:
        return None
    reports = [_unpacked(data) for data in gathered]
    merged = reports[0]
    for other in reports[1:]:
        merged = merged.merge(other)
    return merged  # type: ignore[no-any-return]


class Progress:
    """A progress callback that counts every rank's units in the store; on rank 0 it moves
    ``bar`` (the command's progress bar) to the total of all ranks."""

    def __init__(self, store: Any, bar: Any) -> None:
        self.store, self.bar, self.shown = store, bar, 0

    def __call__(self, n: int) -> None:
        self._show(int(self.store.add("progress", int(n))))

    def refresh(self) -> None:
        self._show(int(self.store.add("progress", 0)))

    def expect(self, total: int) -> None:
        expect = getattr(self.bar, "expect", None)
        if expect is not None:
            expect(total)

    def _show(self, total: int) -> None:
        if self.bar is not None and total > self.shown:
            self.bar(total - self.shown)
            self.shown = total


class Group:
    """This rank's membership of the run: the process group, the store, the heartbeat."""

    def __init__(self, launch: Launch, timeout: float, store: Any) -> None:
        self.launch, self.timeout, self.store = launch, timeout, store
        self.dead: int | None = None  # a rank whose heartbeat stopped
        self.lost = False  # the store itself went away
        self.published = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hookscope-heartbeat",
                                        daemon=True)

    @classmethod
    def join(cls, launch: Launch, timeout: float) -> Group:
        """Join the process group (within ``timeout`` seconds) and start the heartbeat.

        Raises:
            JoinError: the others could not be reached in time.
        """
        import torch
        import torch.distributed as dist

        wait = timedelta(seconds=timeout)
        try:
            store, _, _ = next(dist.rendezvous("env://", timeout=wait))
            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
            dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo",
                                    store=dist.PrefixStore("pg", store), rank=launch.rank,
                                    world_size=launch.world_size, timeout=wait)
        except (RuntimeError, ValueError, OSError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise JoinError(f"rank {launch.rank} could not join the other "
                            f"{launch.world_size - 1} processes within {timeout:g} s ({reason}); "
                            f"check torchrun's --rdzv-endpoint, or raise {TIMEOUT_ENV}.") from None
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        group = cls(launch, timeout, dist.PrefixStore(f"hookscope/{attempt}", store))
        group._thread.start()
        return group

    # ------------------------------------------------------------------ failures

    def _beat(self) -> None:
        """Beat every second; watch the next rank's beat (a ring: each rank is watched)."""
        rank, world = self.launch.rank, self.launch.world_size
        watched = (rank + 1) % world
        seen, since = -1, time.monotonic()
        while not self._stop.wait(min(1.0, self.timeout / 10)):
            try:
                self.store.add(f"beat/{rank}", 1)
                beat = int(self.store.add(f"beat/{watched}", 0))
                closed = self.store.check([f"closed/{watched}"])
            except Exception:  # the store is gone with the process that held it
                self.lost = True
                return
            now = time.monotonic()
            if beat != seen:
                seen, since = beat, now
            elif not closed and now - since > self.timeout:
                self.dead = watched
                self._post(-1, 1, f"rank {watched} stopped responding for {self.timeout:g} s "
                                  "(it crashed or was killed); no output was written.")
                return

    def _post(self, source: int, code: int, message: str) -> bool:
        first = int(self.store.add("failures", 1)) == 1
        if first:
            self.store.set("error", f"{source}\n{code}\n{message}")
        return first

    def fail(self, message: str, code: int) -> bool:
        """Tell the other ranks this one failed; True when it was the first to."""
        try:
            return self._post(self.launch.rank, code, message)
        except Exception:  # the store is gone: nobody is left to tell
            return True

    def check(self) -> None:
        """Raise when another rank has failed or stopped responding.

        Raises:
            PeerFailed: with that rank's message and exit code.
        """
        try:
            if self.store.check(["error"]):
                source, code, message = self.store.get("error").decode().split("\n", 2)
                where = f"rank {source}: " if int(source) >= 0 else ""
                raise PeerFailed(where + message, int(code), loud=self.dead == 0)
        except PeerFailed:
            raise
        except Exception:
            self.lost = True
        if self.lost:
            raise PeerFailed("lost contact with torchrun's store (rank 0 or the agent stopped); "
                             "no output was written.", 1, loud=True)
        if self.dead is not None:
            raise PeerFailed(f"rank {self.dead} stopped responding for {self.timeout:g} s; no "
                             "output was written.", 1, loud=self.dead == 0)

    # ------------------------------------------------------------------ the run

    def agree(self, what: str, names: Sequence[str]) -> None:
        """Check that every rank resolved the same ``names`` (inputs, in order) as rank 0,
        which each rank shards alike: one machine missing a file would make every shard
        after it wrong.

        Raises:
            HookscopeError: this rank's names differ from rank 0's.
            PeerFailed: another rank failed while this one waited.
        """
        digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
        mine = f"{len(names)} {digest}"
        if self.launch.rank == 0:
            self.store.set(f"agree/{what}", mine)
            return
        deadline = time.monotonic() + self.timeout
        while not self.store.check([f"agree/{what}"]):
            self.check()
            if time.monotonic() > deadline:
                raise PeerFailed(f"rank 0 did not list its {what} within {self.timeout:g} s; "
                                 "no output was written.", 1, loud=True)
            time.sleep(_POLL)
        theirs = self.store.get(f"agree/{what}").decode()
        if theirs != mine:
            count = theirs.split()[0]
            raise HookscopeError(
                f"this rank resolved other {what} than rank 0 ({len(names)} here, {count} "
                f"there, or another order): every machine needs the same files at the same "
                "paths.")

    def shard(self, count: int, batch_size: int) -> tuple[int, int]:
        """This rank's inputs ``[lo, hi)`` (see :func:`shard`)."""
        return shard(count, batch_size, self.launch.rank, self.launch.world_size)

    def watch(self, batches: Iterable[T]) -> Iterator[T]:
        """``batches``, looking for another rank's failure before each one."""
        it = iter(batches)
        try:
            while True:
                self.check()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                yield batch
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def progress(self, bar: Any) -> Progress:
        """A progress callback counting every rank's units (rank 0 shows the total)."""
        return Progress(self.store, bar if self.launch.rank == 0 else None)

    def merge(self, report: T, progress: Progress) -> T:
        """Every rank's report merged in rank order, on rank 0.

        Raises:
            Follow: on the other ranks, once their report is sent.
            PeerFailed: another rank failed first.
        """

        self.store.add("done", 1)
        while int(self.store.add("done", 0)) < self.launch.world_size:
            self.check()
            progress.refresh()
            time.sleep(_POLL)
        progress.refresh()
        try:
            merged = gather_merged(report)
        except RuntimeError as exc:
            raise PeerFailed(f"gathering the reports failed: {str(exc).splitlines()[0][:160]}; "
                             "no output was written.") from None
        if merged is None:
            raise Follow()
        return merged

    # ------------------------------------------------------------------ the end

    def publish(self, code: int) -> None:
        """Rank 0: the run's exit code, for the others."""
        self.published = True
        try:
            self.store.set("exit", str(code))
        except Exception:  # the others find out through their heartbeat
            pass

    def outcome(self) -> int:
        """Ranks other than 0: rank 0's exit code, once it has written the output.

        Raises:
            PeerFailed: rank 0 stopped responding, or its store went away.
        """
        while True:
            try:
                if self.store.check(["exit"]):
                    return int(self.store.get("exit"))
                if self.store.check(["closed/0"]):  # left without a word: never expected
                    raise PeerFailed("rank 0 ended without an exit code.", 1, loud=True)
            except PeerFailed:
                raise
            except Exception:
                self.lost = True
            self.check()  # rank 0 failed, died, or took its store with it
            time.sleep(_POLL)

    def acknowledged(self) -> bool:
        """A rank other than 0 that failed: whether rank 0 took up the failure (it published
        its exit code, and so printed the error) within the timeout."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and self.dead is None and not self.lost:
            try:
                if self.store.check(["exit"]):
                    return True
            except Exception:
                return False
            time.sleep(_POLL)
        return False

    def close(self, *, wait: bool = True) -> None:
        """Leave: say so, and on rank 0 wait (at most the timeout, and not when ``wait`` is
        False: stopped by a signal) for the others to leave too, since they may read the
        store this process holds."""
        if self.launch.rank == 0 and not self.published:
            self.publish(1)  # ended by something no handler saw (SystemExit)
        try:
            self.store.set(f"closed/{self.launch.rank}", "1")
            self.store.add("closed", 1)
            deadline = time.monotonic() + self.timeout
            while wait and self.launch.rank == 0 and time.monotonic() < deadline and \
                    self.dead is None and not self.lost and \
                    int(self.store.add("closed", 0)) < self.launch.world_size:
                time.sleep(_POLL)
        except Exception:
            pass
        self._stop.set()
        self._thread.join(timeout=5)
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
