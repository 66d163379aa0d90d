"""Error bounds of float arithmetic, for tolerances derived from how a value is computed."""

from __future__ import annotations

import torch

#: The unit roundoff of float32 and of float64 (half of each machine epsilon).
U32, U64 = 2.0 ** -24, 2.0 ** -53


def sum_bound(terms: torch.Tensor, chain: int) -> float:
    """The worst-case error of a sum of these float64 ``terms`` computed from float32
    inputs: every float32 partial sum chains at most ``chain`` additions, which add at most
    (chain - 1)·u·Σ|x| (Higham, Accuracy and Stability of Numerical Algorithms, 2002,
    eq. 4.4); each term is off by at most 3u (rounding a difference, then its square); the
    partial sums and the reference are added in float64."""
    total = float(terms.abs().sum())
    return (chain + 2) * U32 * total + 2 * terms.numel() * U64 * total


def diff_chain() -> int:
    """The longest float32 addition chain of ``diff``'s host sums: each chunk's dot is taken
    in float32."""
    import hookscope.numerics.diffsums as diffsums

    return diffsums._CHUNK
