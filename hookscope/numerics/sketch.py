"""Percentiles with a relative-error guarantee, from a sketch that merges by addition.

A DDSketch (Masson et al., 2019): the bucket of ``|x| = 2**e * m`` (``1 <= m < 2``) is
``37 * e + floor(37 * log2(m'))``, ``m'`` being ``m`` cut to 10 bits, read from the float's
bits with integer operations and an exactly built table: the same on every CPU and device,
and for a float32 value and its float64 copy. Per channel, a sketch counts negative values,
zeros and positive values per bucket and keeps the exact finite min and max; non-finite
values are left out (the moments count them).

Accuracy: a bucket ``[lo, hi)`` stands for ``2 * lo * hi / (lo + hi)``, within ``ALPHA``
(0.967%) of any value in it. A percentile (``torch.quantile``'s linear interpolation) comes
from its two order statistics' buckets, clamped to ``[min, max]``: within ALPHA of the exact
one, or of the larger magnitude when they straddle zero. The 0th and 100th percentiles and
zeros are exact. Limits: ``|x| < 2**-126`` counts as zero; only ``SPAN`` buckets (64
octaves) are kept below the largest magnitude, lower values counting in the lowest bucket.

Merging adds counts on the fixed grid, so any split of the data, merged in any order, gives
the identical sketch. The store is dense over the buckets the data spans (37 per octave).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

import torch
import torch.nn.functional as F

from hookscope.core.errors import HookscopeError, param
from hookscope.numerics.moments import ChannelView, moments_matrix, scratch

__all__ = ["ALPHA", "PER_OCTAVE", "SPAN", "Sketch", "finite_range", "parse_percentiles",
           "percentile_key"]

#: Buckets per octave, and the mantissa bits that choose one.
PER_OCTAVE = 37
_BITS = 10


def _table() -> tuple[list[int], list[float], list[float]]:
    """Each 10-bit mantissa prefix's bucket, ``floor(37 * log2(1 + j/1024))`` in exact
    integer arithmetic, and each bucket's ends ``[lo, hi)`` within the octave."""
    n = 1 << _BITS
    bucket, b = [], 0
    for j in range(n):
        while 2 ** (b + 1) * n ** PER_OCTAVE <= (n + j) ** PER_OCTAVE:
            b += 1
        bucket.append(b)
    lo = [1 + bucket.index(b) / n for b in range(PER_OCTAVE)]
    hi = [*lo[1:], 2.0]
    return bucket, lo, hi


_BUCKET, _LO, _HI = _table()
#: Each bucket's value within the octave, 2 * lo * hi / (lo + hi).
_VALUE = [2 * lo * h / (lo + h) for lo, h in zip(_LO, _HI, strict=True)]
#: The relative accuracy of every bucket's value (0.967%).
ALPHA = max((h - lo) / (h + lo) for lo, h in zip(_LO, _HI, strict=True))
#: Buckets kept per sign below the largest magnitude (64 octaves).
SPAN = 64 * PER_OCTAVE
#: The bucket of 2**-126: smaller magnitudes count as zeros.
_ZERO = -126 * PER_OCTAVE
#: The low and top index of a sketch without a bucket.
_NONE = 1 << 40

#: Per float dtype: the integer dtype of its bits, the mask of the magnitude bits, the
#: shift that keeps the exponent and ``_BITS`` mantissa bits, the exponent bias, and the
#: shift that leaves the sign (-1 or 0).
_LAYOUT = {
    torch.float32: (torch.int32, 0x7FFF_FFFF, 23 - _BITS, 127, 31),
    torch.float64: (torch.int64, 0x7FFF_FFFF_FFFF_FFFF, 52 - _BITS, 1023, 63),
}

