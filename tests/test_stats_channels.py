"""Per-channel statistics against float64 references, percentiles against ``torch.quantile``,
and sketches that merge identically however the data was split."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

import hookscope.numerics.moments as channels
from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count
from hookscope.numerics.layout import channel_dim
from hookscope.numerics.moments import ChannelMoments, ChannelView
from hookscope.numerics.sketch import (
    ALPHA,
    PER_OCTAVE,
    SPAN,
    Sketch,
    finite_range,
    parse_percentiles,
    percentile_key,
)
from hookscope.probes.stats import StatsReport, collect_stats

REL = 1e-4
PERCENTILES = (0, 0.1, 1, 5, 25, 50, 75, 95, 99, 99.9, 99.99, 100)
ROW_KEYS = {"channel", "count", "mean", "std", "min", "max", "zero_fraction", "nonfinite"}


def per_channel_reference(x: torch.Tensor, dim: int | None) -> list[dict[str, float]]:
    """float64 statistics of each channel (the values along ``dim``), computed plainly."""
    x = x.detach().double()
    grouped = x.reshape(1, -1) if dim is None else x.movedim(dim, 0).reshape(x.shape[dim], -1)
    rows = []
    for values in grouped:
        finite = values[torch.isfinite(values)]
        n = finite.numel()
        rows.append({
            "count": values.numel(),
            "mean": finite.mean().item() if n else math.nan,
            "std": finite.std().item() if n > 1 else math.nan,
            "min": finite.min().item() if n else math.nan,
            "max": finite.max().item() if n else math.nan,
            "zero_fraction": (values == 0).sum().item() / values.numel(),
            "nonfinite": values.numel() - n,
        })
    return rows


def assert_rows_close(got: list[dict], want: list[dict], rel: float = REL) -> None:
    assert len(got) == len(want)
    for c, (row, ref) in enumerate(zip(got, want, strict=True)):
        assert row["channel"] == c
        for key, expected in ref.items():
            value = row[key]
            if isinstance(expected, float) and math.isnan(expected):
                assert math.isnan(value), (c, key)
            elif key in ("count", "nonfinite", "min", "max", "zero_fraction"):
                assert value == expected, (c, key)  # exact, not approximately
            elif key == "mean":
                # Within 1e-4 relative, or 1e-6 of the spread where the mean is tiny against
                # it (3e38 and -3e38 around 0.25): no summation order does better there.
                spread = 0.0 if math.isnan(ref["std"]) else ref["std"]
                assert abs(value - expected) <= rel * abs(expected) + 1e-6 * spread, (c, key)
            else:
                assert value == pytest.approx(expected, rel=rel, abs=1e-12), (c, key)


def with_bad_values(x: torch.Tensor) -> torch.Tensor:
    """NaN and Inf in some channels (dim 1), one channel all NaN, one constant."""
    x = x.clone()
    x[:, 0, ..., ::7] = math.nan
    x[0, 1, ..., 3] = math.inf
    x[-1, 2, ..., 5] = -math.inf
    x[:, 3] = math.nan
    x[:, 4] = 2.5
    return x


CASES = {
    "normal": lambda g: torch.randn(4, 6, 9, 11, generator=g),
    "mean_1e4_std": lambda g: 1e4 + torch.randn(3, 5, 40, 40, generator=g),
    "relu": lambda g: torch.relu(torch.randn(2, 8, 12, 12, generator=g)),
    "nan_inf": lambda g: with_bad_values(torch.randn(3, 6, 10, 10, generator=g)),
    "huge_finite": lambda g: torch.tensor([3e38, -3e38, 1.0, 0.0]).repeat(2, 3, 8, 1),
    "small_spatial": lambda g: torch.randn(16, 12, 2, 2, generator=g) * 3 - 1,
    "linear_2d": lambda g: torch.randn(32, 10, generator=g) + 5,
    "half_input": lambda g: torch.randn(2, 4, 16, 16, generator=g).half(),
}


@pytest.fixture(params=[None, 700], ids=["one_block", "small_blocks"])
def block(request, monkeypatch) -> None:
    """Also run with tiny blocks, so rows are split and partials combined."""
    if request.param is not None:
        monkeypatch.setattr(channels, "BLOCK", request.param)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("blocked", [True, False], ids=["cpu_path", "device_path"])
def test_channel_moments_match_float64_reference(case: str, blocked: bool, block) -> None:
    x = CASES[case](torch.Generator().manual_seed(3))
    view = ChannelView.of(x, 1)
    if not blocked:  # the branch-free path accelerators take, run on the CPU
        view = replace(view, blocked=False)
    assert_rows_close(ChannelMoments.of(view).rows(), per_channel_reference(x, 1))


@pytest.mark.parametrize("shape,dim", [((4, 7, 5), 2), ((6, 3, 10, 10), 1), ((3, 5, 6, 8), 3),
                                       ((50,), None), ((2, 2000), 1)])
def test_channel_layouts_match_reference(shape, dim, block) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4)) * 2 + 1
    assert_rows_close(ChannelMoments.of(ChannelView.of(x, dim)).rows(),
                      per_channel_reference(x, dim))


def test_merge_across_batches_equals_whole_tensor(block) -> None:
    g = torch.Generator().manual_seed(5)
    x = with_bad_values(torch.cat([1e3 + torch.randn(5, 6, 8, 8, generator=g),
                                   torch.relu(torch.randn(4, 6, 8, 8, generator=g))]))
    merged = None
    for part in x.split([1, 3, 2, 3]):
        batch = ChannelMoments.of(ChannelView.of(part, 1))
        merged = batch if merged is None else merged.merge(batch)
    assert merged is not None
    assert_rows_close(merged.rows(), per_channel_reference(x, 1))


@pytest.mark.parametrize("shape,type_name,want", [
    ((8, 64, 56, 56), "Conv2d", 1), ((8, 64, 56, 56), "ReLU", 1), ((8, 1000), "Linear", 1),
    ((8, 197, 768), "Linear", 2), ((8, 197, 768), "GELU", 2), ((8, 197, 768), "LayerNorm", 2),
    ((8, 32, 100), "Conv1d", 1), ((8, 32, 100), "BatchNorm1d", 1), ((8, 7, 7, 96), "LayerNorm", 3),
    ((8, 7, 7, 96), "Linear", 3), ((8,), "Identity", None), ((), "Identity", None),
])
def test_channel_dimension_rule(shape, type_name, want) -> None:
    assert channel_dim(shape, type_name) == want


def test_channel_count_change_is_one_clear_error() -> None:
    a = ChannelMoments.of(ChannelView.of(torch.randn(2, 3, 4, 4), 1))
    b = ChannelMoments.of(ChannelView.of(torch.randn(2, 5, 4, 4), 1))
    with pytest.raises(HookscopeError, match="channel count"):
        a.merge(b)


# ----------------------------------------------------------------------------- percentiles


def lognormal(g: torch.Generator) -> torch.Tensor:
    return torch.exp(torch.randn(20_000, generator=g) * 1.5)


def relu_outlier(g: torch.Generator) -> torch.Tensor:
    """The issue's case: 200,000 values of relu(randn) and one of 1e4."""
    x = torch.relu(torch.randn(200_000, generator=g))
    x[12_345] = 1e4
    return x


