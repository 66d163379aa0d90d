"""Percentiles from a fixed-memory sketch whose merge does not depend on how data was split.

The sketch of a set of values is a histogram of ``BUCKETS`` (512) equal buckets on a dyadic
grid chosen from the set's exact finite min and max alone: bucket ``i`` holds the values in
``[(offset + i) * 2**e, (offset + i + 1) * 2**e)``, where ``e`` is the smallest integer
(at least ``exponent(max|x|) - 50``) for which ``BUCKETS`` buckets cover ``[min, max]``, and
``offset = floor(min / 2**e)``. Exact zeros are counted apart, non-finite values are left
out (they are counted by the moments). The bucket of a value is ``floor(x * 2**-e)``:
exact in float64, since scaling by a power of two is.

Merging is exact and split-independent: dyadic grids nest, so the merge recomputes ``e``
and ``offset`` from the union's min and max (exact) and moves each bucket of either side
whole into the coarser bucket holding it, then adds counts. The result is the very
histogram the union would have got at once, so any split of the data into batches,
DataLoader workers or ranks, merged in any order, gives identical sketches.

Error bound: ``e`` is the smallest that fits, so ``2**(e-1)`` did not: the range exceeds
``(BUCKETS - 1) * 2**(e-1)``, and a bucket is narrower than ``2 * range / (BUCKETS - 1)``,
0.39% of the range. A percentile (``torch.quantile``'s linear interpolation between order
statistics) is estimated from the bucket holding each of the two order statistics, spread
evenly over the bucket clamped to ``[min, max]``, so each estimate is within one bucket of
the order statistic, and so is their interpolation: the error is below
``max(2 * range / (BUCKETS - 1), 2**-49 * max|x|)``. The second term only matters for
float64 data whose spread is below ~1e-13 of its magnitude; float32, float16 and bfloat16
values that differ do so by at least ``2**-24`` of their magnitude. Exact zeros, the
minimum (0th percentile), the maximum (100th) and constant data are exact.

Memory: ``BUCKETS`` int64 counts, 4 KiB per sketch (per channel with ``per_channel``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from decimal import Decimal

import torch

from hookscope.channels import ChannelView, scratch
from hookscope.errors import HookscopeError, param

__all__ = ["BUCKETS", "Sketch", "finite_range", "parse_percentiles", "percentile_key"]

#: Buckets per sketch: the bound 2 / (BUCKETS - 1) of the range must stay under 0.5%.
BUCKETS = 512
#: The grid is never finer than 2**-FLOOR_BITS of the largest magnitude, so that bucket
#: indices stay exact integers in float64 and int64.
_FLOOR_BITS = 50
#: Lowest grid exponent (2**-e must be a normal float64), also that of an empty sketch.
_E_MIN = -1000
_SHIFT_MAX = 62
#: Integers below this are exact in float32 (with a bit to spare for the subtraction).
_EXACT32 = float(1 << 23)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """Exactly ``2.0 ** e`` for int64 ``e`` in [-1022, 1023], from the float64 bit pattern."""
    return ((e + 1023) << 52).view(torch.float64)


def _fits(lo: torch.Tensor, hi: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    scale = pow2(-e)
    return (hi * scale).floor() - (lo * scale).floor() <= BUCKETS - 1


def grid(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid exponent and offset for each channel's exact ``[lo, hi]`` (int64 tensors).

    A function of ``lo`` and ``hi`` alone (the starting guess from ``log2`` only saves
    steps), monotonic as the range grows: the property exact merging rests on.
    """
    empty = ~(lo <= hi)
    lo0, hi0 = torch.where(empty, 0.0, lo), torch.where(empty, 0.0, hi)
    mag = torch.maximum(lo0.abs(), hi0.abs())
    floor = (torch.frexp(mag).exponent.long() - _FLOOR_BITS).clamp(min=_E_MIN)
    half = hi0 * 0.5 - lo0 * 0.5  # the range halved, which cannot overflow
    guess = torch.log2(half / (BUCKETS - 1)).ceil().nan_to_num(0, 2000, -2000).long() + 1 - 2
    e = torch.where(half > 0, torch.maximum(guess, floor), floor)
    for _ in range(6):  # the smallest e >= the guess at which the range fits
        e = torch.where(_fits(lo0, hi0, e), e, e + 1)
    e = torch.where(empty, _E_MIN, e)
    offset = (lo0 * pow2(-e)).floor().long()
    return e, torch.where(empty, 0, offset)