#: The integer dtype twice as narrow as each key dtype: its buffer, viewed, is a third one.
_HALF = {torch.int32: torch.int16, torch.int64: torch.int32}
_TABLES: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _prefixes(block: torch.Tensor, nonfinite: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Each value's exponent and first ``_BITS`` mantissa bits, as one integer (monotone in
    ``|x|``; NaN and Inf, with ``nonfinite``, as 0), and two spare buffers of its shape
    (reused per thread on the CPU)."""
    itype, mask, shift, _, _ = _LAYOUT[block.dtype]
    n, shape = block.numel(), block.shape
    if block.device.type == "cpu":
        found = [scratch(n, itype), scratch(n, block.dtype).view(itype),
                 scratch(2 * n, _HALF[itype]).view(itype)]
    else:
        found = [torch.empty(n, dtype=itype, device=block.device) for _ in range(3)]
    key, *spare = (b.view(shape) for b in found)
    torch.bitwise_and(block.view(itype), mask, out=key).bitwise_right_shift_(shift)
    if nonfinite:
        key.masked_fill_(~torch.isfinite(block), 0)
    return key, spare


def _bucket(prefix: int, bias: int) -> int:
    """The grid's bucket of an exponent-and-mantissa prefix (a scalar)."""
    return ((prefix >> _BITS) - bias) * PER_OCTAVE + _BUCKET[prefix & ((1 << _BITS) - 1)]


