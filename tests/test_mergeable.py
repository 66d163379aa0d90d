"""Every merge is pure: it returns a new summary of both sides and changes neither."""

from __future__ import annotations

import copy
from dataclasses import fields, is_dataclass
from typing import Any

import pytest
import torch

from hookscope.core.mergeable import merged
from hookscope.probes.channels import ChannelMoments, ChannelView
from hookscope.probes.diff import LayerDiff
from hookscope.probes.diffsums import DiffSums
from hookscope.probes.extras import Extras
from hookscope.probes.sketch import Sketch, finite_range
from hookscope.probes.stats import Moments, StatsReport, collect_stats, moments


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
    both = a.merged(b) if isinstance(a, LayerDiff) else a.merge(b)
    assert (snapshot(a), snapshot(b)) == before
    assert both is not a and both is not b
    again = a.merged(b) if isinstance(a, LayerDiff) else a.merge(b)
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
