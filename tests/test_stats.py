"""Statistics against independent float64 computations, and the collector's bookkeeping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hookscope.core.hooks import hook_count
from hookscope.numerics.moments import Moments, device_values, host_values, moments
from hookscope.probes.stats import collect_stats, top_predictions

REL = 1e-4


def reference(x: torch.Tensor) -> dict[str, float]:
    """float64 statistics over the finite values, computed the plain way."""
    flat = x.detach().reshape(-1).double()
    finite = flat[torch.isfinite(flat)]
    n = finite.numel()
    return {
        "mean": finite.mean().item() if n else math.nan,
        "std": finite.std().item() if n > 1 else math.nan,
        "min": finite.min().item() if n else math.nan,
        "max": finite.max().item() if n else math.nan,
        "zero_fraction": (flat == 0).sum().item() / flat.numel(),
        "nonfinite": flat.numel() - n,
    }


def assert_close(got: dict, want: dict, rel: float = REL) -> None:
    for key, expected in want.items():
        value = got[key]
        if isinstance(expected, float) and math.isnan(expected):
            assert math.isnan(value), key
        else:
            assert value == pytest.approx(expected, rel=rel, abs=1e-12), key


def _from(values) -> dict:
    return Moments.from_values(values).summary()


CASES = {
    "normal": lambda g: torch.randn(4, 8, 16, 16, generator=g),
    "mean_1e4_std": lambda g: 1e4 + torch.randn(3, 64, 32, generator=g),
    "mean_1e4_std_negative": lambda g: -5e3 + 0.5 * torch.randn(50_000, generator=g),
    "all_zero": lambda g: torch.zeros(2, 3, 5, 5),
    "constant": lambda g: torch.full((7, 9), 3.3),
    "relu_like": lambda g: torch.relu(torch.randn(2, 16, 8, 8, generator=g)),
    "nan_inf": lambda g: torch.tensor([1.0, float("nan"), -2.5, float("inf"), 0.0, -float("inf")]),
    "all_nan": lambda g: torch.full((4,), float("nan")),
    "huge_finite": lambda g: torch.tensor([3e38, -3e38, 1.0, 0.0]),
    "single": lambda g: torch.tensor([2.0]),
    "large_chunked": lambda g: torch.relu(torch.randn(3 * (1 << 20) + 17, generator=g)) + 7e3,
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("path", ["host", "device"])
def test_moments_match_float64_reference(case: str, path: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = CASES[case](g)
    flat = x.reshape(-1)
    values = host_values(flat) if path == "host" else device_values(flat).tolist()
    assert_close(_from(values), reference(x))


def test_merge_across_batches_equals_whole_tensor() -> None:
    g = torch.Generator().manual_seed(2)
    parts = [100 + torch.randn(n, generator=g) * s for n, s in [(10, 1.0), (1000, 3.0), (1, 1.0)]]
    parts.append(torch.tensor([float("nan"), 0.0, 0.0]))
    merged = Moments()
    for part in parts:
        merged = merged.merge(moments(part))
    assert_close(merged.summary(), reference(torch.cat(parts)))


def test_merge_is_not_an_average_of_averages() -> None:
    a, b = torch.zeros(1), torch.ones(99)
    merged = moments(a).merge(moments(b))
    assert merged.summary()["mean"] == pytest.approx(0.99)


class Recorder:
    """Independent hooks that keep float64 copies of outputs (and inputs), per call."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        self.outputs: dict[tuple[str, int], list[torch.Tensor]] = {}
        self.inputs: dict[tuple[str, int], list[torch.Tensor]] = {}
        self.handles = []
        self.counts: dict[str, int] = {}
        for name, module in model.named_modules():
            if name in names:
                self.handles.append(module.register_forward_pre_hook(self._pre(name)))
                self.handles.append(module.register_forward_hook(self._post(name)))

    def _pre(self, name):
        def hook(module, args):
            self.counts[name] = self.counts.get(name, 0) + 1
            key = (name, self.counts[name] - 1)
            self.inputs.setdefault(key, []).append(args[0].detach().double().clone())
        return hook

    def _post(self, name):
        def hook(module, args, output):
            key = (name, self.counts[name] - 1)
            self.outputs.setdefault(key, []).append(output.detach().double().clone())
        return hook

    def new_pass(self) -> None:
        self.counts.clear()

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def test_collect_stats_matches_independent_hooks(tiny_net) -> None:
    names = ["conv1", "relu", "block.0", "block.1", "pool", "fc"]
    batches = [torch.randn(3, 3, 12, 12), torch.randn(2, 3, 12, 12)]
    report = collect_stats(tiny_net, batches, input_stats=True)
    assert hook_count(tiny_net) == 0

    rec = Recorder(tiny_net, names)
    with torch.no_grad():
        for b in batches:
            rec.new_pass()
            tiny_net(b)
    rec.close()

    keys = [(r.name, r.call) for r in report.layers]
    # Execution order; the shared ReLU module gets one row per call.
    assert keys == [("conv1", 0), ("relu", 0), ("block.0", 0), ("block.1", 0), ("relu", 1),
                    ("pool", 0), ("fc", 0)]
    for row in report.layers:
        want = reference(torch.cat([t.reshape(-1) for t in rec.outputs[(row.name, row.call)]]))
        assert_close(row.to_dict(), want)
        want_in = reference(torch.cat([t.reshape(-1) for t in rec.inputs[(row.name, row.call)]]))
        assert_close(row.input_stats, want_in)
    conv = report.layers[0]
    assert conv.input_shapes == [[3, 3, 12, 12]] and conv.output_shape == [3, 8, 12, 12]
    assert report.input_shape == [3, 12, 12]
    assert len(report.predictions) == 5 and len(report.predictions[0]) == 5


