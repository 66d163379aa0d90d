"""Per-layer activation statistics, taken inside forward hooks and merged exactly across batches.

Each call's moments come from :mod:`hookscope.numerics.moments`; on an accelerator they stay
on the device, and a batch's are copied to the host once
(:class:`~hookscope.numerics.table.Table`). Per-channel moments and percentiles from a
split-independent sketch (:mod:`hookscope.numerics.sketch`) are opt-in :class:`Extras`,
which merge exactly across batches and ranks too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch import nn

from hookscope.core.hooks import Call, first_tensor, tensor_shapes
from hookscope.core.logits import select_logits
from hookscope.core.mergeable import Merges, Row, merged, state
from hookscope.core.run import Probe, Step, drive
from hookscope.core.select import LEAVES, Selection, Site, selecting
from hookscope.numerics.layout import channel_dim, extent, signal_model, token_hint
from hookscope.numerics.moments import ChannelMoments, ChannelView, Moments, deferred_moments
from hookscope.numerics.sketch import Sketch, finite_range, parse_percentiles, percentile_key
from hookscope.numerics.table import Table

__all__ = ["Extras", "LayerStats", "Prediction", "StatsProbe", "StatsReport", "collect_stats",
           "top_predictions"]


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


@dataclass(frozen=True)
class LayerStats(Row):
    """Statistics of one module call's output (and optionally its first input).

    The numbers follow from ``moments``, ``input_moments`` and ``extras``, the mergeable
    summaries behind them, not part of the JSON row; ``input_stats``, ``channel_dim``,
    ``channels`` and ``percentiles`` are None, and left out of it, unless asked for.
    """

    name: str
    type: str
    call: int
    input_shapes: list[list[int]]
    output_shape: list[int] | None = field(init=False)
    mean: float = field(init=False)
    std: float = field(init=False)
    min: float = field(init=False)
    max: float = field(init=False)
    zero_fraction: float = field(init=False)
    nonfinite: int = field(init=False)
    output_shapes: list[list[int]] = field(default_factory=list)
    input_stats: dict[str, float | int] | None = field(init=False)
    channel_dim: int | None = field(init=False)
    channels: list[dict[str, Any]] | None = field(init=False)
    percentiles: dict[str, float] | None = field(init=False)
    moments: Moments = state("merge", default_factory=Moments, json=False, repr=False, compare=False)
    input_moments: Moments | None = state("merge", None, json=False, repr=False, compare=False)
    extras: Extras | None = state("merge", None, json=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        inputs, extras = self.input_moments, self.extras
        derived = self.moments.summary() | {
            "output_shape": self.output_shapes[0] if self.output_shapes else None,
            "input_stats": inputs.summary() if inputs is not None else None,
            "channel_dim": None, "channels": None, "percentiles": None}
        for name, value in (derived | (extras.fields() if extras is not None else {})).items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        absent = {key for key in ("input_stats", "channels", "percentiles")
                  if getattr(self, key) is None}
        absent |= {"channel_dim"} if self.channels is None else set()
        return {key: value for key, value in super().to_dict().items() if key not in absent}


@dataclass(frozen=True)
class Prediction:
    """One of an input's top predictions."""

    index: int
    label: str | None
    prob: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StatsReport(Merges):
    """What ``collect_stats`` returns: per-call layer statistics and top predictions. Merged,
    it is exactly what one run over both reports' inputs, in order, gives (calls present on
    one side only are kept)."""

    layers: list[LayerStats] = state("rows")
    #: Per input, its top-k; None where its logits were not finite (no ranking is honest).
    predictions: list[list[Prediction] | None] = state("cat")
    input_shape: list[int] | None = state(lambda a, b: a or b)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document without its envelope: ``input_shape``, ``predictions``, ``layers``."""
        return {
            "input_shape": self.input_shape,
            "predictions": [None if preds is None else [p.to_dict() for p in preds]
                            for preds in self.predictions],
            "layers": [layer.to_dict() for layer in self.layers],
        }


def _on_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in it on the CPU, those of nested dataclasses too."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    return replace(obj, **{f.name: _on_cpu(getattr(obj, f.name)) for f in dataclasses.fields(obj)})


def top_predictions(
    logits: torch.Tensor, categories: Sequence[str] | None, k: int = 5
) -> list[list[Prediction] | None]:
    """Top-k softmax predictions per row of a (N, classes) output; None for a row holding
    NaN or Inf, whose softmax ranks nothing."""
    probs = torch.softmax(logits.detach().float(), dim=1)
    finite = torch.isfinite(logits.detach()).all(dim=1).tolist()
    values, indices = probs.topk(min(k, probs.shape[1]), dim=1)
    labels = categories if categories is not None and len(categories) == probs.shape[1] else None
    return [
        [Prediction(int(i), labels[int(i)] if labels else None, float(p))
         for p, i in zip(prow.tolist(), irow.tolist(), strict=True)] if ok else None
        for prow, irow, ok in zip(values, indices, finite, strict=True)
    ]


class StatsProbe(Probe[StatsReport]):
    """Summarise each selected call's output (and first input) inside its hooks.

    Args:
        model: the model that will run.
        select: the modules summarised.
        input_stats: also summarise each call's first input.
        categories: class labels for the top-5 predictions of a classifier.
        output_key: the entry of a dict or tuple output holding the logits.
        per_channel: also per-channel statistics of each call's output.
        percentiles: also these percentiles (0 to 100; or ``"0.1,99.9"``) of each call's
            output (and of each channel, with ``per_channel``).

    Raises:
        HookscopeError: ``percentiles`` is empty, not numbers, or outside [0, 100].
    """

    def __init__(self, model: nn.Module, *, select: Selection = LEAVES,
                 input_stats: bool = False,
                 categories: Sequence[str] | None = None, output_key: str | None = None,
                 per_channel: bool = False,
                 percentiles: str | Sequence[float] | None = None) -> None:
        self.spec = Extras(per_channel=per_channel, percentiles=parse_percentiles(percentiles))
        self.sites = select.sites(model)
        #: Calls whose outputs hold no negative value: torch's own ReLU (not a subclass).
        self.nonnegative = {site.name for site in self.sites if type(site.module) is nn.ReLU}
        self.input_stats = input_stats
        self.extras: dict[tuple[str, int], Extras] = {}
        self.categories, self.output_key = categories, output_key
        self.table = Table(Moments.from_values)
        self.order: list[tuple[str, int]] = []
        self.meta: dict[tuple[str, int], tuple[Site, list[list[int]], list[list[int]]]] = {}
        self._entered: dict[tuple[str, int], list[list[int]]] = {}
        self.predictions: list[list[Prediction] | None] = []
        self.input_shape: list[int] | None = None
        self.grid: tuple[tuple[int, ...], Any] | None = None
        self.signal = False
        if per_channel:
            self.grid = ((0, 0), token_hint(model))
            self.signal = signal_model(model)

    def step(self, step: Step) -> None:
        x = first_tensor(step.x)
        if self.grid is not None and x is not None and x.is_floating_point() and \
                (x.dim() in (4, 5) or (x.dim() == 3 and self.signal)):  # a signal (N, C, L)
            self.grid = (extent(x), self.grid[1])
        super().step(step)

    def on_enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if call.key not in self.meta:  # shapes are recorded from the first batch
            self._entered[call.key] = tensor_shapes((args, kwargs))
        if self.input_stats:
            # Inputs are summarised here, before an in-place module overwrites them.
            first = first_tensor((args, kwargs))
            if first is not None:
                self.table.put((*call.key, "in"), deferred_moments(first))

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        key = call.key
        if key not in self.meta:
            self.order.append(key)
            self.meta[key] = (call.site, self._entered.pop(key, []), tensor_shapes(output))
        first = first_tensor(output)
        if first is not None:
            self.table.put((*key, "out"),
                           deferred_moments(first, nonnegative=key[0] in self.nonnegative))
            if self.spec.per_channel or self.spec.percentiles:
                self.extras[key] = merged(self.extras.get(key),
                                           Extras.of(first, call.site.type, self.spec,
                                                     self.grid))

    def observe(self, step: Step, output: Any) -> None:
        self.table.flush()
        if self.input_shape is None:
            found = first_tensor(step.x)
            self.input_shape = list(found.shape[1:]) if found is not None else None
        logits = select_logits(output, self.output_key, required=False)
        if logits is not None and logits.dim() == 2 and logits.shape[1] > 1:
            self.predictions.extend(top_predictions(logits, self.categories))

    def finish(self) -> StatsReport:
        rows = []
        for key in self.order:
            site, in_shapes, out_shapes = self.meta[key]
            extras = self.extras.get(key)
            if self.spec.per_channel or self.spec.percentiles:
                extras = _on_cpu(extras) if extras is not None else self.spec
            rows.append(LayerStats(site.name, site.type, key[1], in_shapes, out_shapes,
                                   self.table.get((*key, "out")) or Moments(),
                                   self.table.get((*key, "in")), extras))
        return StatsReport(layers=rows, predictions=self.predictions,
                           input_shape=self.input_shape)


@selecting
def collect_stats(model: nn.Module, inputs: torch.Tensor | Iterable[torch.Tensor], *,
                  on_batch: Callable[[int], None] | None = None, **options: Any) -> StatsReport:
    """Run ``model`` in eval and inference mode and summarise each selected module call:
    per-call statistics in execution order, and top-5 predictions for (N, classes) outputs.

    ``inputs`` is one batch tensor or an iterable of them (streamed, merged exactly);
    ``options`` are :class:`StatsProbe`'s (``select``, or the keywords ``layers``, ``types``,
    ``all_modules``, ``max_depth``; ``output_key`` defaults to ``logits``, ``out`` or the only
    tensor); ``on_batch`` is called with each batch's size.
    """
    return drive(model, inputs, StatsProbe(model, **options), progress=on_batch)