DATA = {
    "normal": lambda g: torch.randn(30_000, generator=g),
    "lognormal": lognormal,
    "relu": lambda g: torch.relu(torch.randn(30_000, generator=g)),
    "relu_outlier": relu_outlier,
    "mixed_signs": lambda g: torch.cat([-50 + torch.rand(5000, generator=g),
                                        torch.randn(20_000, generator=g) * 0.01,
                                        torch.full((3000,), 7.0)]),
    "offset_1e4": lambda g: 1e4 + torch.randn(20_000, generator=g),
    "cauchy": lambda g: torch.empty(20_000).cauchy_(generator=g),
    "tiny": lambda g: torch.randn(10_000, generator=g) * 1e-30,
    "constant": lambda g: torch.full((1000,), -3.25),
    "few": lambda g: torch.tensor([4.0, -1.0, 0.0]),
    "single": lambda g: torch.tensor([2.5]),
    "with_nan_inf": lambda g: torch.cat([torch.randn(10_000, generator=g),
                                         torch.tensor([math.nan, math.inf, -math.inf] * 5)]),
    "float64_wide": lambda g: torch.randn(5000, generator=g, dtype=torch.float64) * 1e200,
    "float64": lambda g: torch.randn(5000, generator=g, dtype=torch.float64),
    "half": lambda g: torch.randn(5000, generator=g).half(),
}


