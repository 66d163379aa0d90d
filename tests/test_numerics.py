"""Moments and diff sums on the CPU against float64 references: counts, min and max exact,
means and spreads within tolerances from the arithmetic, on adversarial layouts too."""

from __future__ import annotations

import math

import pytest
import torch

import hookscope.numerics.diffsums as diffsums
from hookscope.numerics.moments import host_values
from tests.bounds import U32, diff_chain, sum_bound
from tests.test_stats import CASES, REL, _from, assert_close, reference


@pytest.mark.parametrize("case", sorted(CASES))
def test_moments_match_float64_reference(case: str) -> None:
    x = CASES[case](torch.Generator().manual_seed(1))
    values = host_values(x.reshape(-1))
    assert_close(_from(values), reference(x))
    _assert_exact_parts(values, x)


def _assert_exact_parts(values, x: torch.Tensor) -> None:
    """Counts, min and max are exact, not merely close."""
    flat = x.reshape(-1).double()
    finite = flat[torch.isfinite(flat)]
    numel, n, _, _, lo, hi, zeros, nonfinite = values
    assert (numel, n, nonfinite) == (flat.numel(), finite.numel(), flat.numel() - finite.numel())
    assert zeros == int((flat == 0).sum())
    if finite.numel():
        assert (lo, hi) == (finite.min().item(), finite.max().item())


ADVERSARIAL = {
    # Channels whose means differ by 30 std: each block's shift comes from its neighbour.
    "channel_offsets": lambda g: torch.randn(2, 64, 40, 40, generator=g)
    + 30 * torch.randn(1, 64, 1, 1, generator=g),
    # Blocks alternate between a mean of 0 and 1e4: the worst shift a block can get.
    "alternating_blocks": lambda g: torch.cat([
        torch.randn(2048, generator=g) + (1e4 if i % 2 else 0.0) for i in range(40)]),
    "outlier_first": lambda g: torch.cat([torch.tensor([1e6]), torch.randn(200_000, generator=g)]),
    "nan_inf_spread": lambda g: torch.randn(300_001, generator=g).index_fill_(
        0, torch.tensor([0, 4096, 70_000, 300_000]), math.nan).index_fill_(
        0, torch.tensor([9, 150_000]), math.inf),
    "huge_in_big": lambda g: torch.randn(100_000, generator=g).index_fill_(
        0, torch.tensor([3000, 3001]), 3e38),
    "float64_mean_1e6": lambda g: 1e6 + torch.randn(300_007, generator=g, dtype=torch.float64),
    "strided": lambda g: torch.randn(50_000, 3, generator=g)[:, 1],
}


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_adversarial_layouts_match_float64_reference(case: str) -> None:
    x = ADVERSARIAL[case](torch.Generator().manual_seed(3))
    values = host_values(x.reshape(-1))
    assert_close(_from(values), reference(x), rel=REL)
    _assert_exact_parts(values, x)


DIFF_CASES = {
    "empty": (0, 1.0, 1e-3),
    "tail only": (15, 1.0, 1e-3),
    "one step": (16, 1.0, 1e-3),
    "windows and a tail": (4096 + 7, 3.0, 1e-2),
    "many tasks": (1_000_003, 1.0, 1e-4),
    "mean far from zero": (70_001, 1e4, 1e-3),
    "identical": (5000, 1.0, 0.0),
}


@pytest.mark.parametrize("case", sorted(DIFF_CASES))
def test_diff_sums_match_float64_reference(case: str) -> None:
    numel, scale, noise = DIFF_CASES[case]
    g = torch.Generator().manual_seed(6)
    a = scale * (1 + torch.randn(numel, generator=g))
    b = a + noise * torch.randn(numel, generator=g)
    got = diffsums._compare_host(a, b)
    x, y = a.double(), b.double()
    d = x - y
    want = (numel, numel, float(d @ d), float(x @ x), float(y @ y),
            float(d.abs().max()) if numel else 0.0, 0, 0)
    # The largest |a - b| is one float32 difference, rounded once.
    assert got[:2] == want[:2] and got[6:] == want[6:] and got[5] == pytest.approx(want[5], rel=U32)
    chain = diff_chain()
    for value, terms in zip(got[2:5], (d * d, x * x, y * y), strict=True):
        assert abs(value - float(terms.sum())) <= sum_bound(terms, chain)


@pytest.mark.parametrize("bad", ["nan", "inf", "overflow"])
def test_diff_sums_not_finite_go_the_masked_way(bad: str) -> None:
    _compare_host = diffsums._compare_host
    a = torch.linspace(-1, 1, 1000)
    b = a + 1e-3
    if bad == "overflow":  # finite values whose float32 squares are not
        a[3] = 3e20
        got = _compare_host(a, b)
        assert got[6:] == (0, 0) and got[5] == pytest.approx(3e20, rel=1e-6)
        assert math.isfinite(got[3]) and got[3] == pytest.approx(9e40, rel=1e-5)
        return
    a[10] = float(bad)
    b[20] = -float(bad) if bad == "inf" else float(bad)
    got = _compare_host(a, b)
    assert got[:2] == (1000, 998) and got[6:] == (1, 1)
    assert got[2] == pytest.approx(998 * 1e-6, rel=1e-4) and got[5] == pytest.approx(1e-3, rel=1e-3)


def test_host_moments_call_no_torch_op() -> None:
    """The CPU path reads a tensor through NumPy alone: a torch reduction would start torch's
    intra-op threads, whose spinning cost more than the reductions at two threads (#27)."""
    from torch.overrides import TorchFunctionMode

    class Record(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.add(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    x = torch.randn(3 * (1 << 18) + 5, generator=torch.Generator().manual_seed(4))
    with Record() as record:
        values = host_values(x)
    assert record.names == {"numpy"}
    assert_close(_from(values), reference(x))


@pytest.mark.parametrize("case", ["relu_like", "large_chunked", "all_zero", "nan_inf_relu", "no_zero"])
def test_nonnegative_moments_skip_only_the_minimum(case: str) -> None:
    """A ReLU's output (``nonnegative``) gets the same values, its minimum 0 found by the zero
    count where a block holds a zero, else by its own pass."""
    g = torch.Generator().manual_seed(5)
    x = {"nan_inf_relu": lambda: torch.relu(torch.tensor([1.0, math.nan, 0.0, math.inf, -1.0])),
         "no_zero": lambda: torch.rand(70_000, generator=g) + 0.5}.get(case, lambda: CASES[case](g))()
    values = host_values(x.reshape(-1), nonnegative=True)
    assert values == host_values(x.reshape(-1))
    _assert_exact_parts(values, x)
