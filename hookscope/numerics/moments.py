"""Moments of a tensor, whole or per channel: counts, mean and M2 over the finite values,
range, zeros and non-finite values, merged exactly across batches by Chan et al.'s update in
float64.

:func:`moments_matrix` is the one implementation, and a whole tensor is a view with one
channel; on the CPU :func:`host_values` takes a whole tensor's plain reductions per
cache-sized block, several times faster. Reductions over a permuted view run ~10x slower on
the CPU than over contiguous memory, so :class:`ChannelView` lays an output out as a
contiguous matrix whose rows (``(N*C, H*W)``) or columns (``(N*T, C)``) each belong to one
channel, cut into cache-sized blocks; each block's plain reductions are combined per channel,
and only a block whose sums are not finite is masked, in float64. Off the CPU the whole
output is one block, masked without a data-dependent branch, so nothing synchronises per layer.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import torch

from hookscope.core.errors import HookscopeError, param

__all__ = ["ChannelMoments", "ChannelView", "Moments", "as_float", "chan", "deferred_moments",
           "device_values", "host_values", "moments", "moments_matrix", "scratch"]

NAN = float("nan")
#: Rows shorter than this are too short to reduce one by one: columns hold the channels.
_ROW_MIN = 16
#: Elements per block on the CPU: 2 MiB of float32, which stays in cache between passes
#: (smaller blocks pay for more small operations, larger ones fall out of cache).
BLOCK = 1 << 19
#: Row width of the matrix whose row sums give a block's sum (:func:`_sum`).
_WIDTH = 512
#: Elements per block of a whole tensor's moments on the CPU: 1 MiB of float32, which stays
#: in a core's cache through each of its reductions (smaller blocks pay more per block); at
#: most ``_WIDTH`` rows.
HOST_BLOCK = _WIDTH * _WIDTH
_ONES = {np.dtype(t): np.ones(_WIDTH, dtype=t) for t in (np.float32, np.float64)}
#: Beyond this magnitude a block's float32 sum of squares might overflow.
_HUGE = 1e16

_local = threading.local()
T = TypeVar("T", float, torch.Tensor)


def chan(n_a: T, mean_a: T, m2_a: T, n_b: T, mean_b: T, m2_b: T) -> tuple[T, T, T]:
    """Chan et al.'s exact combination of two (count, mean, M2) summaries, for numbers or
    per-channel tensors alike (an empty side has mean and M2 0)."""
    n = n_a + n_b
    delta = mean_b - mean_a
    weight = n_b / (n + (n == 0))
    return n, mean_a + delta * weight, m2_a + m2_b + delta * delta * n_a * weight


@dataclass(frozen=True)
class Moments:
    """The moments of one tensor (NaN mean, M2, min and max without a finite value)."""

    numel: int = 0
    n: int = 0
    mean: float = NAN
    m2: float = NAN
    min: float = NAN
    max: float = NAN
    zeros: int = 0
    nonfinite: int = 0

    @classmethod
    def from_values(cls, values: Sequence[float]) -> Moments:
        """From numel, n, mean, M2, min, max, zeros and the non-finite count."""
        numel, n, mean, m2, mn, mx, zeros, nonfinite = values
        if not n:
            mean = m2 = mn = mx = NAN
        return cls(int(numel), int(n), mean, m2, mn, mx, int(zeros), int(nonfinite))

    def merge(self, other: Moments) -> Moments:
        if not (self.n and other.n):
            kept = self if self.n else other
            mean, m2, mn, mx = kept.mean, kept.m2, kept.min, kept.max
        else:
            _, mean, m2 = chan(float(self.n), self.mean, self.m2,
                               float(other.n), other.mean, other.m2)
            mn, mx = min(self.min, other.min), max(self.max, other.max)
        return Moments(self.numel + other.numel, self.n + other.n, mean, m2, mn, mx,
                       self.zeros + other.zeros, self.nonfinite + other.nonfinite)

    @property
    def std(self) -> float:
        """Unbiased standard deviation over the finite values (NaN for fewer than two)."""
        if self.n < 2:
            return NAN
        return math.sqrt(max(self.m2, 0.0) / (self.n - 1))

    def summary(self) -> dict[str, float | int]:
        zero_fraction = self.zeros / self.numel if self.numel else NAN
        return {"mean": self.mean, "std": self.std, "min": self.min, "max": self.max,
                "zero_fraction": zero_fraction, "nonfinite": self.nonfinite}


def scratch(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-thread reusable CPU buffer of at least ``numel`` elements of ``dtype``."""
    bufs: dict[torch.dtype, torch.Tensor] = _local.__dict__.setdefault("bufs", {})
    buf = bufs.get(dtype)
    if buf is None or buf.numel() < numel:
        # A normal tensor even when first made in inference mode, so that gradient
        # statistics (outside it) may write into it too.
        with torch.inference_mode(False):
            buf = bufs[dtype] = torch.empty(max(numel, BLOCK), dtype=dtype)
    return buf[:numel]