def sketch_of(x: torch.Tensor, dim: int | None = None) -> Sketch:
    view = ChannelView.of(x, dim)
    lo, hi, nonfinite = finite_range(view)
    return Sketch.of(view, lo, hi, nonfinite=nonfinite)


def exact_quantiles(values: torch.Tensor, percentiles=PERCENTILES) -> np.ndarray:
    """``numpy.quantile`` (linear, as ``torch.quantile``) in float64 over the finite values
    (NaN and Inf are left out, as documented), with the two order statistics around each."""
    finite = np.sort(values.double().numpy()[np.isfinite(values.double().numpy())])
    q = np.array(percentiles, dtype=np.float64) / 100
    pos = q * (len(finite) - 1)
    below = np.floor(pos).astype(int)
    return np.quantile(finite, q), finite[below], finite[np.minimum(below + 1, len(finite) - 1)]


def worst_relative_error(got: torch.Tensor, values: torch.Tensor,
                         percentiles=PERCENTILES) -> float:
    """The largest error relative to the exact percentile; where the two order statistics
    around it straddle zero, relative to the larger of them (the documented bound)."""
    want, a, b = exact_quantiles(values, percentiles)
    scale = np.where(np.sign(a) * np.sign(b) < 0, np.maximum(abs(a), abs(b)), np.abs(want))
    error = np.abs(got.numpy() - want)
    assert ((error == 0) | (scale > 0)).all()  # zeros exactly
    return float(np.max(np.where(error == 0, 0.0, error / np.where(scale > 0, scale, 1))))


#: Subnormal float32 magnitudes count as zeros: a data set of them is estimated within that.
SUBNORMAL = 2.0 ** -126


@pytest.mark.parametrize("case", sorted(DATA))
def test_percentiles_within_one_percent_of_numpy_quantile(case: str, block) -> None:
    values = DATA[case](torch.Generator().manual_seed(6))
    got = sketch_of(values).quantiles(PERCENTILES)[0]
    assert worst_relative_error(got, values) <= ALPHA * (1 + 1e-9) < 0.01
    finite = values.double()[torch.isfinite(values)]
    # The minimum and maximum are exact, and so is anything in constant data.
    assert got[0].item() == finite.min().item() and got[-1].item() == finite.max().item()


def test_the_issues_outlier_case_against_torch_quantile() -> None:
    """relu(randn) with one 1e4 (200,000 values): every percentile within 1%, in float64."""
    values = relu_outlier(torch.Generator().manual_seed(17))
    wanted = (50, 90, 99, 99.9, 99.99)
    got = sketch_of(values).quantiles(wanted)[0]
    exact = torch.quantile(values.double(), torch.tensor(wanted, dtype=torch.float64) / 100)
    assert ((got - exact).abs() <= 0.01 * exact.abs()).all(), (got, exact)


def test_zeros_are_exact() -> None:
    values = torch.relu(torch.randn(10_000, generator=torch.Generator().manual_seed(7)))
    zero_share = (values == 0).double().mean().item() * 100
    got = sketch_of(values).quantiles([0, 1, 10, zero_share - 1])[0]
    assert got.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_subnormal_values_count_as_zeros() -> None:
    values = torch.tensor([1e-40, -1e-41, 0.0, 3.0])
    got = sketch_of(values).quantiles([25, 50])[0]
    assert (got.abs() <= SUBNORMAL).all()