def _keys(block: torch.Tensor, nonfinite: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each value's bucket on the grid of the block's own float layout (zeros, subnormals
    and, with ``nonfinite``, NaN and Inf under the floor), and a spare buffer of its shape."""
    key, (work, within) = _prefixes(block, nonfinite)
    itype, device = key.dtype, block.device
    table = _TABLES.get((itype, device))
    if table is None:
        table = _TABLES[itype, device] = torch.tensor(_BUCKET, dtype=itype, device=device)
    # 37 buckets per octave of the exponent, and the table's bucket of the mantissa's bits;
    # index_select: ~15x faster on the CPU than indexing with a tensor.
    prefix = torch.bitwise_and(key, (1 << _BITS) - 1, out=work).view(-1)
    torch.index_select(table, 0, prefix, out=within.view(-1))
    key.bitwise_right_shift_(_BITS).mul_(PER_OCTAVE).add_(within)
    return key, work


def _window(blocks: list[tuple[torch.Tensor, slice]], nonfinite: bool) -> tuple[int, int, int]:
    """The largest bucket, the smallest one above the zeros' floor, and the low end of the
    store: that one, or ``SPAN`` buckets below the largest (``_NONE`` ends: no bucket)."""
    tops, smallest = [], []
    for block, _ in blocks:
        _, mask, _, bias, _ = _LAYOUT[block.dtype]
        floor = (bias - 126) << _BITS  # every zero's and subnormal's prefix is below
        key, (work, _) = _prefixes(block, nonfinite)
        tops.append(_bucket(int(key.amax()), bias))
        # Prefixes below the floor wrap to large positive numbers, out of the minimum's way.
        low = int(torch.sub(key, floor, out=work).bitwise_and_(mask).amin()) + floor
        smallest.append(_bucket(low, bias) if low <= mask >> 1 else _NONE)
    top = max(tops, default=-_NONE)
    if top < _ZERO:  # nothing but zeros
        return -_NONE, _NONE, _NONE
    return top, min(smallest), max(min(smallest), top - SPAN + 1)


def _columns(block: torch.Tensor, low: int, smallest: int, width: int, nonfinite: bool
             ) -> torch.Tensor:
    """Each value's column from the zeros' column: ``u`` for a positive value, ``-u`` for a
    negative one, where ``u`` is its bucket's rank from ``low`` (from 1), and 0 for zeros."""
    key, work = _keys(block, nonfinite)
    itype, _, _, bias, sign_shift = _LAYOUT[block.dtype]
    if not width:  # zeros only
        return key.zero_()
    low += bias * PER_OCTAVE
    if low > smallest + bias * PER_OCTAVE:  # the lowest buckets collapse into low, not zeros
        above = key >= _ZERO + bias * PER_OCTAVE
        key.clamp_(min=low).sub_(low - 1).mul_(above)
    else:
        key.sub_(low - 1).clamp_(min=0)
    sign = torch.bitwise_right_shift(block.view(itype), sign_shift, out=work)
    return key.bitwise_xor_(sign).sub_(sign)  # -u where the sign is -1


@dataclass(frozen=True)
class Sketch:
    """Percentile sketches of ``C`` channels (``C = 1`` for a whole output).

    The store spans buckets ``low`` to ``top`` (``low > top``: none) for each sign it has
    (``negative``, ``positive``). ``counts`` is ``(C, Wn + 1 + Wp)`` int64 in the order of
    the values: negative buckets from ``top`` down to ``low``, the zeros, positive buckets
    from ``low`` up (``Wn``, ``Wp``: ``top - low + 1``, or 0 for a missing sign). ``min``
    and ``max`` are the ``(C,)`` float64 finite range (+inf and -inf when empty).
    """

    low: int
    top: int
    negative: bool
    positive: bool
    counts: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor

    @classmethod
    def of(cls, view: ChannelView, lo: torch.Tensor, hi: torch.Tensor, *,
           nonfinite: bool = True) -> Sketch:
        """The sketch of each channel of ``view``, given its exact finite range ``[lo, hi]``
        (``nonfinite``: the view may hold NaN or Inf; False skips their masking)."""
        blocks = list(view.blocks())
        top, smallest, low = _window(blocks, nonfinite)
        negative, positive = bool((lo < 0).any()), bool((hi > 0).any())
        width = max(top - low + 1, 0)
        wn, wp = width if negative else 0, width if positive else 0
        total, device = wn + 1 + wp, lo.device
        dump = view.channels * total  # where non-finite values go
        start = torch.arange(view.channels, device=device) * total + wn
        # int32 counts while counting (half the cache the scatter touches) when they fit.
        wide = torch.int32 if view.matrix.numel() < 1 << 31 else torch.int64
        acc = torch.zeros(dump + 1, dtype=wide, device=device)
        ones = torch.ones(1, dtype=wide, device=device)
        for block, at in blocks:
            column = _columns(block, low, smallest, width, nonfinite)
            column.add_(start[view.ids[at]].unsqueeze(view.dim).to(column.dtype))
            if nonfinite:
                column.masked_fill_(~torch.isfinite(block), dump)
            acc.index_add_(0, column.view(-1), ones.expand(column.numel()))
        return cls(low, top, negative, positive, acc[:dump].view(view.channels, total).long(),
                   lo.double(), hi.double())

    @property
    def channels(self) -> int:
        return int(self.min.numel())

    @property
    def width(self) -> int:
        """Buckets per sign in the store."""
        return max(self.top - self.low + 1, 0)

    def _side(self, part: torch.Tensor, low: int, width: int) -> torch.Tensor:
        """One sign's counts (ascending from ``self.low``) on the store from ``low`` up to
        ``width`` buckets: moved whole, with buckets below ``low`` collapsed into it."""
        if part.shape[1] == 0:
            return part.new_zeros(part.shape[0], width)
        shift = self.low - low
        if shift < 0:  # the new store starts higher: the lowest buckets collapse
            part = torch.cat([part[:, :1 - shift].sum(1, keepdim=True), part[:, 1 - shift:]], 1)
            shift = 0
        return F.pad(part, (shift, width - shift - part.shape[1]))

    def aligned(self, low: int, top: int, negative: bool, positive: bool) -> torch.Tensor:
        """The counts on the store ``(low, top, negative, positive)``, which covers this one's."""
        width = max(top - low + 1, 0)
        wn = self.width if self.negative else 0
        neg, zeros, pos = self.counts.split([wn, 1, self.counts.shape[1] - wn - 1], dim=1)
        parts = [zeros]
        if negative:
            parts.insert(0, self._side(neg.flip(1), low, width).flip(1))
        if positive:
            parts.append(self._side(pos, low, width))
        return torch.cat(parts, 1)

    def merge(self, other: Sketch) -> Sketch:
        """The sketch of both sides' values: exactly that of their union (a new object)."""
        if other.channels != self.channels:
            raise HookscopeError(
                f"Percentile sketches of {self.channels} and {other.channels} channels cannot "
                f"be merged: one call's output changed its channel count between batches.")
        top = max(self.top, other.top)
        low = max(min(self.low, other.low), top - SPAN + 1)
        store = (low, top, self.negative or other.negative, self.positive or other.positive)
        return Sketch(*store, self.aligned(*store) + other.aligned(*store),
                      torch.minimum(self.min, other.min), torch.maximum(self.max, other.max))

    def collapse(self) -> Sketch:
        """One sketch of all channels' values together (exactly the whole output's sketch)."""
        return replace(self, counts=self.counts.sum(0, keepdim=True),
                       min=self.min.amin().reshape(1), max=self.max.amax().reshape(1))

    def quantiles(self, percentiles: Sequence[float]) -> torch.Tensor:
        """``(C, P)`` float64: each percentile (0 to 100) as ``torch.quantile``'s default
        linear interpolation would give it, within the documented error; NaN when empty."""
        n = self.counts.sum(1)
        last = (n - 1).clamp(min=0).unsqueeze(1)
        q = torch.tensor(list(percentiles), dtype=torch.float64, device=n.device) / 100
        pos = q.unsqueeze(0) * last.double()
        below = pos.floor()
        ranks = torch.cat([below.long(), torch.minimum(below.long() + 1, last)], dim=1)
        low, high = self._order_stats(ranks, last).split(len(q), dim=1)
        value = torch.lerp(low, high, pos - below)
        return torch.where(n.unsqueeze(1) > 0, value, math.nan)

    def _order_stats(self, ranks: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The estimated values of the given 0-based order statistics, per channel: the
        value of the bucket holding each, clamped to the exact range; the exact min and max
        for the first and last."""
        cum = self.counts.cumsum(1)
        column = torch.searchsorted(cum, ranks, right=True).clamp_(max=cum.shape[1] - 1)
        wn = self.width if self.negative else 0
        index = torch.where(column < wn, self.top - column, self.low + column - wn - 1)
        octave = torch.div(index, PER_OCTAVE, rounding_mode="floor")
        within = (index - octave * PER_OCTAVE).clamp_(0, PER_OCTAVE - 1)
        # The bucket's value within the octave, scaled by an exact power of two: no overflow.
        value = torch.tensor(_VALUE, dtype=torch.float64, device=index.device)[within]
        value = value * torch.pow(2.0, octave.double())
        value = torch.where(column < wn, -value, torch.where(column == wn, 0.0, value))
        mn, mx = self.min.unsqueeze(1), self.max.unsqueeze(1)
        value = torch.minimum(torch.maximum(value, mn), mx)
        return torch.where(ranks == 0, mn, torch.where(ranks == last, mx, value))


def finite_range(view: ChannelView) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Each channel's finite min and max (float64; +inf and -inf when it has none), and
    whether a non-finite value may be present (always True off the CPU)."""
    rows = moments_matrix(view)
    return rows[4], rows[5], not view.blocked or bool(rows[7].any())


def percentile_key(p: float) -> str:
    """The JSON key of a percentile: its shortest decimal form (``99.9``, ``50``, ``0.001``)."""
    text = format(Decimal(repr(float(p))).normalize(), "f")
    return "0" if text in ("-0", "0") else text


def parse_percentiles(value: str | float | Sequence[float] | None) -> tuple[float, ...]:
    """Percentiles from ``"0.1,99.9"``, a sequence of numbers or one number, in the order
    given, duplicates (``99.9`` and ``99.90``) dropped; None or an empty sequence: none.
    HookscopeError for an empty string, not a number (a bool included), or outside [0, 100]."""
    if value is None:
        return ()
    hint = "give numbers from 0 to 100 separated by commas, e.g. 0.1,99.9,99.99."
    if isinstance(value, str) and not value.strip():
        raise HookscopeError(f"{param('percentiles')} is empty; {hint}")
    items = value.split(",") if isinstance(value, str) else \
        list(value) if isinstance(value, Iterable) else [value]  # a number: one percentile
    found: dict[str, float] = {}
    for item in items:
        try:
            if isinstance(item, bool):
                raise TypeError(item)
            p = float(item.strip() if isinstance(item, str) else item)
        except (TypeError, ValueError):
            raise HookscopeError(f"{param('percentiles')}: {str(item).strip()!r} is not a "
                                 f"number; {hint}") from None
        if not 0.0 <= p <= 100.0:
            raise HookscopeError(f"{param('percentiles')}: {str(item).strip()!r} is outside "
                                 f"[0, 100]; {hint}")
        found.setdefault(percentile_key(p), p)
    return tuple(found.values())
