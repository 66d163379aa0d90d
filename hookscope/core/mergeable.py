"""The one contract of every accumulating report: a pure, exact ``merge`` (batches, workers
and ranks are all merges), derived from each field's declared reduction; and :class:`Row`,
the name, type and call every analysis's per-call row starts from.

A dataclass declares how each of its fields combines with :func:`state` (as torchmetrics'
``add_state(..., dist_reduce_fx=...)``); :class:`Merges` derives ``merge`` from those
declarations, so no report writes its own. Fields without a reduction are configuration,
kept from the left side.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable
from dataclasses import MISSING, Field, field, fields, replace
from typing import Any, Protocol, TypeVar, overload

__all__ = ["Mergeable", "Merges", "Row", "hidden", "merged", "state"]

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


def _extreme(pick: Callable[[float, float], float]) -> Callable[[Any, Any], Any]:
    """``min``/``max`` that ignore a NaN side (NaN stands for "nothing seen")."""
    def combine(a: Any, b: Any) -> Any:
        if isinstance(a, float) and math.isnan(a):
            return b
        if isinstance(b, float) and math.isnan(b):
            return a
        return pick(a, b)
    return combine


def _rows(a: list[Any], b: list[Any]) -> list[Any]:
    """Keyed rows united in first-seen order; a key on both sides is merged."""
    out: dict[Hashable, Any] = {row.key: row for row in a}
    for row in b:
        out[row.key] = out[row.key].merge(row) if row.key in out else row
    return list(out.values())


def _union(a: list[Any], b: list[Any]) -> list[Any]:
    """Both sides' items, each once, in first-seen order (by ``key`` where items have one)."""
    out: dict[Hashable, Any] = {}
    for item in [*a, *b]:
        out.setdefault(getattr(item, "key", item), item)
    return list(out.values())


#: The named reductions: a field declares one of these, or any pure callable of two values.
REDUCTIONS: dict[str, Callable[[Any, Any], Any]] = {
    "sum": operator.add,
    "min": _extreme(min),
    "max": _extreme(max),
    "cat": lambda a, b: [*a, *b],
    "merge": merged,
    "first": lambda a, b: b if a is None else a,
    "rows": _rows,
    "union": _union,
}


def state(reduce: str | Callable[[Any, Any], Any], default: Any = MISSING, *,
          default_factory: Any = MISSING, json: bool = True, **kwargs: Any) -> Any:
    """A dataclass field whose values combine by ``reduce`` (a name of :data:`REDUCTIONS`
    or a function of both sides' values); ``json=False`` keeps it out of ``to_dict``."""
    return field(default=default, default_factory=default_factory,
                 metadata={"reduce": reduce, "json": json}, **kwargs)


def hidden(default: Any = MISSING, **kwargs: Any) -> Any:
    """A configuration field kept out of ``to_dict`` (and out of comparisons)."""
    return field(default=default, metadata={"json": False}, repr=False, compare=False, **kwargs)


class Merges:
    """A dataclass mixin: ``merge`` combines every :func:`state` field by its reduction (a
    new object; neither side changes)."""

    def merge(self: Any, other: Any) -> Any:
        changes = {}
        for f in fields(self):
            how = f.metadata.get("reduce")
            if how is not None:
                combine = REDUCTIONS[how] if isinstance(how, str) else how
                changes[f.name] = combine(getattr(self, f.name), getattr(other, f.name))
        return replace(self, **changes)


def _in_json(f: Field[Any]) -> bool:
    return f.metadata.get("json", True) and not f.name.startswith("_")


class Row(Merges):
    """A dataclass mixin for one module call's row: declare ``name``, ``type`` and ``call``
    first; ``to_dict`` (the JSON row) and :meth:`columns` (CSV) follow from the fields."""

    name: str
    type: str
    call: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.call)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if _in_json(f)}  # type: ignore[arg-type]

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls) if _in_json(f)]  # type: ignore[arg-type]
