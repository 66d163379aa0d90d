"""The sums behind one module call's comparison in ``hookscope diff``, merged exactly across batches.

On the CPU both tensors are read once, in cache-sized chunks, and non-finite values are
masked, in float64, only when a sum comes out non-finite. On an accelerator the comparison
has no branches and a batch's sums reach the host in one transfer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hookscope.core.mergeable import Merges, state
from hookscope.numerics.moments import scratch

__all__ = ["DiffSums", "compare", "count_nonfinite"]


#: Elements per comparison chunk: three float32 chunks (A's, B's, their difference) stay in a
#: core's cache while every sum is taken, and a float32 dot over them stays accurate.
_CHUNK = 1 << 16


@dataclass(frozen=True)
class DiffSums(Merges):
    """Mergeable sums behind one call's comparison, over elements finite on both sides."""

    numel: int = state("sum", 0)
    n: int = state("sum", 0)
    sq_diff: float = state("sum", 0.0)
    sq_a: float = state("sum", 0.0)
    sq_b: float = state("sum", 0.0)
    max_abs: float = state("max", 0.0)
    nonfinite_a: int = state("sum", 0)
    nonfinite_b: int = state("sum", 0)

    @classmethod
    def from_values(cls, values: Sequence[float]) -> DiffSums:
        numel, n, sd, sa, sb, mx, nfa, nfb = values
        return cls(int(numel), int(n), sd, sa, sb, mx, int(nfa), int(nfb))

    @property
    def rel_l2(self) -> float:
        """‖a−b‖ / ‖a‖: 0 when both are 0, inf when only ‖a‖ is, NaN when nothing compared."""
        if self.n == 0:
            return math.nan
        if self.sq_a == 0:
            return 0.0 if self.sq_diff == 0 else math.inf
        return math.sqrt(self.sq_diff / self.sq_a)

    @property
    def cosine(self) -> float:
        """Cosine similarity of a and b; NaN when either norm is 0. a·b is taken as
        (‖a‖² + ‖b‖² − ‖a−b‖²) / 2 (no fourth dot product): exact for a == b, else within
        ~1e-7 (absolute) unless one norm is thousands of times the other."""
        if self.n == 0 or self.sq_a == 0 or self.sq_b == 0:
            return math.nan
        dot = (self.sq_a + self.sq_b - self.sq_diff) / 2
        norms = math.sqrt(self.sq_a * self.sq_b)  # exact for a == b, unlike a product of roots
        if not math.isfinite(norms):
            norms = math.sqrt(self.sq_a) * math.sqrt(self.sq_b)
        return max(-1.0, min(1.0, dot / norms))


def _compare_host(a: torch.Tensor, b: torch.Tensor) -> tuple[float, ...]:
    """The eight values of :class:`DiffSums` for two flat CPU tensors of one dtype; a sum
    not finite is redone masked, in float64."""
    numel = a.numel()
    if numel == 0:
        return (0, 0, 0.0, 0.0, 0.0, 0.0, 0, 0)
    sums = _chunk_sums(a, b)
    if all(math.isfinite(v) for v in sums):
        return (numel, numel, *sums, 0, 0)
    return tuple(_compare_device(a, b).tolist())


def _chunk_sums(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """‖a−b‖², ‖a‖², ‖b‖² and max |a−b| of two non-empty flat CPU tensors."""
    parts = np.empty((-(-a.numel() // _CHUNK), 4))
    with np.errstate(over="ignore", invalid="ignore"):  # the caller sees sums not finite
        for row, pa, pb in zip(parts, a.split(_CHUNK), b.split(_CHUNK), strict=True):
            # Every sum of a chunk runs while it is in cache: one trip to memory per value.
            # A float32 dot over one chunk (NumPy's: about twice as fast on the CPU as
            # torch's) stays within ~1e-6; the chunks' results are summed in float64.
            d = torch.sub(pa, pb, out=scratch(pa.numel(), pa.dtype)).numpy()
            x, y = pa.numpy(), pb.numpy()
            row[:] = np.dot(d, d), np.dot(x, x), np.dot(y, y), np.abs(d, out=d).max()
    return [*parts[:, :3].sum(0).tolist(), float(parts[:, 3].max())]


def _compare_device(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The eight values of :class:`DiffSums` as one float64 tensor that stays on the device:
    no branch, the non-finite values masked."""
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    both = fa & fb
    zero = a.new_zeros(())
    x = torch.where(both, a, zero).double()
    y = torch.where(both, b, zero).double()
    d = x - y
    mx = d.abs().amax() if d.numel() else d.new_zeros(())
    count = torch.full((), float(a.numel()), dtype=torch.float64, device=a.device)
    return torch.stack([count, both.sum().double(), d @ d, x @ x, y @ y, mx,
                        (~fa).sum().double(), (~fb).sum().double()])


def compare(a: torch.Tensor, b: torch.Tensor) -> DiffSums | torch.Tensor:
    """The sums of two flat tensors of one dtype and device; off the CPU, as one device
    tensor, for a :class:`~hookscope.numerics.table.Table` to read later."""
    return DiffSums.from_values(_compare_host(a, b)) if a.device.type == "cpu" else _compare_device(a, b)


def count_nonfinite(a: torch.Tensor, b: torch.Tensor) -> DiffSums:
    """Only the non-finite counts of two outputs that cannot be compared."""
    return DiffSums(nonfinite_a=int((~torch.isfinite(a)).sum()),
                    nonfinite_b=int((~torch.isfinite(b)).sum()))