@pytest.mark.parametrize("case", ["normal", "lognormal", "cauchy", "relu_outlier", "constant"])
def test_per_channel_percentiles_within_one_percent(case: str, block) -> None:
    g = torch.Generator().manual_seed(8)
    scales = torch.tensor([1, 10, 1e-3, 100, 1e-6, 3e5]).view(1, 6, 1, 1)
    base = DATA[case](g).repeat(15)[:6 * 6 * 20 * 20]
    x = base[torch.randperm(base.numel(), generator=g)].reshape(6, 6, 20, 20) * scales
    x[:, 5] = torch.relu(x[:, 5]) + 1e3
    got = sketch_of(x, 1).quantiles(PERCENTILES)
    for c in range(6):
        assert worst_relative_error(got[c], x[:, c].reshape(-1)) <= ALPHA * (1 + 1e-9)


def test_empty_sketch_gives_nan() -> None:
    got = sketch_of(torch.full((10,), math.nan)).quantiles([50])
    assert math.isnan(got.item())


def test_a_range_beyond_the_span_collapses_only_its_smallest_values() -> None:
    """Values more than SPAN buckets below the largest magnitude land in the lowest bucket;
    the others keep the bound."""
    x = torch.cat([torch.full((10,), 1e-25), torch.rand(1000) + 1.0, torch.tensor([1e6])])
    sketch = sketch_of(x)
    assert sketch.width == SPAN
    got = sketch.quantiles([50, 99])[0]
    assert worst_relative_error(got, x, [50, 99]) <= ALPHA * (1 + 1e-9)
    assert 0 < sketch.quantiles([0.5])[0, 0].item() <= 1e6 * 2.0 ** -62


# ----------------------------------------------------------------------------- splits


def splits(n: int, seed: int) -> list[list[int]]:
    """Several ways to cut ``n`` samples into batches."""
    rng = random.Random(seed)
    ways = [[n], [1] * n, [n - 1, 1], [1, n - 1]]
    for _ in range(3):
        cuts = sorted(rng.sample(range(1, n), rng.randint(1, n - 1)))
        ways.append([b - a for a, b in zip([0, *cuts], [*cuts, n], strict=True)])
    return ways


def identical(a: Sketch, b: Sketch) -> bool:
    """Every field equal, bit for bit."""
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for x, y in zip(vars(a).values(), vars(b).values(), strict=True))


def merged_sketch(parts: list[torch.Tensor], dim: int | None, order: str) -> Sketch:
    sketches = [sketch_of(p, dim) for p in parts]
    if order == "reversed":
        sketches.reverse()
    if order == "tree":  # as ranks would: pairs, then pairs of pairs
        while len(sketches) > 1:
            pairs = [sketches[i:i + 2] for i in range(0, len(sketches), 2)]
            sketches = [p[0].merge(p[1]) if len(p) == 2 else p[0] for p in pairs]
        return sketches[0]
    out = sketches[0]
    for s in sketches[1:]:
        out = out.merge(s)
    return out


def spread_batches(g: torch.Generator) -> torch.Tensor:
    """Batches with very different ranges, so merges coarsen the grid several times."""
    scales = torch.tensor([1e-3, 1.0, 1e4, 0.5, 30.0, 1e-6, 2.0, 7.0]).view(8, 1, 1, 1)
    x = torch.randn(8, 4, 6, 6, generator=g) * scales + torch.arange(8.0).view(8, 1, 1, 1)
    x[2, 1] = 0.0
    x[5, 0, 0, 0] = math.nan
    return torch.relu(x) if bool(torch.rand(1, generator=g) > 2) else x


@pytest.mark.parametrize("dim", [None, 1])
def test_sketch_is_identical_for_every_split_and_merge_order(dim, block) -> None:
    x = spread_batches(torch.Generator().manual_seed(9))
    whole = sketch_of(x, dim)
    for way in splits(x.shape[0], 10):
        for order in ("forward", "reversed", "tree"):
            assert identical(merged_sketch(list(x.split(way)), dim, order), whole), (way, order)


