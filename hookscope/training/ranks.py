"""The watch under ``torch.distributed`` (DDP under torchrun): agreement between ranks.

Each rank watches its own replica. Every step the ranks exchange one flag each (one
``all_reduce``), so a non-finite value on any rank stops every rank at the same step; the
finding travels from that rank by broadcast. A logging step's reports are merged exactly on
rank 0, which alone writes. Every rank makes the same collective calls in the same order,
so none waits for a call another skipped.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist

from hookscope.core.distributed import gather_merged

__all__ = ["Ranks"]

T = TypeVar("T")


class Ranks:
    """This process's place in the job (one process: rank 0 of 1, no collectives)."""

    def __init__(self, rank: int = 0, world: int = 1, backend: str = "") -> None:
        self.rank, self.world, self.backend = rank, world, backend
        self.many, self.leader = world > 1, rank == 0

    @classmethod
    def current(cls) -> Ranks:
        """The default process group when one is initialised with several ranks."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return cls(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))
        return cls()

    def _device(self, hint: torch.device | None) -> torch.device:
        if "nccl" in self.backend and hint is not None and hint.type == "cuda":
            return hint
        if "nccl" in self.backend and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def failing(self, verdict: torch.Tensor | None) -> list[int]:
        """The ranks whose step went non-finite: the one host read of the step."""
        if not self.many:
            return [0] if verdict is not None and bool(verdict) else []
        device = self._device(verdict.device if verdict is not None else None)
        flags = torch.zeros(self.world, device=device)
        if verdict is not None:
            flags[self.rank] = verdict.to(device).float()
        dist.all_reduce(flags)
        return [rank for rank, value in enumerate(flags.tolist()) if value]

    def agree(self, failure: str | None) -> str | None:
        """Every rank learns the first failure any rank had (None: none had one)."""
        if not self.many:
            return failure
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, failure)
        return next((f"rank {r}: {f}" for r, f in enumerate(everyone) if f is not None), None)

    def share(self, payload: T, source: int) -> T:
        """``payload`` from rank ``source``, on every rank."""
        if not self.many:
            return payload
        box: list[Any] = [payload if self.rank == source else None]
        dist.broadcast_object_list(box, src=source)
        return box[0]  # type: ignore[no-any-return]

    def merged(self, report: T) -> T | None:
        """Every rank's ``report`` merged exactly, on rank 0; None elsewhere."""
        return gather_merged(report) if self.many else report
