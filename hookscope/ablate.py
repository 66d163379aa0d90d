"""Feature modification: change chosen channels of one layer's output and compare predictions.

A forward hook (through :class:`Tracer`) returns a modified copy of the layer's output, so
the module and anything that shares its output tensor are left alone.

``sweep`` ablates each channel alone, batched: one input is repeated ``batch`` times and
batch element ``i`` has its own channel ablated, so a sweep over C channels costs about
``C / batch`` batched forward passes, not C single ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from hookscope.errors import HookscopeError
from hookscope.hooks import Call, Site, Tracer, find_site, model_device
from hookscope.targets import Targets, parse_targets

__all__ = [
    "AblationResult",
    "ChannelDrop",
    "Mode",
    "Top",
    "ablate",
    "parse_channels",
    "parse_mode",
    "sweep",
]

MODES = ("zero", "mean", "noise", "scale")


@dataclass(frozen=True)
class Mode:
    """How chosen channels change: ``zero``, ``mean``, ``noise`` (std) or ``scale`` (factor)."""

    kind: str
    value: float | None = None

    @property
    def text(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value:g}"


def parse_mode(spec: str | Mode) -> Mode:
    """Parse ``zero``, ``mean``, ``noise:SIGMA`` or ``scale:F``.

    Raises:
        HookscopeError: an unknown mode or a bad number.
    """
    if isinstance(spec, Mode):
        return spec
    text = spec.strip().lower()
    kind, _, arg = text.partition(":")
    usage = "use zero, mean, noise:SIGMA or scale:F"
    if kind not in MODES:
        raise HookscopeError(f"--mode {spec!r} is not a mode; {usage}.")
    if kind in ("zero", "mean"):
        if arg:
            raise HookscopeError(f"--mode {spec!r}: {kind} takes no value; {usage}.")
        return Mode(kind)
    if not arg:
        raise HookscopeError(f"--mode {spec!r}: {kind} needs a value, e.g. {kind}:0.5.")
    try:
        value = float(arg)
    except ValueError:
        raise HookscopeError(f"--mode {spec!r}: {arg!r} is not a number.") from None
    if not math.isfinite(value) or (kind == "noise" and value < 0):
        raise HookscopeError(f"--mode {spec!r}: the value must be finite"
                             f"{' and not negative' if kind == 'noise' else ''}.")
    return Mode(kind, value)


def parse_channels(spec: str | Sequence[int] | None, count: int) -> list[int]:
    """Parse ``0,5,7``, ranges such as ``0-15``, or ``all``; check against ``count``.

    Raises:
        HookscopeError: a malformed entry, a duplicate or a channel out of range.
    """
    if spec is None:
        return list(range(count))
    if not isinstance(spec, str):
        chosen = [int(c) for c in spec]
    elif spec.strip().lower() == "all":
        return list(range(count))
    else:
        chosen = []
        for raw in spec.split(","):
            item = raw.strip()
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
            if not m:
                raise HookscopeError(
                    f"--channels {spec!r}: {item!r} is not a channel number or a range A-B."
                )
            lo, hi = int(m[1]), int(m[2] or m[1])
            if hi < lo:
                raise HookscopeError(f"--channels {spec!r}: the range {item} is empty.")
            chosen.extend(range(lo, hi + 1))
    if not chosen:
        raise HookscopeError("--channels lists no channel.")
    bad = [c for c in chosen if not 0 <= c < count]
    if bad:
        raise HookscopeError(
            f"--channels: channel {bad[0]} is out of range; the layer has {count} channels "
            f"(0 to {count - 1})."
        )
    if len(set(chosen)) != len(chosen):
        raise HookscopeError("--channels lists a channel twice.")
    return chosen


@dataclass(frozen=True)
class Top:
    """One of the top predictions."""

    index: int
    label: str | None
    prob: float
    logit: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ChannelDrop:
    """One channel of a sweep: how much the target logit dropped when it alone was ablated."""

    channel: int
    drop: float
    delta_prob: float
    kl: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AblationResult:
    """Predictions of one input before and after the ablation.

    For a sweep, ``after`` and the deltas are those of the channel with the largest drop,
    and ``ranking`` holds every channel, largest drop first.
    """

    input: str
    layer: str
    channels: list[int]
    mode: str
    target: int
    target_label: str | None
    before: list[Top]
    after: list[Top]
    delta_logit: float
    delta_prob: float
    kl: float
    ranking: list[ChannelDrop] | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        row = {
            "input": self.input,
            "layer": self.layer,
            "channels": list(self.channels),
            "mode": self.mode,
            "target": self.target,
            "target_label": self.target_label,
            "before": [t.to_dict() for t in self.before],
            "after": [t.to_dict() for t in self.after],
            "delta_logit": self.delta_logit,
            "delta_prob": self.delta_prob,
            "kl": self.kl,
        }
        if self.ranking is not None:
            row["ranking"] = [r.to_dict() for r in self.ranking]
        return row


# ---------------------------------------------------------------------------- the hook


class _Modifier:
    """Forward-hook callback: returns the layer output with chosen channels changed.

    ``plan`` is either a list of channels applied to every batch element, or (for sweeps)
    a list with one channel per batch element.
    """

    def __init__(self, mode: Mode, channel_dim: int, call: int | None,
                 generator: torch.Generator | None) -> None:
        self.mode = mode
        self.dim = channel_dim
        self.call = call
        self.generator = generator
        self.channels: list[int] = []
        self.per_row = False
        self.layer = ""
        self.seen = 0

    def _check(self, out: Any, name: str) -> torch.Tensor:
        if not isinstance(out, torch.Tensor):
            raise HookscopeError(
                f"{name} returns {type(out).__name__}, not a tensor; choose a layer whose "
                "output is one tensor."
            )
        if not _has_dim(out.dim(), self.dim):
            raise HookscopeError(
                f"{name}: output shape {list(out.shape)} has no channel dimension {self.dim}."
            )
        if self.mode.kind == "mean" and out.dim() < 3:
            raise HookscopeError(
                f"--mode mean replaces a channel with its spatial mean, but {name}'s output "
                f"{list(out.shape)} has no spatial dimensions; use zero, noise or scale."
            )
        return out

    def __call__(self, call: Call, args: Any, kwargs: Any, output: Any) -> Any:
        if self.call is not None and call.index != self.call:
            return None
        out = self._check(output, call.name)
        self.seen += 1
        moved = out.movedim(self.dim, 1)
        new = moved.clone()
        if self.per_row:
            rows = torch.arange(len(self.channels), device=out.device)
            cols = torch.tensor(self.channels, device=out.device)
            new[rows, cols] = self._apply(moved[rows, cols], spatial_from=1)
        else:
            cols = torch.tensor(self.channels, device=out.device)
            new[:, cols] = self._apply(moved[:, cols], spatial_from=2)
        return new.movedim(1, self.dim)

    def _apply(self, x: torch.Tensor, spatial_from: int) -> torch.Tensor:
        kind, value = self.mode.kind, self.mode.value
        if kind == "zero":
            return torch.zeros_like(x)
        if kind == "mean":
            dims = tuple(range(spatial_from, x.dim()))
            return x.mean(dim=dims, keepdim=True).expand_as(x)
        if value is None:  # parse_mode gives scale and noise a value
            raise HookscopeError(f"--mode {kind} needs a value, e.g. {kind}:0.5.")
        if kind == "scale":
            return x * value
        noise = torch.randn(x.shape, generator=self.generator, device=x.device, dtype=x.dtype)
        return x + noise * value


def channel_count(model: nn.Module, x: torch.Tensor, name: str, channel_dim: int) -> int:
    """Channels of the layer's output, from one forward pass on the first input."""
    return _plain_run(model, x[:1], name, channel_dim)[1]


