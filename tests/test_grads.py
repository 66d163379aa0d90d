"""hookscope.probes.grads and `hookscope grads`: output and parameter gradients against
torch.autograd.grad computed here, flags, the non-finite origin, and model state."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import pytest
import torch
from torch import nn

from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count
from hookscope.probes.grads import collect_grads

from .conftest import TinyNet

ARGS = ("--weights", "none", "--size", "64")


def reference(net: TinyNet, x: torch.Tensor, classes: list[int]) -> dict:
    """TinyNet's forward written out with an out-of-place ReLU, differentiated directly."""
    a = net.conv1(x)
    r1 = torch.relu(a)
    b0 = net.block[0](r1)
    b1 = net.block[1](b0)
    r2 = torch.relu(b1)
    p = net.pool(r2)
    f = net.fc(p.flatten(1))
    objective = f[torch.arange(len(classes)), torch.tensor(classes)].sum()
    params = list(net.named_parameters())
    outs = {("fc", 0): f, ("pool", 0): p, ("relu", 1): r2, ("block.1", 0): b1,
            ("block.0", 0): b0, ("relu", 0): r1, ("conv1", 0): a}
    grads = torch.autograd.grad(objective, [*outs.values(), *(q for _, q in params)])
    layer = dict(zip(outs, grads[:len(outs)], strict=True))
    param = {n: g for (n, _), g in zip(params, grads[len(outs):], strict=True)}
    return {"layers": layer, "params": param, "order": list(outs)}


def check_row(row, g: torch.Tensor) -> None:
    g = g.detach().double()
    assert row.shape == list(g.shape)
    assert row.norm == pytest.approx(float(g.norm()), rel=1e-5, abs=1e-12)
    # The mean can be ~0 by cancellation (a softmax gradient sums to zero): absolute slack.
    assert row.mean == pytest.approx(float(g.mean()), rel=1e-4, abs=1e-6 * float(g.abs().max()))
    assert row.std == pytest.approx(float(g.std()), rel=1e-4, abs=1e-12)
    assert row.max_abs == pytest.approx(float(g.abs().max()), rel=1e-6, abs=1e-12)
    assert row.nonfinite == 0


def test_output_and_param_gradients_match_autograd_with_inplace_relu(tiny_net):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 12, 12)
    report = collect_grads(tiny_net, x, target="1,3")
    ref = reference(tiny_net, x, [1, 3])
    # conv1 and block.1 are followed by an in-place ReLU: their rows must be the gradient
    # of their own output, which the out-of-place reference gives.
    assert [(r.name, r.call) for r in report.layers] == ref["order"]
    for row in report.layers:
        check_row(row, ref["layers"][(row.name, row.call)])
    assert report.targets == [1, 3]
    for p in report.params:
        g = ref["params"][p.name].double()
        w = dict(tiny_net.named_parameters())[p.name].detach().double()
        assert p.grad_norm == pytest.approx(float(g.norm()), rel=1e-5)
        assert p.weight_norm == pytest.approx(float(w.norm()), rel=1e-6)
        if float(w.norm()) == 0:  # BatchNorm's zero-initialised bias: no ratio
            assert math.isnan(p.ratio)
        else:
            assert p.ratio == pytest.approx(float(g.norm() / w.norm()), rel=1e-5)
    # The shared ReLU's first call saw zeros where conv1 was negative.
    assert report.layers[-1].name == "conv1"


def test_batches_merge_exactly_and_objectives_add(tiny_net):
    torch.manual_seed(2)
    x = torch.randn(3, 3, 10, 10)
    whole = collect_grads(tiny_net, x, target="2")
    split = collect_grads(tiny_net, [x[:1], x[1:]], target="2")
    assert split.objective == pytest.approx(whole.objective, rel=1e-5)
    for a, b in zip(whole.layers, split.layers, strict=True):
        assert (a.name, a.call, a.shape) == (b.name, b.call, b.shape)
        assert b.norm == pytest.approx(a.norm, rel=1e-5)
        assert b.std == pytest.approx(a.std, rel=1e-4)
    for a, b in zip(whole.params, split.params, strict=True):
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)


