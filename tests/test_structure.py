"""`hookscope layers` and hookscope.structure: counts and shapes against direct computation."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from hookscope.errors import HookscopeError
from hookscope.hooks import find_site, hook_count, select_sites
from hookscope.models import load_model
from hookscope.structure import model_structure


def by_name(structure) -> dict:
    return {layer.name: layer for layer in structure.layers}


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def resnet18() -> nn.Module:
    return load_model("resnet18", weights="none", seed=0).model


# ----------------------------------------------------------------------------- library


def test_tiny_net_counts_shapes_and_the_shared_relu(tiny_net) -> None:
    x = torch.randn(2, 3, 16, 16)
    found = model_structure(tiny_net, x)
    rows = by_name(found)

    assert found.params == n_params(tiny_net)
    assert sum(r.params for r in found.layers) + found.root.params == n_params(tiny_net)
    assert rows["conv1"].params == tiny_net.conv1.weight.numel() + tiny_net.conv1.bias.numel()
    assert rows["block"].params == 0
    assert rows["block"].params_total == n_params(tiny_net.block)
    assert [r.depth for r in found.layers if r.name.startswith("block")] == [1, 2, 2]

    # Shapes from running the submodules directly.
    with torch.no_grad():
        a = tiny_net.conv1(x)
        b = tiny_net.block(torch.relu(a))
    relu_calls = rows["relu"].calls
    assert len(relu_calls) == 2
    assert relu_calls[0].output_shape == list(a.shape)
    assert relu_calls[1].input_shapes == [list(b.shape)]
    assert rows["fc"].calls[0].output_shape == [2, 5]
    assert found.root.calls[0].input_shapes == [[2, 3, 16, 16]]
    assert found.input_shape == [3, 16, 16]
    assert found.modules == len(list(tiny_net.modules())) - 1
    assert hook_count(tiny_net) == 0
    assert not tiny_net.training


class Shared(nn.Module):
    """One Linear registered under two names, and a weight tied between two modules."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 4)
        self.again = self.enc  # the same module twice
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.scale = nn.Parameter(torch.ones(4))  # owned by the root itself

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.again(self.enc(x)) * self.scale)


def test_shared_modules_and_tied_weights_count_once() -> None:
    model = Shared()
    found = model_structure(model, torch.randn(3, 4))
    rows = by_name(found)
    expected = n_params(model)  # deduplicates, as the issue defines the total
    assert expected == 4 * 4 + 4 + 10 * 4 + 4
    assert found.params == expected
    assert found.root.params == 4  # `scale`
    assert sum(r.params for r in found.layers) + found.root.params == expected
    assert "again" not in rows  # listed once, under the name named_modules gives it
    assert len(rows["enc"].calls) == 2  # both calls of the one module
    assert rows["head"].params == 0 and rows["head"].params_total == 40
    for name in rows:
        find_site(model, name)


def test_trainable_flags_and_counts(tiny_net) -> None:
    tiny_net.conv1.requires_grad_(False)
    tiny_net.block[1].bias.requires_grad_(False)
    found = model_structure(tiny_net)
    rows = by_name(found)
    assert rows["conv1"].trainable is False
    assert rows["block"].trainable == "partial"
    assert rows["block.0"].trainable is True
    assert rows["relu"].trainable is None
    assert found.trainable_params == sum(p.numel() for p in tiny_net.parameters()
                                         if p.requires_grad)
    assert rows["conv1"].calls == []  # no example: no forward pass


def test_resnet18_totals_shapes_and_names(resnet18) -> None:
    x = torch.randn(1, 3, 64, 64)
    found = model_structure(resnet18, x)
    rows = by_name(found)
    assert found.params == n_params(resnet18) == 11_689_512
    for name in ("layer1", "layer2.0", "layer4.1.conv2", "fc"):
        assert rows[name].params_total == n_params(resnet18.get_submodule(name)), name

    m = resnet18
    with torch.no_grad():
        stem = m.maxpool(m.relu(m.bn1(m.conv1(x))))
        l1 = m.layer1(stem)
        block = m.layer2[0]
        mid = block.relu(block.bn1(block.conv1(l1)))
        down = block.downsample(l1)
        out = m.layer4(m.layer3(m.layer2(l1)))
    assert rows["maxpool"].calls[0].output_shape == list(stem.shape)
    relu = rows["layer2.0.relu"].calls  # BasicBlock calls its relu twice
    assert [c.output_shape for c in relu] == [list(mid.shape), list(down.shape)]
    assert rows["layer2.0.downsample"].calls[0].input_shapes == [list(l1.shape)]
    assert rows["avgpool"].calls[0].input_shapes == [list(out.shape)]
    assert found.root.calls[0].output_shape == [1, 1000]
    # Every listed name is accepted by --layers (stats) and --layer (the other commands).
    for name in rows:
        assert [s.name for s in select_sites(resnet18, layers=[name])] == [name]
        assert find_site(resnet18, name).name == name
    assert hook_count(resnet18) == 0