def _plain_run(
    model: nn.Module, x: torch.Tensor, name: str, channel_dim: int
) -> tuple[Any, int]:
    """The unmodified forward pass (the model's output) and the layer's channel count."""
    site = find_site(model, name)
    x = x.to(model_device(model))
    shapes: list[list[int]] = []

    def grab(call: Call, args: Any, kwargs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and not shapes:
            shapes.append(list(output.shape))

    with torch.inference_mode(), Tracer(model, [site], on_exit=grab) as tracer:
        try:
            output = model(x)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise tracer.forward_error(exc) from exc
    if not shapes:
        raise HookscopeError(f"{name} did not run, or returned no tensor, in a forward pass.")
    shape = shapes[0]
    if not _has_dim(len(shape), channel_dim):
        raise HookscopeError(
            f"{name}: output shape {shape} has no channel dimension {channel_dim}."
        )
    return output, shape[channel_dim]


def _has_dim(ndim: int, dim: int) -> bool:
    """Whether ``dim`` is a valid, non-batch dimension of an ``ndim``-dimensional output."""
    return ndim >= 2 and -ndim <= dim < ndim and dim not in (0, -ndim)


def _logits(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor) and output.dim() == 2:
        return output.float()
    raise HookscopeError(
        "ablate needs a classifier whose output is (N, classes) logits; the model returned "
        f"{type(output).__name__}{list(output.shape) if isinstance(output, torch.Tensor) else ''}."
    )


def _top(logits: torch.Tensor, categories: Sequence[str] | None, k: int = 5) -> list[list[Top]]:
    probs = torch.softmax(logits, dim=1)
    values, indices = probs.topk(min(k, probs.shape[1]), dim=1)
    labels = categories if categories is not None and len(categories) == probs.shape[1] else None
    return [
        [Top(int(i), labels[int(i)] if labels else None, float(p), float(logits[row, int(i)]))
         for p, i in zip(values[row].tolist(), indices[row].tolist(), strict=True)]
        for row in range(logits.shape[0])
    ]


def _kl(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """KL(before || after) per row, from logits."""
    lp = torch.log_softmax(before.double(), dim=1)
    lq = torch.log_softmax(after.double(), dim=1)
    return (lp.exp() * (lp - lq)).sum(dim=1)


def _run(model: nn.Module, x: torch.Tensor, tracer: Tracer | None = None) -> torch.Tensor:
    if tracer is not None:
        tracer.reset()
    try:
        return _logits(model(x))
    except HookscopeError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        if tracer is not None:
            raise tracer.forward_error(exc) from exc
        raise HookscopeError(f"The forward pass failed: {exc}") from exc


def _generator(device: torch.device, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


@dataclass
class _Prepared:
    """What ablate and sweep share: parsed options, the plain run and the hook callback."""

    mode: Mode
    targets: Targets
    site: Site
    x: torch.Tensor
    before: torch.Tensor
    chosen: list[int]
    modifier: _Modifier


def _prepare(model: nn.Module, x: torch.Tensor, layer: str, *,
             channels: str | Sequence[int] | None, mode: str | Mode,
             target: Targets | str | None, seed: int, channel_dim: int, call: int | None,
             categories: Sequence[str] | None) -> _Prepared:
    parsed = parse_mode(mode)
    targets = parse_targets(target, categories) if isinstance(target, str) or target is None \
        else target
    site = find_site(model, layer)
    device = model_device(model)
    x = x.to(device)
    output, count = _plain_run(model, x, layer, channel_dim)
    chosen = parse_channels(channels, count)
    modifier = _Modifier(parsed, channel_dim, call, _generator(device, seed))
    return _Prepared(parsed, targets, site, x, _logits(output), chosen, modifier)


def ablate(
    model: nn.Module,
    x: torch.Tensor,
    layer: str,
    *,
    channels: str | Sequence[int] | None = None,
    mode: str | Mode = "zero",
    target: Targets | str | None = None,
    seed: int = 0,
    channel_dim: int = 1,
    call: int | None = None,
    categories: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    start: int = 0,
) -> list[AblationResult]:
    """Run ``x`` with and without the chosen channels of ``layer`` changed.

    Args:
        model: a classifier returning (N, classes) logits; left in the state it was in.
        x: one batch of inputs.
        layer: the module's dotted name.
        channels: ``0,5,7``, ``0-15``, ``all`` or a list (default: all channels).
        mode: ``zero``, ``mean`` (spatial mean), ``noise:SIGMA`` (added) or ``scale:F``.
        target: the class whose logit and probability are compared (default ``top1``
            before the ablation); one for all inputs or a comma list, one per input.
        seed: seed for ``noise``.
        channel_dim: the output dimension holding channels.
        call: only change this call of a module run several times (default: every call).
        categories: class labels.
        names: input names for the results (default ``input[i]``).
        start: the index of ``x``'s first input among all inputs (per-input targets).

    Raises:
        HookscopeError: unknown layer, bad channels or mode, no classifier output.
    """
    run = _prepare(model, x, layer, channels=channels, mode=mode, target=target, seed=seed,
                   channel_dim=channel_dim, call=call, categories=categories)
    mode, targets, site, x, before, chosen, modifier = (
        run.mode, run.targets, run.site, run.x, run.before, run.chosen, run.modifier)
    modifier.channels = chosen
    with torch.inference_mode():
        with Tracer(model, [site], on_exit=modifier) as tracer:
            after = _run(model, x, tracer)
    _check_seen(modifier, layer, call)
    classes = targets.resolve(before, start)
    return [
        _result(names[i] if names else f"input[{start + i}]", layer, chosen, mode,
                classes[i], before[i:i + 1], after[i:i + 1], categories)
        for i in range(x.shape[0])
    ]


def _check_seen(modifier: _Modifier, layer: str, call: int | None) -> None:
    if modifier.seen == 0:
        which = f"call {call} of " if call is not None else ""
        raise HookscopeError(f"{which}{layer} never ran in the forward pass; nothing was changed.")


def _result(name: str, layer: str, channels: list[int], mode: Mode, target: int,
            before: torch.Tensor, after: torch.Tensor, categories: Sequence[str] | None,
            ranking: list[ChannelDrop] | None = None) -> AblationResult:
    pb, pa = torch.softmax(before, 1), torch.softmax(after, 1)
    labels = categories if categories is not None and len(categories) == before.shape[1] else None
    return AblationResult(
        input=name, layer=layer, channels=list(channels), mode=mode.text, target=target,
        target_label=labels[target] if labels else None,
        before=_top(before, categories)[0], after=_top(after, categories)[0],
        delta_logit=float(after[0, target] - before[0, target]),
        delta_prob=float(pa[0, target] - pb[0, target]),
        kl=float(_kl(before, after)[0]), ranking=ranking,
    )


def sweep(
    model: nn.Module,
    x: torch.Tensor,
    layer: str,
    *,
    channels: str | Sequence[int] | None = None,
    mode: str | Mode = "zero",
    target: Targets | str | None = None,
    batch: int = 32,
    seed: int = 0,
    channel_dim: int = 1,
    call: int | None = None,
    categories: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    start: int = 0,
    on_step: Callable[[int], None] | None = None,
) -> list[AblationResult]:
    """Ablate each channel alone and rank channels by how much the target logit drops.

    Each input is repeated ``batch`` times per forward pass, element ``i`` with its own
    channel changed. Arguments are those of :func:`ablate`; ``on_step`` is called with the
    number of channels done after each forward pass.
    """
    if batch < 1:
        raise HookscopeError(f"--sweep-batch must be at least 1, not {batch}.")
    run = _prepare(model, x, layer, channels=channels, mode=mode, target=target, seed=seed,
                   channel_dim=channel_dim, call=call, categories=categories)
    mode, targets, site, x, befores, chosen, modifier = (
        run.mode, run.targets, run.site, run.x, run.before, run.chosen, run.modifier)
    modifier.per_row = True
    results = []
    with torch.inference_mode():
        classes = targets.resolve(befores, start)
        with Tracer(model, [site], on_exit=modifier) as tracer:
            for i in range(x.shape[0]):
                before, cls = befores[i:i + 1], classes[i]
                # One contiguous copy per input: convolutions are slower on a stride-0 batch.
                repeated = x[i:i + 1].expand(min(batch, len(chosen)), *x.shape[1:]).contiguous()
                afters = []
                for lo in range(0, len(chosen), batch):
                    part = chosen[lo:lo + batch]
                    modifier.channels = part
                    afters.append(_run(model, repeated[:len(part)], tracer))
                    _check_seen(modifier, layer, call)
                    if on_step is not None:
                        on_step(len(part))
                after = torch.cat(afters)
                drops = (before[0, cls] - after[:, cls]).tolist()
                dprob = (torch.softmax(after, 1)[:, cls] - torch.softmax(before, 1)[0, cls])
                kls = _kl(before.expand_as(after), after).tolist()
                ranking = sorted(
                    (ChannelDrop(c, d, p, k)
                     for c, d, p, k in zip(chosen, drops, dprob.tolist(), kls, strict=True)),
                    key=lambda r: (-r.drop if math.isfinite(r.drop) else math.inf, r.channel),
                )
                best = chosen.index(ranking[0].channel)
                results.append(_result(
                    names[i] if names else f"input[{start + i}]", layer, chosen, mode, cls,
                    before, after[best:best + 1], categories, ranking,
                ))
    return results
