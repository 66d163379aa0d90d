"""Feature modification: change chosen channels of one layer's output and compare predictions.

The forward hook returns a modified copy of the output, leaving the module and anything sharing
its output alone. ``sweep`` ablates one channel per row of a repeated input: C channels cost about
``C / batch`` forward passes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from hookscope.cam.passes import channel_per_row
from hookscope.core.arguments import take
from hookscope.core.classes import Targets, parse_targets
from hookscope.core.errors import HookscopeError, at_least_one, param
from hookscope.core.hooks import Call, model_device
from hookscope.core.logits import class_logits
from hookscope.core.mergeable import Merges, state
from hookscope.core.run import Probe, Step, drive
from hookscope.core.select import find_site
from hookscope.probes.stats import Prediction, top_predictions

__all__ = ["AblateProbe", "AblateReport", "AblationResult", "ChannelDrop", "Mode", "Top",
           "ablate", "parse_channels", "parse_mode", "sweep"]

MODES = ("zero", "mean", "noise", "scale")


@dataclass(frozen=True)
class Mode:
    """How chosen channels change: ``zero``, ``mean``, ``noise`` (std) or ``scale`` (factor)."""

    kind: str
    value: float | None = None

    @property
    def text(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value:g}"


def parse_mode(spec: str | Mode, *, processes: int = 1) -> Mode:
    """Parse ``zero``, ``mean``, ``noise:SIGMA`` or ``scale:F``; ``processes``: torchrun's ranks.
    HookscopeError for an unknown mode, a bad number, or noise in more than one process."""
    mode = spec if isinstance(spec, Mode) else _parse_mode(spec)
    if mode.kind == "noise" and processes > 1:
        raise HookscopeError(f"{param('mode')} noise draws its noise batch after batch in one process; "
                             "under torchrun each rank would draw other noise. Run it as one "
                             "process, or use zero, mean or scale.")
    return mode


def _parse_mode(spec: str) -> Mode:
    kind, _, arg = spec.strip().lower().partition(":")
    given, usage = f"{param('mode')} {spec!r}", "use zero, mean, noise:SIGMA or scale:F"
    if kind not in MODES:
        raise HookscopeError(f"{given} is not a mode; {usage}.")
    if kind in ("zero", "mean"):
        if arg:
            raise HookscopeError(f"{given}: {kind} takes no value; {usage}.")
        return Mode(kind)
    if not arg:
        raise HookscopeError(f"{given}: {kind} needs a value, e.g. {kind}:0.5.")
    try:
        value = float(arg)
    except ValueError:
        raise HookscopeError(f"{given}: {arg!r} is not a number.") from None
    if not math.isfinite(value) or (kind == "noise" and value < 0):
        negative = " and not negative" if kind == "noise" else ""
        raise HookscopeError(f"{given}: the value must be finite{negative}.")
    return Mode(kind, value)


def parse_channels(spec: str | Sequence[int] | None, count: int) -> list[int]:
    """Parse ``0,5,7``, ranges such as ``0-15``, or ``all``; HookscopeError for a malformed
    entry, a duplicate or a channel out of range (``count``)."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return list(range(count))
    if not isinstance(spec, str):
        chosen = [int(c) for c in spec]
    else:
        chosen = []
        for raw in spec.split(","):
            item = raw.strip()
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
            if not m:
                raise HookscopeError(f"{param('channels')} {spec!r}: {item!r} is not a channel "
                                     "number or a range A-B.")
            lo, hi = int(m[1]), int(m[2] or m[1])
            if hi < lo:
                raise HookscopeError(f"{param('channels')} {spec!r}: the range {item} is empty.")
            chosen.extend(range(lo, hi + 1))
    if not chosen:
        raise HookscopeError(f"{param('channels')} lists no channel.")
    bad = [c for c in chosen if not 0 <= c < count]
    if bad:
        raise HookscopeError(f"{param('channels')}: channel {bad[0]} is out of range; the layer has "
                             f"{count} channels (0 to {count - 1}).")
    if len(set(chosen)) != len(chosen):
        raise HookscopeError(f"{param('channels')} lists a channel twice.")
    return chosen