def test_collapsed_channel_sketches_equal_the_whole_sketch(block) -> None:
    x = spread_batches(torch.Generator().manual_seed(11))
    assert identical(sketch_of(x, 1).collapse(), sketch_of(x, None))


def test_device_path_gives_the_identical_sketch(block) -> None:
    x = spread_batches(torch.Generator().manual_seed(12))
    view = ChannelView.of(x, 1)
    flat = replace(view, blocked=False)
    assert identical(Sketch.of(view, *finite_range(view)[:2]),
                     Sketch.of(flat, *finite_range(flat)[:2]))


@pytest.mark.parametrize("dim", [None, 1])
def test_float32_and_float64_values_share_the_grid(dim) -> None:
    """A float32 value lands in the same bucket as its float64 copy: sketches of both
    give the same counts and percentiles."""
    x = spread_batches(torch.Generator().manual_seed(16))
    x[5, 0, 0, 0] = 0.5
    single, double = sketch_of(x, dim), sketch_of(x.double(), dim)
    assert identical(single, double)


def test_sketch_memory_is_the_range_that_occurs() -> None:
    """Dense over the buckets between the smallest and largest magnitude, PER_OCTAVE per octave,
    one side per sign that occurs, never more than SPAN per sign."""
    positive = sketch_of(torch.tensor([1.0, 2.0, 4.0 - 1e-6]))
    # 1 is bucket 0 and 4 - 1e-6 the last of the second octave: two octaves, and the zeros.
    assert positive.counts.shape == (1, 1 + 2 * PER_OCTAVE) and not positive.negative
    both = sketch_of(torch.tensor([-1.0, 3.0]), None)
    # 3 = 2 * 1.5 is bucket PER_OCTAVE + floor(PER_OCTAVE * log2(1.5)), per sign.
    width = PER_OCTAVE + math.floor(PER_OCTAVE * math.log2(1.5)) + 1
    assert both.counts.shape == (1, 2 * width + 1)
    wide = sketch_of(torch.randn(2, 16, 5, 5) * 1e30, 1)
    assert wide.counts.shape[0] == 16 and wide.counts.shape[1] <= 2 * SPAN + 1


# ----------------------------------------------------------------------------- collect_stats


def test_collect_stats_per_channel_matches_independent_hooks(tiny_net) -> None:
    batches = [torch.randn(3, 3, 12, 12), torch.randn(2, 3, 12, 12)]
    report = collect_stats(tiny_net, batches, per_channel=True, percentiles="1,50,99.9")
    assert hook_count(tiny_net) == 0
    outputs: dict[str, list[torch.Tensor]] = {}
    handles = [m.register_forward_hook(
        lambda m, a, o, n=name: outputs.setdefault(n, []).append(o.detach().double().clone()))
        for name, m in tiny_net.named_modules() if name in ("conv1", "block.1", "fc")]
    with torch.no_grad():
        for b in batches:
            tiny_net(b)
    for h in handles:
        h.remove()
    rows = {r.name: r for r in report.layers if r.call == 0}
    for name, tensors in outputs.items():
        x = torch.cat(tensors)
        row = rows[name]
        assert row.channel_dim == 1 and row.channels is not None and row.percentiles is not None
        assert_rows_close(row.channels, per_channel_reference(x, 1))
        assert set(row.channels[0]) == ROW_KEYS | {"percentiles"}
        assert list(row.percentiles) == ["1", "50", "99.9"]
        got = torch.tensor(list(row.percentiles.values()), dtype=torch.float64)
        assert worst_relative_error(got, x.reshape(-1), (1, 50, 99.9)) <= ALPHA * (1 + 1e-9)


def doc_of(report: StatsReport) -> list[dict]:
    return json.loads(json.dumps(report.to_dict()["layers"]))