def as_float(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached, as float32 or float64 (complex values by magnitude), contiguous."""
    x = x.detach()
    if x.is_complex():
        x = x.abs()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    return x.contiguous()


def host_values(flat: torch.Tensor, *, nonnegative: bool = False) -> list[float]:
    """The eight values of :meth:`Moments.from_values` of a flat CPU tensor: per block of
    ``HOST_BLOCK`` values (:func:`_block_values`), merged; all the blocks masked, in float64
    (:func:`moments_matrix`), when a value is not finite or is huge. ``nonnegative``: the
    caller knows no value is below 0 (a ``ReLU``'s output), so a block holding a zero has the
    minimum 0 without a pass of its own."""
    values = flat.numpy()
    count = len(values)
    if not count:
        return [0, 0, NAN, NAN, NAN, NAN, 0, 0]
    mask = _buffer(min(count, HOST_BLOCK), np.bool_)
    found = None
    for start in range(0, count, HOST_BLOCK):
        part = _block_values(values[start:start + HOST_BLOCK], mask, nonnegative)
        if part is None:
            return moments_matrix(ChannelView.of(flat, None))[:, 0].tolist()
        if found is None:
            found = part
        else:  # both sides finite throughout: Chan's update, as Moments.merge does it
            n, mean, m2 = chan(found[0], found[2], found[3], part[0], part[2], part[3])
            found = [n, n, mean, m2, min(found[4], part[4]), max(found[5], part[5]),
                     found[6] + part[6], 0]
    return found  # type: ignore[return-value]


def _block_values(values: np.ndarray, mask: np.ndarray, nonnegative: bool = False
                  ) -> list[float] | None:
    """One block's eight values, or None when one is not finite or is huge. Plain NumPy
    reductions read each value while the block is in cache: the non-zero count (through
    ``mask``, a boolean scratch array at least as long), max, min (unless ``nonnegative``
    and a zero is found), the sum (:func:`_sum`) and the dot product (the sum of squares);
    none starts torch's thread pool, whose idle threads spin. Where the mean is larger than
    the spread those squares would cancel, so the squares of the values less the mean are
    summed."""
    count = len(values)
    zeros = count - int(np.count_nonzero(np.not_equal(values, 0, out=mask[:count])))
    hi = float(np.maximum.reduce(values))
    # Without a negative value a zero is the minimum, so no pass finds it (a ReLU's output).
    lo = 0.0 if nonnegative and zeros else float(np.minimum.reduce(values))
    if not -_HUGE < lo <= hi < _HUGE:  # NaN, Inf, or squares that may overflow float32
        return None
    mean = _sum(values) / count
    q = float(np.dot(values, values))
    m2 = q - count * mean * mean
    if m2 < q / 2:
        d = np.subtract(values, mean, out=_buffer(count, values.dtype))
        s1 = _sum(d)
        m2 = float(np.dot(d, d)) - s1 * s1 / count
    return [count, count, mean, max(m2, 0.0), lo, hi, zeros, 0]


def _sum(values: np.ndarray) -> float:
    """The sum of a block: its rows of ``_WIDTH`` values summed by one BLAS matrix-vector
    product (one pass, as fast as torch's sum), then those sums and the tail's."""
    rows, rest = divmod(len(values), _WIDTH)
    ones = _ONES[values.dtype]
    head = values[:rows * _WIDTH].reshape(rows, _WIDTH)
    total = float(np.dot(ones[:rows], np.dot(head, ones)))
    return total + float(np.dot(values[-rest:], ones[:rest])) if rest else total


def _buffer(count: int, dtype: Any) -> np.ndarray:
    """A per-thread reusable array of ``count`` (at most ``HOST_BLOCK``) elements of ``dtype``."""
    bufs: dict[Any, np.ndarray] = _local.__dict__.setdefault("arrays", {})
    buf = bufs.get(dtype)
    if buf is None:
        buf = bufs[dtype] = np.empty(HOST_BLOCK, dtype=dtype)
    return buf[:count]


def moments(x: torch.Tensor) -> Moments:
    """The moments of a whole tensor (read to the host at once, even on an accelerator)."""
    found = deferred_moments(x)
    return found if isinstance(found, Moments) else Moments.from_values(found.tolist())


def deferred_moments(x: torch.Tensor, *, nonnegative: bool = False) -> Moments | torch.Tensor:
    """The moments of a whole tensor; off the CPU, :func:`device_values`' tensor, for a
    :class:`~hookscope.numerics.table.Table` to read later. ``nonnegative``: as :func:`host_values`."""
    flat = as_float(x).reshape(-1)
    if flat.device.type == "cpu":
        return Moments.from_values(host_values(flat, nonnegative=nonnegative))
    return device_values(flat)


def device_values(flat: torch.Tensor) -> torch.Tensor:
    """The branch-free path for accelerators: the eight values of :meth:`Moments.from_values`
    of a flat tensor, as one float64 tensor that stays on its device."""
    return moments_matrix(replace(ChannelView.of(flat, None), blocked=False))[:, 0]


@dataclass(frozen=True)
class ChannelView:
    """An output laid out as a contiguous 2-D ``matrix`` whose rows (``rows``) or else
    columns each hold one channel: ``ids`` gives each row's (or column's) channel.
    ``blocked``: split into cache-sized blocks (the CPU); False: one block, no branches."""

    matrix: torch.Tensor
    channels: int
    rows: bool
    ids: torch.Tensor
    blocked: bool = True

    @classmethod
    def of(cls, x: torch.Tensor, dim: int | None) -> ChannelView:
        """The view of ``x`` with channels on ``dim`` (None: all of ``x`` is one channel)."""
        x = as_float(x)
        shape = list(x.shape)
        if dim is None:
            outer, channels, inner = 1, 1, x.numel()
        else:
            outer, channels, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
        blocked, device = x.device.type == "cpu", x.device
        if dim is None or inner >= _ROW_MIN:
            ids = torch.arange(outer * channels, device=device) % max(channels, 1)
            return cls(x.reshape(outer * channels, inner), channels, True, ids, blocked)
        ids = torch.arange(channels * inner, device=device) // inner
        return cls(x.reshape(outer, channels * inner), channels, False, ids, blocked)

    @property
    def dim(self) -> int:
        """The matrix dimension reduced to get one partial per row or column."""
        return 1 if self.rows else 0

    def blocks(self) -> Iterator[tuple[torch.Tensor, slice]]:
        """Blocks of at most ``BLOCK`` elements (one block off the CPU), each with its slice
        of ``ids``."""
        n_rows, width = self.matrix.shape
        if self.matrix.numel() == 0:
            return
        if not self.blocked:
            yield self.matrix, slice(None)
            return
        cols = min(width, BLOCK)
        step = max(1, BLOCK // cols)
        for r0 in range(0, n_rows, step):
            for c0 in range(0, width, cols):
                block = self.matrix[r0:r0 + step, c0:c0 + cols]
                yield block, slice(r0, r0 + step) if self.rows else slice(c0, c0 + cols)


@dataclass
class ChannelMoments:
    """Mergeable per-channel summaries, each a float64 or int64 ``(C,)`` tensor: ``count``
    counts every value, ``n`` the finite ones, over which the rest are taken."""

    count: torch.Tensor
    n: torch.Tensor
    mean: torch.Tensor
    m2: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor
    zeros: torch.Tensor
    nonfinite: torch.Tensor

    @classmethod
    def of(cls, view: ChannelView) -> ChannelMoments:
        """Exact moments of each channel of ``view``."""
        count, n, mean, m2, lo, hi, zeros, nonfinite = moments_matrix(view)
        return cls(count.long(), n.long(), mean, m2, lo, hi, zeros.long(), nonfinite.long())

    @property
    def channels(self) -> int:
        return int(self.count.numel())

    def merge(self, other: ChannelMoments) -> ChannelMoments:
        """The exact parallel combination, for every channel at once."""
        if other.channels != self.channels:
            raise HookscopeError(
                f"Per-channel statistics of {self.channels} and {other.channels} channels cannot "
                f"be merged: one call's output changed its channel count between batches; use "
                f"{param('per_channel')} only where the channel count is fixed.")
        n, mean, m2 = chan(self.n.double(), self.mean, self.m2, other.n.double(), other.mean,
                           other.m2)
        return ChannelMoments(self.count + other.count, n.long(), mean, m2,
                              torch.minimum(self.min, other.min), torch.maximum(self.max, other.max),
                              self.zeros + other.zeros, self.nonfinite + other.nonfinite)

    def rows(self) -> list[dict[str, Any]]:
        """One JSON row per channel: ``channel``, ``count``, ``mean``, ``std``, ``min``, ``max``,
        ``zero_fraction``, ``nonfinite`` (NaN where there is no finite value, or one only)."""
        nan = torch.tensor(math.nan, dtype=torch.float64)
        has = self.n > 0
        std = torch.where(self.n > 1, (self.m2.clamp(min=0) / (self.n - 1).clamp(min=1)).sqrt(),
                          nan)
        frac = torch.where(self.count > 0, self.zeros.double() / self.count.clamp(min=1), nan)
        columns = {
            "count": self.count.tolist(), "mean": torch.where(has, self.mean, nan).tolist(),
            "std": std.tolist(), "min": torch.where(has, self.min, nan).tolist(),
            "max": torch.where(has, self.max, nan).tolist(), "zero_fraction": frac.tolist(),
            "nonfinite": self.nonfinite.tolist(),
        }
        return [{"channel": c} | {k: v[c] for k, v in columns.items()}
                for c in range(self.channels)]


def moments_matrix(view: ChannelView) -> torch.Tensor:
    """Exact moments of each channel of ``view``: a float64 ``(8, channels)`` tensor whose
    rows are the count, n (the finite values), mean, M2, min, max, zeros and non-finite
    count (0, 0, +inf and -inf for the mean, M2, min and max of a channel without a finite
    value). On the CPU the blocks are masked only when a plain reduction is not finite."""
    blocks = list(view.blocks())
    parts = None
    if view.blocked and blocks:
        sums = torch.cat([block_sums(block, view.dim) for block, _ in blocks], dim=1).double()
        if bool(sums.isfinite().all()):  # else a value (or a square) was not: mask the blocks
            count, lo, hi, nonzero, shift, s1, s2 = sums
            m2 = (s2 - s1 * s1 / count).clamp(min=0)
            parts = torch.stack([count, count, shift, m2, lo, hi, count - nonzero,
                                 torch.zeros_like(count)])
    if parts is None:
        parts = torch.cat([masked_moments(block, view.dim) for block, _ in blocks] or
                          [torch.empty(8, 0, dtype=torch.float64, device=view.matrix.device)],
                          dim=1)
    if parts.shape[1] == view.channels:  # one partial per channel, in order: nothing to merge
        return parts
    ids = torch.cat([view.ids[at] for _, at in blocks]) if blocks else view.ids[:0]
    return combine(parts, ids, view.channels)


def block_sums(block: torch.Tensor, dim: int) -> torch.Tensor:
    """The CPU's plain reductions of each row (``dim=1``) or column of a block, in its own
    dtype and unchecked: its length, min, max, non-zero count, mean,
    and the sum and the sum of squares of the values less that mean.

    On the CPU amin and amax are each ~20x faster than aminmax along a dimension, sums in
    the block's dtype ~10x faster than float64 ones, ``ne`` then ``sum`` ~10x faster than
    ``count_nonzero``. Squares of the values less the block's own mean do not cancel even
    for a mean 10^4 times the spread; the sum of those differences corrects M2 for the
    mean's rounding.
    """
    count = block.shape[dim]
    buf = scratch(block.numel(), block.dtype).view(block.shape)
    lo, hi = block.amin(dim), block.amax(dim)
    shift = block.mean(dim)
    nonzero = torch.ne(block, 0, out=buf).sum(dim)
    d = torch.sub(block, shift.unsqueeze(dim), out=buf)
    s1 = d.sum(dim)
    s2 = d.square_().sum(dim)
    return torch.stack([torch.full_like(lo, count), lo, hi, nonzero, shift, s1, s2])


def masked_moments(block: torch.Tensor, dim: int) -> torch.Tensor:
    """Branch-free partial moments (the rows of :func:`moments_matrix`) of each row or column
    over its finite values, in float64."""
    finite = torch.isfinite(block)
    n = finite.sum(dim).double()
    values = torch.where(finite, block, 0).double()
    # The float64 sum's own mean: unlike a correction from the deviations below, it keeps
    # 3e38 - 3e38 + 1 exact.
    mean = values.sum(dim) / n.clamp(min=1)
    d = torch.where(finite, values - mean.unsqueeze(dim), 0)
    s1 = d.sum(dim)
    m2 = ((d * d).sum(dim) - s1 * s1 / n.clamp(min=1)).clamp(min=0)
    inf = torch.tensor(math.inf, dtype=block.dtype, device=block.device)
    lo = torch.where(finite, block, inf).amin(dim).double()
    hi = torch.where(finite, block, -inf).amax(dim).double()
    zeros = (block == 0).sum(dim).double()
    count = torch.full_like(n, block.shape[dim])
    return torch.stack([count, n, mean, m2, lo, hi, zeros, count - n])


def combine(parts: torch.Tensor, ids: torch.Tensor, channels: int) -> torch.Tensor:
    """Per-channel moments from partial ones, channel ``ids[i]``'s in column ``i`` (exact:
    the parallel formula)."""
    count, n, mean, m2, lo, hi, zeros, nonfinite = parts
    sums = parts.new_zeros(5, channels).index_add_(
        1, ids, torch.stack([count, n, n * mean, zeros, nonfinite]))
    n_c = sums[1]
    mean_c = sums[2] / n_c.clamp(min=1)
    m2_c = parts.new_zeros(channels).index_add_(0, ids, m2 + n * (mean - mean_c[ids]) ** 2)
    lo_c = parts.new_full((channels,), math.inf).scatter_reduce_(0, ids, lo, "amin")
    hi_c = parts.new_full((channels,), -math.inf).scatter_reduce_(0, ids, hi, "amax")
    return torch.stack([sums[0], n_c, mean_c, m2_c, lo_c, hi_c, sums[3], sums[4]])
