"""Summaries per key (a layer call), merged exactly across batches. On an accelerator a
batch's summaries stay on the device until :meth:`Table.flush` copies them to the host in one
transfer, so nothing synchronises per layer."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

import torch

from hookscope.core.mergeable import Mergeable

__all__ = ["Table"]


_S = TypeVar("_S", bound=Mergeable)


class Table(Generic[_S]):
    """Summaries per key; ``kind`` makes one from the values a device tensor holds."""

    def __init__(self, kind: Callable[[Sequence[float]], _S]) -> None:
        self._kind = kind
        self._rows: dict[Hashable, _S] = {}
        self._pending: list[tuple[Hashable, torch.Tensor]] = []

    def put(self, key: Hashable, found: _S | torch.Tensor) -> None:
        """Merge ``found`` into ``key``'s summary; a tensor of its values waits for :meth:`flush`."""
        if isinstance(found, torch.Tensor):
            self._pending.append((key, found))
            return
        old = self._rows.get(key)
        self._rows[key] = found if old is None else old.merge(found)

    def flush(self) -> None:
        """Bring deferred device summaries to the host in one transfer and merge them."""
        if not self._pending:
            return
        host = torch.stack([values for _, values in self._pending]).cpu().tolist()
        for (key, _), values in zip(self._pending, host, strict=True):
            self.put(key, self._kind(values))
        self._pending.clear()

    def get(self, key: Hashable) -> _S | None:
        return self._rows.get(key)