def assert_same_run(a: list[dict], b: list[dict]) -> None:
    """Counts, min and max exactly, moments within 1e-6, sketches (percentiles) identically:
    what a two-process run must give against one process."""
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b, strict=True):
        assert row_a["percentiles"] == row_b["percentiles"]
        for ch_a, ch_b in zip(row_a["channels"], row_b["channels"], strict=True):
            for key in ("channel", "count", "min", "max", "zero_fraction", "nonfinite",
                        "percentiles"):
                assert ch_a[key] == ch_b[key], key
            for key in ("mean", "std"):
                assert ch_a[key] == pytest.approx(ch_b[key], rel=1e-6, abs=1e-12), key


OPTIONS = {"per_channel": True, "percentiles": [0.1, 50, 99.9, 99.99]}


def test_reports_merged_like_ranks_equal_one_run(tiny_net) -> None:
    x = torch.randn(7, 3, 10, 10, generator=torch.Generator().manual_seed(13))
    # The same batch shapes on both sides, so the convolutions give the same outputs.
    one = collect_stats(tiny_net, list(x.split(2)), **OPTIONS)
    ranks = [collect_stats(tiny_net, list(part.split(2)), **OPTIONS) for part in x.split([4, 3])]
    assert_same_run(doc_of(ranks[0].merge(ranks[1])), doc_of(one))


class Elementwise(nn.Module):
    """Outputs that do not depend on how samples are batched."""

    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.tanh = nn.Tanh()

    def forward(self, x):
        scale = torch.tensor([1e-3, 1.0, 1e3], dtype=x.dtype).view(1, 3, 1, 1)
        return self.tanh(self.relu(x * scale + 0.5))


@pytest.mark.parametrize("way", splits(9, 14))
def test_any_batch_split_gives_the_same_report(way) -> None:
    x = torch.randn(9, 3, 6, 6, generator=torch.Generator().manual_seed(15)) * 3
    model = Elementwise().eval()
    one = collect_stats(model, x, **OPTIONS)
    assert_same_run(doc_of(collect_stats(model, list(x.split(way)), **OPTIONS)), doc_of(one))


def test_json_fields_only_when_asked(tiny_net) -> None:
    x = torch.randn(2, 3, 8, 8)
    plain = collect_stats(tiny_net, x).to_dict()["layers"][0]
    assert not {"channels", "channel_dim", "percentiles"} & set(plain)
    only = collect_stats(tiny_net, x, percentiles=[99.90, 50.0]).to_dict()["layers"][0]
    assert list(only["percentiles"]) == ["99.9", "50"] and "channels" not in only
    both = collect_stats(tiny_net, x, per_channel=True).to_dict()["layers"][0]
    assert len(both["channels"]) == 8 and "percentiles" not in both["channels"][0]


class TokenNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 12)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.proj(x))


def test_token_outputs_use_the_last_dimension() -> None:
    torch.manual_seed(0)
    model = TokenNet().eval()
    x = torch.randn(3, 5, 6)
    rows = collect_stats(model, x, per_channel=True).layers
    with torch.no_grad():
        out = model.proj(x)
    assert [r.channel_dim for r in rows] == [2, 2]
    assert rows[0].channels is not None and len(rows[0].channels) == 12
    assert_rows_close(rows[0].channels, per_channel_reference(out, 2))


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize("text,want", [("0.1,99.9,99.99", (0.1, 99.9, 99.99)),
                                       (" 50 , 99.90,99.9", (50.0, 99.9)), ("0,100", (0.0, 100.0))])
def test_parse_percentiles(text, want) -> None:
    assert parse_percentiles(text) == want


@pytest.mark.parametrize("value,key", [(99.9, "99.9"), (50.0, "50"), (0.001, "0.001"),
                                       (1e-7, "0.0000001"), (100, "100"), (0.0, "0")])
def test_percentile_keys_are_normalised(value, key) -> None:
    assert percentile_key(value) == key


