"""The opt-in summaries of each call's output in ``stats``: per-channel moments
(:mod:`hookscope.numerics.moments`) and percentiles from a split-independent sketch
(:mod:`hookscope.numerics.sketch`), which merge exactly across batches and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from hookscope.core.mergeable import Merges, state
from hookscope.numerics.layout import channel_dim
from hookscope.numerics.moments import ChannelMoments, ChannelView
from hookscope.numerics.sketch import Sketch, finite_range, percentile_key

__all__ = ["Extras"]


@dataclass(frozen=True)
class Extras(Merges):
    """The opt-in summaries of one call's output, merged exactly. ``sketch`` is the whole
    output's (with ``percentiles`` alone); with ``per_channel`` too, ``channel_sketch`` holds
    one per channel, and the whole output's is their exact collapse."""

    per_channel: bool = False
    percentiles: tuple[float, ...] = ()
    channel_dim: int | None = state("first", None)
    channels: ChannelMoments | None = state("merge", None)
    sketch: Sketch | None = state("merge", None)
    channel_sketch: Sketch | None = state("merge", None)

    @classmethod
    def of(cls, tensor: torch.Tensor, type_name: str, spec: Extras,
           grid: tuple[tuple[int, ...], Any] | None = None) -> Extras:
        """What ``spec`` asks for, of one output of a ``type_name`` module (``grid``: the
        input's (H, W) and the model's token hint, to find channels-last outputs)."""
        if spec.per_channel:
            dim = channel_dim(tensor.shape, type_name, *(grid or ()))
            view = ChannelView.of(tensor, dim)
            channels = ChannelMoments.of(view)
            sketch = None
            if spec.percentiles:
                nonfinite = not view.blocked or bool(channels.nonfinite.any())
                sketch = Sketch.of(view, channels.min, channels.max, nonfinite=nonfinite)
            return replace(spec, channel_dim=dim, channels=channels, channel_sketch=sketch)
        view = ChannelView.of(tensor, None)
        lo, hi, nonfinite = finite_range(view)
        return replace(spec, sketch=Sketch.of(view, lo, hi, nonfinite=nonfinite))

    def to(self, device: torch.device | str) -> Extras:
        names = ("channels", "sketch", "channel_sketch")
        return replace(self, **{name: value.to(device) for name in names
                                if (value := getattr(self, name)) is not None})

    def fields(self) -> dict[str, Any]:
        """The JSON row's ``channel_dim`` and ``channels`` (with ``per_channel``) and
        ``percentiles`` (when asked for), each channel with its own ``percentiles``."""
        keys = [percentile_key(p) for p in self.percentiles]
        out: dict[str, Any] = {}
        if self.per_channel:
            rows = self.channels.rows() if self.channels is not None else []
            if self.channel_sketch is not None and keys:
                values = self.channel_sketch.quantiles(self.percentiles).tolist()
                for row, row_values in zip(rows, values, strict=True):
                    row["percentiles"] = dict(zip(keys, row_values, strict=True))
            out |= {"channel_dim": self.channel_dim, "channels": rows}
        if keys:
            whole = self.sketch if self.sketch is not None else (
                self.channel_sketch.collapse() if self.channel_sketch is not None else None)
            values = whole.quantiles(self.percentiles)[0].tolist() if whole is not None else \
                [float("nan")] * len(keys)
            out["percentiles"] = dict(zip(keys, values, strict=True))
        return out