def test_cross_entropy_gradient_at_logits(tiny_net):
    torch.manual_seed(3)
    x = torch.randn(2, 3, 8, 8)
    report = collect_grads(tiny_net, x, loss="ce", label="0,4")
    with torch.no_grad():
        logits = tiny_net(x).double()
    expected = torch.softmax(logits, 1) - nn.functional.one_hot(torch.tensor([0, 4]), 5)
    fc = report.layers[0]
    assert fc.name == "fc"
    check_row(fc, expected)
    assert report.objective == pytest.approx(
        float(nn.functional.cross_entropy(logits, torch.tensor([0, 4]), reduction="sum")),
        rel=1e-5)


def test_model_state_restored_no_grad_no_hooks(tiny_net):
    tiny_net.train()
    tiny_net.block[1].eval()
    before = {k: v.clone() for k, v in tiny_net.state_dict().items()}
    collect_grads(tiny_net, torch.randn(1, 3, 8, 8))
    assert tiny_net.training and tiny_net.conv1.training and not tiny_net.block[1].training
    assert all(p.grad is None for p in tiny_net.parameters())
    assert hook_count(tiny_net) == 0
    for k, v in tiny_net.state_dict().items():  # eval mode: BatchNorm statistics untouched
        assert torch.equal(v, before[k]), k


def test_hooks_removed_after_exception(tiny_net):
    def boom(module, args):
        raise RuntimeError("boom")

    handle = tiny_net.pool.register_forward_pre_hook(boom)
    tiny_net.train()
    with pytest.raises(HookscopeError, match="pool"):
        collect_grads(tiny_net, torch.randn(1, 3, 8, 8))
    handle.remove()
    assert hook_count(tiny_net) == 0
    assert tiny_net.training
    assert all(p.grad is None for p in tiny_net.parameters())


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def identity_linear(n: int = 8) -> nn.Linear:
    lin = nn.Linear(n, n)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(n))
        lin.bias.zero_()
    return lin


def test_vanish_and_explode_flags():
    # Gradient norms at module outputs: head and c0..c5 = 1, big = 1, e = 1e4 (explode),
    # small = 1e4 (explode), v = 1e-8 * 1e4 = 1e-4 (vanish); the median is 1.
    layers = [("v", identity_linear()), ("small", Scale(1e-8)), ("e", identity_linear()),
              ("big", Scale(1e4))]
    layers += [(f"c{i}", identity_linear()) for i in range(6)] + [("head", identity_linear())]
    model = nn.Sequential(OrderedDict(layers)).eval()
    report = collect_grads(model, torch.ones(1, 8), target="0")
    norms = {r.name: r.norm for r in report.layers}
    assert norms["v"] == pytest.approx(1e-4, rel=1e-4)
    assert norms["e"] == pytest.approx(1e4, rel=1e-4)
    assert report.median_norm == pytest.approx(1.0)
    flags = {r.name: r.flag for r in report.layers}
    assert flags == {"v": "vanish", "small": "explode", "e": "explode", **{
        n: None for n in ("big", "head", *(f"c{i}" for i in range(6)))}}
    loose = collect_grads(model, torch.ones(1, 8), target="0", vanish=1e-5, explode=1e5)
    assert all(r.flag is None for r in loose.layers)


class InfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * math.inf


class InjectInf(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return InfGrad.apply(x)


def test_first_nonfinite_in_backward_order():
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict([
        ("l1", nn.Linear(4, 4)), ("l2", nn.Linear(4, 4)), ("inject", InjectInf()),
        ("l3", nn.Linear(4, 4)), ("head", nn.Linear(4, 3)),
    ])).eval()
    report = collect_grads(model, torch.randn(1, 4), target="0")
    assert [r.name for r in report.layers] == ["head", "l3", "inject", "l2", "l1"]
    assert [r.nonfinite for r in report.layers][:3] == [0, 0, 0]
    assert report.first_nonfinite == "l2"
    assert report.layers[3].flag == "nonfinite" and report.layers[3].nonfinite == 4
    assert report.nonfinite
    assert not math.isfinite(dict((p.name, p.grad_norm) for p in report.params)["l2.weight"])
    assert math.isfinite(dict((p.name, p.grad_norm) for p in report.params)["l3.weight"])