@pytest.mark.parametrize("text", ["", " ", "abc", "1,,2", "101", "-0.5", "nan", "inf"])
def test_bad_percentiles_name_the_parameter(text) -> None:
    with pytest.raises(HookscopeError) as info:
        parse_percentiles(text)
    assert str(info.value).startswith("percentiles") and "\n" not in str(info.value)


def test_cli_bad_percentiles_is_one_line_exit_2(cli, cat_jpg) -> None:
    result = cli("stats", "resnet18", cat_jpg, "--weights", "none", "--percentiles", "5,abc")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--percentiles" in lines[0] and "'abc'" in lines[0]


def test_cli_per_channel_json_csv_and_table(cli, cat_jpg) -> None:
    args = ["stats", "resnet18", cat_jpg, "--weights", "none", "--size", "64", "--layers",
            "layer4.1.*", "--per-channel", "--percentiles", "0.1,99.9"]
    doc = json.loads(cli(*args, "--format", "json").stdout)
    relu = next(r for r in doc["layers"] if r["type"] == "ReLU")
    assert len(relu["channels"]) == 512 and set(relu["percentiles"]) == {"0.1", "99.9"}
    csv_out = cli(*args, "--format", "csv").stdout.splitlines()
    header = csv_out[0].split(",")
    assert header[:12] == ["name", "type", "call", "input_shapes", "output_shape", "mean", "std",
                           "min", "max", "zero_fraction", "nonfinite", "output_shapes"]
    assert header[12:] == ["p0.1", "p99.9", "channel_dim", "channel", "channel_count",
                           "channel_mean", "channel_std", "channel_min", "channel_max",
                           "channel_zero_fraction", "channel_nonfinite", "channel_p0.1",
                           "channel_p99.9"]
    assert len(csv_out) == 1 + 512 * len(doc["layers"])
    table = cli(*args).stdout
    dead = sum(ch["zero_fraction"] >= 0.99 for ch in relu["channels"])
    assert "dead ch." in table and dead > 0
    line = next(ln for ln in table.splitlines() if f"{relu['name']} " in ln and "ReLU" in ln)
    assert line.split()[-3] == str(dead)


def test_no_percentiles_is_not_an_error() -> None:
    assert parse_percentiles(None) == parse_percentiles(()) == parse_percentiles([]) == ()


def test_table_counts_dead_channels() -> None:
    from hookscope.render import tables

    channels = [{"channel": i, "zero_fraction": z} for i, z in enumerate([1.0, 0.995, 0.5, 0.99, 0])]
    rows = [{"name": "relu", "type": "ReLU", "call": 0, "channels": channels,
             "percentiles": {"0.1": 0.0, "99.9": 2.5}},
            {"name": "conv", "type": "Conv2d", "call": 0, "channels": channels[2:3],
             "percentiles": {"0.1": -1.5, "99.9": 2.0}}]
    table = tables.stats_table(rows, per_channel=True, percentiles=("0.1", "99.9"))
    cells = {c.header: [cell.plain for cell in c.cells] for c in table.columns}
    assert cells["dead ch."] == ["3", "0"]
    assert cells["p99.9"] == ["2.5", "2"]


@pytest.mark.parametrize("width", [80, 120])
def test_table_with_per_channel_and_percentiles_fits_the_width(tiny_net, width) -> None:
    import io

    from rich.console import Console

    from hookscope.render import tables

    report = collect_stats(tiny_net, torch.randn(2, 3, 8, 8), per_channel=True,
                           percentiles="0.1,99.9,99.99")
    doc = {"model": "tiny", "weights": {"loaded": "seed 0"}, "device": "cpu", "inputs": ["x"],
           **report.to_dict()}
    view = tables.stats_view(doc, per_channel=True, percentiles=("0.1", "99.9", "99.99"))
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(view)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width and "…" not in out.getvalue()
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(view)
    head = out.getvalue().splitlines()[1]
    # The percentiles asked for are the last columns, after the dead channels.
    assert head.split()[-5:] == ["dead", "ch.", "p0.1", "p99.9", "p99.99"], head
