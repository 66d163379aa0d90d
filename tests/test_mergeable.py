"""Every merge is pure: it returns a new summary of both sides and changes neither."""

from __future__ import annotations

import copy
from dataclasses import fields, is_dataclass
from typing import Any

import pytest
import torch

from hookscope.core.mergeable import merged
from hookscope.numerics.diffsums import DiffSums
from hookscope.numerics.moments import ChannelMoments, ChannelView, Moments, moments
from hookscope.numerics.sketch import Sketch, finite_range
from hookscope.probes.diff import LayerDiff
from hookscope.probes.stats import Extras, StatsReport, collect_stats


def snapshot(value: Any) -> Any:
    """A deep, comparable copy: tensors as lists, dataclasses field by field."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,
                tuple((f.name, snapshot(getattr(value, f.name))) for f in fields(value)))
    if isinstance(value, (list, tuple)):
        return tuple(snapshot(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, snapshot(v)) for k, v in value.items())
    return copy.deepcopy(value)


def sketch(x: torch.Tensor, dim: int | None) -> Sketch:
    view = ChannelView.of(x, dim)
    lo, hi, nonfinite = finite_range(view)
    return Sketch.of(view, lo, hi, nonfinite=nonfinite)


def pairs() -> dict[str, tuple[Any, Any]]:
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 4, 5, 5, generator=g), torch.randn(3, 4, 5, 5, generator=g) * 9
    spec = Extras(per_channel=True, percentiles=(1.0, 50.0))
    return {
        "moments": (moments(a), moments(b)),
        "moments, one side empty": (moments(a), Moments()),
        "diff sums": (DiffSums(10, 9, 1.0, 2.0, 3.0, 0.5, 1, 0),
                      DiffSums(5, 5, 4.0, 5.0, 6.0, 0.25, 0, 2)),
        "channel moments": (ChannelMoments.of(ChannelView.of(a, 1)),
                            ChannelMoments.of(ChannelView.of(b, 1))),
        "sketch": (sketch(a, 1), sketch(b, 1)),
        "extras": (Extras.of(a, "Conv2d", spec), Extras.of(b, "Conv2d", spec)),
        "layer diff": (LayerDiff("x", "ReLU", 0, [1], [1], DiffSums(1, 1, 1.0, 1.0, 1.0, 1.0)),
                       LayerDiff("x", "ReLU", 0, [1], [1], DiffSums(2, 2, 2.0, 2.0, 2.0, 2.0))),
    }


@pytest.mark.parametrize("case", sorted(pairs()))
def test_a_merge_changes_neither_side(case: str) -> None:
    a, b = pairs()[case]
    before = snapshot(a), snapshot(b)
    both = a.merge(b)
    assert (snapshot(a), snapshot(b)) == before
    assert both is not a and both is not b
    again = a.merge(b)
    assert snapshot(again) == snapshot(both)  # merging twice gives the same, too


def test_merged_reports_leave_their_rows_alone(tiny_net) -> None:
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    one = collect_stats(tiny_net, x[:2], per_channel=True, percentiles=[50])
    two = collect_stats(tiny_net, x[2:], per_channel=True, percentiles=[50])
    before = one.to_dict(), two.to_dict()
    rows = [snapshot(r.moments) for r in one.layers]
    both: StatsReport = one.merge(two)
    assert (one.to_dict(), two.to_dict()) == before
    assert [snapshot(r.moments) for r in one.layers] == rows
    assert both.to_dict() != one.to_dict()


def test_merged_takes_whichever_side_exists() -> None:
    m = moments(torch.arange(4.0))
    assert merged(None, m) is m and merged(m, None) is m and merged(None, None) is None


def test_declared_reductions_derive_a_pure_merge() -> None:
    from dataclasses import dataclass

    from hookscope.core.mergeable import Merges, Row, hidden, state

    @dataclass(frozen=True)
    class Call(Row):
        name: str
        type: str
        call: int
        count: int = state("sum", 0)
        low: float = state("min", float("nan"))
        high: float = state("max", float("nan"))
        note: str = hidden("")

    @dataclass(frozen=True)
    class Report(Merges):
        rows: list[Call] = state("rows", default_factory=list)
        seen: list[int] = state("cat", default_factory=list)
        tolerance: float = 0.5

    a = Report([Call("a", "Linear", 0, 2, 1.0, 3.0, "x"), Call("b", "ReLU", 0, 1)], [1], 0.5)
    b = Report([Call("b", "ReLU", 0, 4, -1.0, 7.0), Call("c", "Conv2d", 1, 3)], [2, 3], 0.9)
    before = snapshot((a, b))
    m = a.merge(b)
    assert snapshot((a, b)) == before
    assert [r.key for r in m.rows] == [("a", 0), ("b", 0), ("c", 1)]
    assert (m.rows[1].count, m.rows[1].low, m.rows[1].high) == (5, -1.0, 7.0)
    assert m.seen == [1, 2, 3] and m.tolerance == 0.5
    assert m.rows[0].to_dict() == {"name": "a", "type": "Linear", "call": 0, "count": 2,
                                   "low": 1.0, "high": 3.0}
    assert Call.columns() == ["name", "type", "call", "count", "low", "high"]