def test_bad_arguments(tiny_net):
    x = torch.randn(2, 3, 8, 8)
    # Library errors name the Python parameters, never command-line flags.
    with pytest.raises(HookscopeError, match="^loss ce needs label: "):
        collect_grads(tiny_net, x, loss="ce")
    with pytest.raises(HookscopeError, match="^label applies to loss ce"):
        collect_grads(tiny_net, x, label="1")
    with pytest.raises(HookscopeError, match="^label lists 3 labels for 2 input"):
        collect_grads(tiny_net, x, loss="ce", label="1,2,3", n_inputs=2)
    with pytest.raises(HookscopeError, match="not a rank"):
        collect_grads(tiny_net, x, loss="ce", label="top1")
    with pytest.raises(HookscopeError, match="out of range"):
        collect_grads(tiny_net, x, target="7")
    assert hook_count(tiny_net) == 0


# ---------------------------------------------------------------------------- CLI


def test_cli_json_contract(cli, cat_jpg):
    result = cli("grads", "resnet18", cat_jpg, *ARGS, "--layers", "layer4.*", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["command"] == "grads" and doc["weights"]["loaded"].startswith("random")
    assert {"model", "device", "inputs", "layers", "params"} <= set(doc)
    row = doc["layers"][0]
    assert set(row) == {"name", "type", "call", "shape", "norm", "mean", "std", "max_abs",
                        "nonfinite", "flag"}
    assert all(r["name"].startswith("layer4.") for r in doc["layers"])
    # Backward order: layer4.1's second ReLU call comes first.
    assert (doc["layers"][0]["name"], doc["layers"][0]["call"]) == ("layer4.1.relu", 1)
    assert set(doc["params"][0]) == {"name", "grad_norm", "weight_norm", "ratio"}
    assert len(doc["params"]) == 62


def test_cli_table_csv_and_ce(cli, cat_jpg):
    result = cli("grads", "resnet18", cat_jpg, *ARGS, "--loss", "ce", "--label", "tabby",
                 "--layers", "fc")
    assert result.exit_code == 0, result.stderr
    assert "cross-entropy" in result.stdout and "fc" in result.stdout
    assert "parameters" in result.stdout
    result = cli("grads", "resnet18", cat_jpg, *ARGS, "--layers", "fc", "--format", "csv")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("kind,name,type,call,shape,norm")
    assert lines[1].startswith("layer,fc,Linear,0,1x1000,")
    assert sum(line.startswith("param,") for line in lines) == 62


def test_cli_fail_on_nonfinite(cli, tmp_path):
    x = torch.zeros(3, 64, 64)
    x[0, 10, 10] = math.inf
    path = tmp_path / "inf.pt"
    torch.save(x, path)
    result = cli("grads", "resnet18", path, *ARGS, "--format", "json", "--fail-on-nonfinite")
    assert result.exit_code == 1, result.stderr
    doc = json.loads(result.stdout)  # the report is still printed
    assert any(p["grad_norm"] is None for p in doc["params"])
    assert "non-finite gradient" in result.stderr
    ok = cli("grads", "resnet18", path, *ARGS, "--format", "json")
    assert ok.exit_code == 0


@pytest.mark.parametrize("extra, message", [
    (("--loss", "ce"), "needs --label"),
    (("--loss", "ce", "--label", "tabbby"), "Did you mean"),
    (("--target", "1,2"), "give one target for all inputs"),
    (("--layers", "nope*"), "hookscope layers"),
])
def test_cli_bad_input(cli, cat_jpg, extra, message):
    result = cli("grads", "resnet18", cat_jpg, *ARGS, *extra)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert "Traceback" not in result.stderr


def test_python_api_export(tiny_net):
    import hookscope

    report = hookscope.collect_grads(tiny_net, torch.randn(1, 3, 8, 8))
    assert isinstance(report, hookscope.GradReport)
    assert report.to_dict()["layers"][0]["name"] == "fc"