def test_stats_taken_before_following_inplace_relu(tiny_net) -> None:
    x = torch.randn(2, 3, 10, 10)
    report = collect_stats(tiny_net, x, layers=["conv1"])
    with torch.no_grad():
        conv_out = tiny_net.conv1(x)
    assert conv_out.min() < 0  # so an in-place ReLU would have changed it
    assert report.layers[0].min == pytest.approx(conv_out.min().item(), rel=1e-5)
    assert report.layers[0].zero_fraction == 0.0


class TupleOut(nn.Module):
    def forward(self, x):
        return (x * 2, {"aux": x[:, :1]})


class WithTuple(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.split = TupleOut()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        main, extra = self.split(x)
        return self.head(main + extra["aux"])


def test_tuple_and_dict_outputs_use_first_tensor_and_record_all_shapes() -> None:
    model = WithTuple().eval()
    x = torch.randn(3, 4)
    row = collect_stats(model, x, layers=["split"]).layers[0]
    assert row.output_shapes == [[3, 4], [3, 1]]
    assert row.output_shape == [3, 4]
    assert row.mean == pytest.approx((x * 2).double().mean().item(), rel=1e-5)


class Boom(nn.Module):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.exc = exc

    def forward(self, x):
        self.conv(x)
        raise self.exc


def test_hooks_removed_after_a_model_error() -> None:
    from hookscope.core.errors import ForwardError

    model = Boom(RuntimeError("mid-forward"))
    with pytest.raises(ForwardError) as info:
        collect_stats(model, torch.randn(1, 3, 4, 4))
    # Raised by the model's own code after conv returned: blamed on the model, not on conv.
    assert info.value.module == "" and info.value.type_name == "Boom"
    assert isinstance(info.value.cause, RuntimeError) and "mid-forward" in str(info.value)
    assert info.value.exit_code == 1
    assert hook_count(model) == 0


def test_hooks_removed_after_ctrl_c() -> None:
    model = Boom(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):  # passed through as it is, never wrapped
        collect_stats(model, torch.randn(1, 3, 4, 4))
    assert hook_count(model) == 0


def test_forward_error_names_innermost_module() -> None:
    from hookscope.core.errors import ForwardError

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(7, 2))
    with pytest.raises(ForwardError) as info:
        collect_stats(model, torch.randn(1, 3, 8, 8))
    assert info.value.module == "2" and info.value.type_name == "Linear"
    assert hook_count(model) == 0


def test_training_flag_and_grads_untouched(tiny_net) -> None:
    tiny_net.train()
    collect_stats(tiny_net, torch.randn(2, 3, 8, 8))
    assert tiny_net.training
    assert all(p.grad is None for p in tiny_net.parameters())


def test_selection_filters(tiny_net) -> None:
    assert {r.type for r in collect_stats(tiny_net, torch.randn(1, 3, 8, 8),
                                          types=["Conv2d"]).layers} == {"Conv2d"}
    rows = collect_stats(tiny_net, torch.randn(1, 3, 8, 8), max_depth=1).layers
    assert "block" in [r.name for r in rows] and "block.0" not in [r.name for r in rows]
    rows = collect_stats(tiny_net, torch.randn(1, 3, 8, 8), all_modules=True).layers
    assert {"block", "block.0"} <= {r.name for r in rows}


def test_top_predictions_labels_and_order() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 0.0]])
    preds = top_predictions(logits, ["a", "b", "c"], k=2)
    assert [p.index for p in preds[0]] == [1, 2]
    assert preds[0][0].label == "b"
    assert preds[1][0].prob == pytest.approx(torch.softmax(logits[1], 0)[0].item())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_without_per_layer_sync(tiny_net) -> None:
    x = torch.randn(2, 3, 16, 16)
    cpu = collect_stats(tiny_net, x)
    model = tiny_net.cuda()
    hooks = [
        model.register_forward_pre_hook(lambda m, a: torch.cuda.set_sync_debug_mode("error")),
        model.register_forward_hook(lambda m, a, o: torch.cuda.set_sync_debug_mode(0)),
    ]
    try:
        gpu = collect_stats(model, x)
    finally:
        torch.cuda.set_sync_debug_mode(0)
        for h in hooks:
            h.remove()
    for a, b in zip(cpu.layers, gpu.layers, strict=True):
        assert a.mean == pytest.approx(b.mean, rel=1e-3, abs=1e-5)
        assert a.zero_fraction == b.zero_fraction


def test_scratch_made_in_inference_mode_is_usable_outside_it() -> None:
    import hookscope.numerics.moments as numerics

    numerics._local.__dict__.clear()
    with torch.inference_mode():  # per-channel moments first make the reused buffer here
        numerics.moments_matrix(numerics.ChannelView.of(torch.zeros(2, 3, 8) - 1, 1))
    assert numerics._local.bufs
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    (g,) = torch.autograd.grad((x * x).sum(), x)
    got = numerics.moments_matrix(numerics.ChannelView.of(g, 1))[2]
    # float32 sums of 16 values of magnitude below 10: eps * 10 * sqrt(16) < 5e-6
    assert got.tolist() == pytest.approx((2 * x).double().mean(dim=(0, 2)).tolist(), abs=5e-6)