@dataclass(frozen=True)
class Top(Prediction):
    """One of the top predictions, with its logit."""

    logit: float


@dataclass(frozen=True)
class ChannelDrop:
    """One channel of a sweep: how much the target logit dropped when it alone was ablated."""

    channel: int
    drop: float
    delta_prob: float
    kl: float


@dataclass(frozen=True)
class AblationResult:
    """Predictions of one input before and after the ablation. For a sweep, ``after`` and the
    deltas are the largest drop's channel's; ``ranking`` holds every channel, largest drop first.
    """

    input: str
    layer: str
    channels: list[int]
    mode: str
    target: int
    target_label: str | None
    before: list[Top] | None  # None: the logits held NaN or Inf
    after: list[Top] | None
    delta_logit: float
    delta_prob: float
    kl: float
    ranking: list[ChannelDrop] | None = None

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)  # nested Top and ChannelDrop become dicts too
        if self.ranking is None:
            del row["ranking"]
        return row


@dataclass(frozen=True)
class AblateReport(Merges):
    """What :class:`AblateProbe` returns: one result per input, in input order (a merge
    puts this report's first)."""

    results: list[AblationResult] = state("cat")

    def to_dict(self) -> dict[str, Any]:
        return {"results": [r.to_dict() for r in self.results]}


def one_layer(layers: Sequence[str]) -> str:
    """The one layer a run changes, from a repeatable option (HookscopeError: several named)."""
    named = list(dict.fromkeys(layers))
    if len(named) != 1:
        raise HookscopeError(f"{param('layer')} is given {len(named)} times ({', '.join(named)});"
                             " ablate changes one layer per run: run it once per layer.")
    return named[0]


def _top(logits: torch.Tensor, labels: Sequence[str] | None) -> list[Top] | None:
    """The top-5 of one row of logits; None when it holds NaN or Inf."""
    found = top_predictions(logits, labels)[0]
    if found is None:
        return None
    return [Top(p.index, p.label, p.prob, float(logits[0, p.index])) for p in found]