@dataclass
class Sketch:
    """Percentile sketches of ``C`` channels (``C = 1`` for a whole output).

    Attributes:
        exponent: ``(C,)`` int64: the buckets are ``2**exponent`` wide.
        offset: ``(C,)`` int64: the grid index of bucket 0.
        counts: ``(C, BUCKETS)`` int64: non-zero finite values per bucket.
        zeros: ``(C,)`` int64: exact zeros.
        min, max: ``(C,)`` float64: the finite range (+inf and -inf when empty).
    """

    exponent: torch.Tensor
    offset: torch.Tensor
    counts: torch.Tensor
    zeros: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor

    @classmethod
    def of(cls, view: ChannelView, lo: torch.Tensor, hi: torch.Tensor, zeros: torch.Tensor, *,
           nonfinite: bool = True) -> Sketch:
        """The sketch of each channel of ``view``, given its exact finite range ``[lo, hi]``
        and its count of exact zeros.

        Args:
            nonfinite: the view may hold NaN or Inf (False skips their masking).
        """
        e, offset = grid(lo, hi)
        slots = view.channels * BUCKETS  # one more: the dump for non-finite values
        acc = torch.zeros(slots + 1, dtype=torch.int64, device=lo.device)
        # Each value's slot: channel * BUCKETS + floor(x * 2**-e) - offset, with the scale
        # and the start of each row (or column) of the view.
        start = (offset - torch.arange(view.channels, device=lo.device) * BUCKETS)[view.ids]
        scale = pow2(-e)[view.ids]
        fast = view.blocked and not nonfinite and view.matrix.dtype == torch.float32 and \
            slots < _EXACT32 and _exact_in_float32(lo, hi, e, offset)
        if fast:
            scale, start = scale.float(), start.float()
        else:
            start = start.double()
        ones = torch.ones(1, dtype=torch.int64, device=lo.device)
        for block, at in view.blocks():
            index = _bucket(block, scale[at].unsqueeze(view.dim), start[at].unsqueeze(view.dim),
                            dump=slots if nonfinite else None)
            acc.index_add_(0, index.reshape(-1), ones.expand(index.numel()))
        counts = acc[:slots].view(view.channels, BUCKETS)
        # Zeros went to the bucket starting at 0 with the small positive values: move them out.
        counts.scatter_add_(1, (-offset).clamp(0, BUCKETS - 1).unsqueeze(1), -zeros.unsqueeze(1))
        return cls(e, offset, counts, zeros.clone(), lo.double(), hi.double())

    @property
    def channels(self) -> int:
        return int(self.zeros.numel())

    def to(self, device: torch.device | str) -> Sketch:
        return Sketch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def identical(self, other: Sketch) -> bool:
        """Every field equal, bit for bit."""
        return all(torch.equal(getattr(self, f.name), getattr(other, f.name))
                   for f in fields(self))

    def _rebin(self, e: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        """The counts on the coarser (or same) grid ``(e, offset)``: each bucket moves whole."""
        shift = (e - self.exponent).clamp(0, _SHIFT_MAX).unsqueeze(1)
        index = self.offset.unsqueeze(1) + torch.arange(BUCKETS, device=self.counts.device)
        local = ((index >> shift) - offset.unsqueeze(1)).clamp_(0, BUCKETS - 1)
        return torch.zeros_like(self.counts).scatter_add_(1, local, self.counts)

    def merge(self, other: Sketch) -> Sketch:
        """The sketch of both sides' values: exactly that of their union (a new object).

        Raises:
            HookscopeError: the two hold different numbers of channels.
        """
        if other.channels != self.channels:
            raise HookscopeError(
                f"Percentile sketches of {self.channels} and {other.channels} channels cannot "
                f"be merged: one call's output changed its channel count between batches.")
        lo, hi = torch.minimum(self.min, other.min), torch.maximum(self.max, other.max)
        e, offset = grid(lo, hi)
        counts = self._rebin(e, offset) + other._rebin(e, offset)
        return Sketch(e, offset, counts, self.zeros + other.zeros, lo, hi)

    def collapse(self) -> Sketch:
        """One sketch of all channels' values together (exactly the whole output's sketch)."""
        lo, hi = self.min.amin().reshape(1), self.max.amax().reshape(1)
        e, offset = grid(lo, hi)
        shift = (e - self.exponent).clamp(0, _SHIFT_MAX).unsqueeze(1)
        index = self.offset.unsqueeze(1) + torch.arange(BUCKETS, device=self.counts.device)
        local = ((index >> shift) - offset).clamp_(0, BUCKETS - 1)
        counts = torch.zeros(BUCKETS, dtype=torch.int64, device=self.counts.device)
        counts.scatter_add_(0, local.reshape(-1), self.counts.reshape(-1))
        return Sketch(e, offset, counts.unsqueeze(0), self.zeros.sum().reshape(1), lo, hi)

    def quantiles(self, percentiles: Sequence[float]) -> torch.Tensor:
        """``(C, P)`` float64: each percentile (0 to 100) as ``torch.quantile``'s default
        linear interpolation would give it, within the documented error; NaN when empty."""
        n = self.counts.sum(1) + self.zeros
        last = (n - 1).clamp(min=0).unsqueeze(1)
        q = torch.tensor(list(percentiles), dtype=torch.float64, device=n.device) / 100
        pos = q.unsqueeze(0) * last.double()
        below = pos.floor()
        ranks = torch.cat([below.long(), torch.minimum(below.long() + 1, last)], dim=1)
        low, high = self._order_stats(ranks).split(len(q), dim=1)
        value = torch.lerp(low, high, pos - below)
        return torch.where(n.unsqueeze(1) > 0, value, math.nan)

    def _order_stats(self, ranks: torch.Tensor) -> torch.Tensor:
        """The estimated values of the given 0-based order statistics, per channel."""
        cum = self.counts.cumsum(1)
        # The negative values are those in the buckets below the one starting at 0.
        last_negative = (-self.offset - 1).unsqueeze(1)
        negative = torch.where(last_negative < 0, 0,
                               cum.gather(1, last_negative.clamp(0, BUCKETS - 1)))
        zeros = self.zeros.unsqueeze(1)
        is_zero = (ranks >= negative) & (ranks < negative + zeros)
        ranks = torch.where(ranks >= negative + zeros, ranks - zeros, ranks)
        bucket = torch.searchsorted(cum, ranks, right=True).clamp_(max=BUCKETS - 1)
        count = self.counts.gather(1, bucket)
        before = cum.gather(1, bucket) - count
        width = pow2(self.exponent).unsqueeze(1)
        lo = (self.offset.unsqueeze(1) + bucket).double() * width
        lo, hi = lo.clamp(min=self.min.unsqueeze(1)), (lo + width).clamp(max=self.max.unsqueeze(1))
        # A lone value in the bucket holding the minimum (or maximum) is that value.
        alone = torch.where(lo == self.min.unsqueeze(1), 0.0,
                            torch.where(hi == self.max.unsqueeze(1), 1.0, 0.5))
        t = torch.where(count > 1, (ranks - before).double() / (count - 1).clamp(min=1), alone)
        return torch.where(is_zero, 0.0, lo + t * (hi - lo))


def _exact_in_float32(lo: torch.Tensor, hi: torch.Tensor, e: torch.Tensor,
                      offset: torch.Tensor) -> bool:
    """Whether float32 arithmetic gives every bucket exactly: ``2**-e`` is at least 1 (so
    nothing underflows) and a normal float32, and all indices stay below 2**23."""
    has = lo <= hi
    mag = torch.maximum(lo.abs(), hi.abs()) * pow2(-e)
    ok = (e <= 0) & (e >= -126) & (mag < _EXACT32) & (offset.abs() < _EXACT32)
    return bool((ok | ~has).all())


def _bucket(block: torch.Tensor, scale: torch.Tensor, start: torch.Tensor, *,
            dump: int | None) -> torch.Tensor:
    """Each value's slot, ``floor(x * scale) - start``, with ``scale`` (a power of two) and
    ``start`` broadcast along rows or columns; non-finite values go to ``dump``.

    In float32 and int32 when ``scale`` is float32 (exact where :func:`_exact_in_float32`
    says so), ~3x faster; otherwise in float64 and int64.
    """
    on_cpu = block.device.type == "cpu"
    if scale.dtype == torch.float32:
        y = torch.mul(block, scale, out=scratch(block.numel(), torch.float32).view(block.shape))
        y.floor_().sub_(start)
        return y.view(torch.int32).copy_(y)  # converted in place, element by element
    y = scratch(block.numel(), torch.float64).view(block.shape) if on_cpu else \
        torch.empty(block.shape, dtype=torch.float64, device=block.device)
    torch.mul(block, scale, out=y)
    y.floor_().sub_(start)
    if dump is not None:
        y.masked_fill_(~torch.isfinite(block), dump)
    if not on_cpu:
        return y.long()
    return scratch(block.numel(), torch.int64).view(block.shape).copy_(y)


def finite_range(view: ChannelView) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """Each channel's finite min and max (float64; +inf and -inf when it has none), its
    exact zeros, and whether a non-finite value may be present (always True off the CPU)."""
    c, device, dim = view.channels, view.matrix.device, view.dim
    lo = torch.full((c,), math.inf, dtype=torch.float64, device=device)
    hi = torch.full((c,), -math.inf, dtype=torch.float64, device=device)
    zeros = torch.zeros(c, dtype=torch.int64, device=device)
    blocks = list(view.blocks())
    if not blocks:
        return lo, hi, zeros, False
    if view.blocked:  # unchecked first, as in ChannelMoments.of: few small operations
        parts = [(b.amin(dim), b.amax(dim), b.shape[dim] - torch.ne(
            b, 0, out=scratch(b.numel(), b.dtype).view(b.shape)).sum(dim), view.ids[at])
            for b, at in blocks]
        b_lo, b_hi, b_zeros, ids = (torch.cat(p) for p in zip(*parts, strict=True))
        if bool(torch.cat([b_lo, b_hi]).isfinite().all()):
            return (lo.scatter_reduce_(0, ids, b_lo.double(), "amin"),
                    hi.scatter_reduce_(0, ids, b_hi.double(), "amax"),
                    zeros.index_add_(0, ids, b_zeros.round().long()), False)
    for block, at in blocks:
        ids = view.ids[at]
        finite = torch.isfinite(block)
        inf = torch.tensor(math.inf, dtype=block.dtype, device=device)
        lo.scatter_reduce_(0, ids, torch.where(finite, block, inf).amin(dim).double(), "amin")
        hi.scatter_reduce_(0, ids, torch.where(finite, block, -inf).amax(dim).double(), "amax")
        zeros.index_add_(0, ids, (block == 0).sum(dim))
    return lo, hi, zeros, True


# ----------------------------------------------------------------------------- options


def percentile_key(p: float) -> str:
    """The JSON key of a percentile: its shortest decimal form (``99.9``, ``50``, ``0.001``)."""
    text = format(Decimal(repr(float(p))).normalize(), "f")
    return "0" if text in ("-0", "0") else text


def parse_percentiles(value: str | Sequence[float] | None) -> tuple[float, ...]:
    """Percentiles from ``"0.1,99.9"`` or a sequence of numbers: each in [0, 100], in the
    order given, duplicates dropped (``99.9`` and ``99.90`` are one). None or an empty
    sequence: none.

    Raises:
        HookscopeError: an empty string, not a number, or outside [0, 100].
    """
    if value is None or (not isinstance(value, str) and len(value) == 0):
        return ()
    hint = "give numbers from 0 to 100 separated by commas, e.g. 0.1,99.9,99.99."
    if isinstance(value, str) and not value.strip():
        raise HookscopeError(f"{param('percentiles')} is empty; {hint}")
    items = value.split(",") if isinstance(value, str) else list(value)
    found: dict[str, float] = {}
    for item in items:
        try:
            p = float(item.strip() if isinstance(item, str) else item)
        except (TypeError, ValueError):
            raise HookscopeError(f"{param('percentiles')}: {str(item).strip()!r} is not a "
                                 f"number; {hint}") from None
        if not 0.0 <= p <= 100.0:
            raise HookscopeError(f"{param('percentiles')}: {str(item).strip()!r} is outside "
                                 f"[0, 100]; {hint}")
        found.setdefault(percentile_key(p), p)
    return tuple(found.values())