def test_dict_outputs_of_a_segmentation_model() -> None:
    model = load_model("lraspp_mobilenet_v3_large", weights="none").model
    x = torch.randn(1, 3, 64, 64)
    found = model_structure(model, x)
    rows = by_name(found)
    with torch.no_grad():
        feats = model.backbone(x)
        out = model(x)
    assert found.params == n_params(model)
    backbone = rows["backbone"].calls[0]
    assert backbone.output_shapes == [list(t.shape) for t in feats.values()]
    assert len(backbone.output_shapes) == 2
    assert found.root.calls[0].output_shapes == [list(out["out"].shape)]
    assert hook_count(model) == 0


def test_max_depth_cuts_the_list_but_not_the_counts(resnet18) -> None:
    found = model_structure(resnet18, max_depth=1)
    assert {r.depth for r in found.layers} == {1}
    assert by_name(found)["layer3"].params_total == n_params(resnet18.layer3)
    assert found.params == n_params(resnet18)
    assert found.modules == len(list(resnet18.modules())) - 1
    with pytest.raises(HookscopeError, match="max_depth"):
        model_structure(resnet18, max_depth=0)


def test_a_failing_forward_names_the_module_and_removes_hooks(resnet18) -> None:
    with pytest.raises(HookscopeError, match=r"conv1 \(Conv2d.*\[1, 1, 32, 32\]"):
        model_structure(resnet18, torch.zeros(1, 1, 32, 32))
    assert hook_count(resnet18) == 0


# ----------------------------------------------------------------------------- command line


def test_layers_json_contract(cli, resnet18) -> None:
    result = cli("layers", "resnet18", "--weights", "none", "--size", "64", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    for key in ("hookscope", "command", "model", "weights", "device", "inputs"):
        assert key in doc
    assert doc["command"] == "layers" and doc["inputs"] == []
    assert doc["totals"] == {
        "params": n_params(resnet18),
        "trainable_params": n_params(resnet18),
        "modules": len(list(resnet18.modules())) - 1,
    }
    assert [row["name"] for row in doc["layers"]] == [n for n, _ in resnet18.named_modules()][1:]
    row = next(r for r in doc["layers"] if r["name"] == "layer1.0.relu")
    assert set(row) >= {"name", "type", "depth", "params", "params_total", "trainable", "calls"}
    assert [c["output_shape"] for c in row["calls"]] == [[1, 64, 16, 16]] * 2
    assert set(row["calls"][0]) >= {"input_shapes", "output_shape"}


def test_layers_tree_names_work_in_stats(cli, cat_jpg) -> None:
    result = cli("layers", "resnet18", "--weights", "none", "--size", "64")
    assert result.exit_code == 0, result.stderr
    names = re.findall(r"[├└]── (\S+)", result.stdout)
    assert len(names) == 67 and "layer4.1.bn2" in names
    assert "→ #0 1x64x16x16  #1 1x64x16x16" in result.stdout  # a shared relu's two calls
    args = [a for n in names for a in ("--layers", n)]
    stats = cli("stats", "resnet18", cat_jpg, "--weights", "none", "--size", "64",
                "--format", "json", *args)
    assert stats.exit_code == 0, stats.stderr
    assert {row["name"] for row in json.loads(stats.stdout)["layers"]} == set(names)


def test_layers_with_an_input_and_csv(cli, cat_jpg, tmp_path) -> None:
    out = tmp_path / "layers.csv"
    result = cli("layers", "resnet18", cat_jpg, "--weights", "none", "--size", "64",
                 "--max-depth", "2", "--format", "csv", "--output", out)
    assert result.exit_code == 0, result.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == ("name,type,depth,params,params_total,trainable,call,input_shapes,"
                        "output_shape,output_shapes")
    # Booleans as JSON spells them (true/false), like every CSV.
    assert lines[1].startswith("conv1,Conv2d,1,9408,9408,true,0,1x3x64x64,1x64x32x32,")
    assert sum(1 for line in lines if line.startswith("relu,")) == 1
    again = cli("layers", "resnet18", "--weights", "none", "--size", "64", "-f", "csv",
                "--output", out)
    assert again.exit_code == 2 and "--force" in again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["resnet19"], "resnet18"),
        (["resnet18", "missing.jpg", "--weights", "none"], "missing.jpg"),
        (["resnet18", "--weights", "none", "--max-depth", "0"], "max-depth"),
    ],
)
def test_layers_bad_input(cli, args, message) -> None:
    result = cli("layers", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_tree_rendering(tiny_net) -> None:
    import io

    from rich.console import Console

    from hookscope.render.tree import layers_tree

    found = model_structure(tiny_net, torch.zeros(1, 3, 4, 4))
    doc = {"model": "tiny"} | found.to_dict()
    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(layers_tree(doc))
    lines = console.file.getvalue().splitlines()
    assert lines[0].startswith("tiny  TinyNet  869 params (own 0)  trainable  → 1x5")
    assert lines[1] == "├── conv1  Conv2d  224 params  trainable  → 1x8x4x4"
    assert lines[2] == "├── relu  ReLU  0 params  → #0 1x8x4x4  #1 1x8x4x4"
    assert lines[4] == "│   ├── block.0  Conv2d  584 params  trainable  → 1x8x4x4"