def _kl(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """KL(before || after) per row, from logits."""
    lp = torch.log_softmax(before.double(), dim=1)
    lq = torch.log_softmax(after.double(), dim=1)
    return (lp.exp() * (lp - lq)).sum(dim=1)


class AblateProbe(Probe[AblateReport]):
    """Each batch runs twice: as it is, then with the chosen channels of ``layer`` changed (with
    ``sweep``, per channel, ``sweep_batch`` rows a pass). Arguments as :func:`ablate`'s and
    :func:`sweep`'s."""

    def __init__(self, model: nn.Module, layer: str, *,
                 channels: str | Sequence[int] | None = None, mode: str | Mode = "zero",
                 target: Targets | str | None = None, seed: int = 0, channel_dim: int = 1,
                 call: int | None = None, categories: Sequence[str] | None = None,
                 names: Sequence[str] | None = None, sweep: bool = False,
                 sweep_batch: int = 32, n_inputs: int | None = None,
                 output_key: str | None = None) -> None:
        at_least_one("sweep_batch", sweep_batch)
        self.mode = parse_mode(mode)
        self.targets = target if isinstance(target, Targets) else parse_targets(target, categories)
        self.site = find_site(model, layer)
        self.sites = [self.site]
        self.channel_spec, self.channel_dim, self.call = channels, channel_dim, call
        self.categories, self.names = categories, names
        self.sweep, self.sweep_batch, self.n_inputs = sweep, sweep_batch, n_inputs
        self.output_key = output_key
        if n_inputs is not None:
            self.targets.check_count(n_inputs)
        self.counts_progress = sweep  # a sweep counts channels, not inputs
        self.generator = torch.Generator(device=model_device(model))
        self.generator.manual_seed(seed)
        #: The channels the running pass changes (None: none), one per row with ``per_row``.
        self.changing: list[int] | None = None
        self.per_row = False
        self.seen = 0
        #: Whether the model runs one input expanded at the layer (see Step.forward_expanded).
        self.expand_ok: dict[str, bool] = {}
        self.shape: list[int] | None = None
        self.chosen: list[int] | None = None
        self.results: list[AblationResult] = []

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> Any:
        if self.call is not None and call.index != self.call:
            return None
        if not isinstance(output, torch.Tensor):
            raise HookscopeError(f"{call.name} returns {type(output).__name__}, not a tensor; "
                                 "choose a layer whose output is one tensor.")
        if self.shape is None:
            self.shape = list(output.shape)
        if self.changing is None:
            return None
        self.seen += 1
        return self._modified(output, self.changing)

    def _modified(self, out: torch.Tensor, channels: list[int]) -> torch.Tensor:
        """A copy of ``out`` with ``channels`` changed in every row, or one channel per row
        (one input becoming a row per channel from here)."""
        if self.per_row:
            return channel_per_row(out, channels, self.channel_dim,
                                   lambda x: self._apply(x, spatial_from=1))
        new = out.movedim(self.channel_dim, 1).clone()
        cols = torch.tensor(channels, device=out.device)
        new[:, cols] = self._apply(new[:, cols], spatial_from=2)
        return new.movedim(1, self.channel_dim)

    def _apply(self, x: torch.Tensor, spatial_from: int) -> torch.Tensor:
        kind, value = self.mode.kind, self.mode.value
        if kind == "zero":
            return torch.zeros_like(x)
        if kind == "mean":
            return x.mean(dim=tuple(range(spatial_from, x.dim())), keepdim=True).expand_as(x)
        assert value is not None  # parse_mode gives scale and noise a value
        if kind == "scale":
            return x * value
        noise = torch.randn(x.shape, generator=self.generator, device=x.device, dtype=x.dtype)
        return x + noise * value

    def _channels(self) -> list[int]:
        """The channels to change, checked against the layer's output (first batch)."""
        if self.chosen is not None:
            return self.chosen
        layer, shape, dim = self.site.name, self.shape, self.channel_dim
        if shape is None:
            which = f"call {self.call} of " if self.call is not None else ""
            raise HookscopeError(f"{which}{layer} never ran in the forward pass; nothing was changed.")
        ndim = len(shape)
        if ndim < 2 or not -ndim < dim < ndim or dim == 0:
            raise HookscopeError(f"{layer}: output shape {shape} has no channel dimension {dim} "
                                 f"(see {param('channel_dim')}).")
        if self.mode.kind == "mean" and len(shape) < 3:
            raise HookscopeError(f"{param('mode')} mean replaces a channel with its spatial mean, but "
                                 f"{layer}'s output {shape} has no spatial dimensions; use zero, "
                                 "noise or scale.")
        self.chosen = parse_channels(self.channel_spec, shape[dim])
        return self.chosen

    def _logits(self, output: Any) -> torch.Tensor:
        return class_logits(output, self.output_key, "ablate").float()

    def _changed(self, step: Step, x: torch.Tensor, channels: list[int],
                 per_row: bool = False) -> torch.Tensor:
        """The logits of one pass with ``channels`` changed; with ``per_row``, ``x`` is one input
        that becomes a row per channel at the layer (see :meth:`Step.forward_expanded`)."""
        self.changing, self.per_row, self.seen = channels, per_row, 0
        try:
            if not per_row:
                after = self._logits(step.forward(x))
            else:
                after = self._logits(step.forward_expanded(
                    x, len(channels), lambda out: int(self._logits(out).shape[0]),
                    self.expand_ok, self.site.name))
        finally:
            self.changing = None
        if self.seen == 0:
            raise HookscopeError(f"call {self.call} of {self.site.name} never ran in the forward "
                                 "pass; nothing was changed.")
        return after

    def step(self, step: Step) -> None:
        before = self._logits(step.forward())
        chosen = self._channels()
        classes = self.targets.resolve(before, step.start)
        items = step.batch.items if step.batch is not None else None
        names = [items[i].name if items else self.names[step.start + i] if self.names
                 else f"input[{step.start + i}]" for i in range(len(step))]
        if self.sweep:
            for i, name in enumerate(names):
                self.results.append(self._sweep_one(step, i, name, before[i:i + 1], classes[i]))
            return
        after = self._changed(step, step.x, chosen)
        for i, name in enumerate(names):
            self.results.append(self._result(name, classes[i], before[i:i + 1], after[i:i + 1]))

    def _sweep_one(self, step: Step, i: int, name: str, before: torch.Tensor,
                   cls: int) -> AblationResult:
        chosen = self._channels()
        if step.index == 0 and i == 0:
            step.expect((self.n_inputs or len(step)) * len(chosen))
        afters = []
        for lo in range(0, len(chosen), self.sweep_batch):
            part = chosen[lo:lo + self.sweep_batch]
            # What runs before the layer runs once per pass, on the one input.
            afters.append(self._changed(step, take(step.x, slice(i, i + 1)), part, per_row=True))
            step.advance(len(part))
        after = torch.cat(afters)
        drops = (before[0, cls] - after[:, cls]).tolist()
        dprob = torch.softmax(after, 1)[:, cls] - torch.softmax(before, 1)[0, cls]
        kls = _kl(before.expand_as(after), after).tolist()
        drops_by_channel = map(ChannelDrop, chosen, drops, dprob.tolist(), kls)
        ranking = sorted(drops_by_channel,
                         key=lambda r: (-r.drop if math.isfinite(r.drop) else math.inf, r.channel))
        best = chosen.index(ranking[0].channel)
        return self._result(name, cls, before, after[best:best + 1], ranking)

    def _result(self, name: str, target: int, before: torch.Tensor, after: torch.Tensor,
                ranking: list[ChannelDrop] | None = None) -> AblationResult:
        pb, pa = torch.softmax(before, 1), torch.softmax(after, 1)
        cats = self.categories
        labels = cats if cats is not None and len(cats) == before.shape[1] else None
        return AblationResult(
            input=name, layer=self.site.name, channels=list(self._channels()),
            mode=self.mode.text, target=target, target_label=labels[target] if labels else None,
            before=_top(before, labels), after=_top(after, labels),
            delta_logit=float(after[0, target] - before[0, target]),
            delta_prob=float(pa[0, target] - pb[0, target]),
            kl=float(_kl(before, after)[0]), ranking=ranking)

    def finish(self) -> AblateReport:
        return AblateReport(self.results)


def ablate(model: nn.Module, x: torch.Tensor, layer: str, **options: Any) -> list[AblationResult]:
    """Run ``x`` (a batch or an iterable of batches) with and without the chosen channels of
    ``layer`` changed; ``model`` is a classifier, left in the state it was in.

    Args:
        options: :class:`AblateProbe`'s: ``channels`` (``0,5,7``, ``0-15``, ``all`` or a list;
            default: all channels), ``mode`` (``zero``, ``mean``: the spatial mean,
            ``noise:SIGMA``: added, or ``scale:F``), ``target`` (the class compared, default
            ``top1`` before the ablation; one for all inputs or a comma list, one per input),
            ``call`` (only change this call of a module run several times; default: every
            call), ``output_key`` (the entry of a dict or tuple output holding the logits),
            ``seed``, ``channel_dim``, ``categories`` and ``names``.
    """
    return drive(model, x, AblateProbe(model, layer, **options)).results


def sweep(model: nn.Module, x: torch.Tensor, layer: str, *, batch: int = 32,
          on_step: Callable[[int], None] | None = None, **options: Any) -> list[AblationResult]:
    """Ablate each channel alone and rank channels by how much the target logit drops.

    ``batch`` channels run per forward pass; ``options`` are those of :func:`ablate`;
    ``on_step`` is called with the number of channels done after each pass.
    """
    probe = AblateProbe(model, layer, sweep=True, sweep_batch=batch, **options)
    return drive(model, x, probe, progress=on_step).results
