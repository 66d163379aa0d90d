"""The one contract of every accumulating report: a pure, exact ``merge`` (batches, workers
and ranks are all merges)."""

from __future__ import annotations

from typing import Protocol, TypeVar, overload

__all__ = ["Mergeable", "merged"]

M = TypeVar("M", bound="Mergeable")


class Mergeable(Protocol):
    """A summary that merges exactly and purely."""

    def merge(self: M, other: M) -> M:
        """A new object summarising both sides' data, as one run over this side's then the
        other's would; neither side changes."""
        ...


@overload
def merged(a: M | None, b: M) -> M: ...
@overload
def merged(a: M | None, b: M | None) -> M | None: ...
def merged(a: M | None, b: M | None) -> M | None:
    """``a.merge(b)``, or whichever side exists."""
    return b if a is None else a if b is None else a.merge(b)
