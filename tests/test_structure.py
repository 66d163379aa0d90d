"""`hookscope layers` and hookscope.probes.structure: counts and shapes against direct computation."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count
from hookscope.core.select import find_site, select_sites
from hookscope.probes.structure import model_structure
from hookscope.sources import load_model


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


class ClassToken(nn.Module):
    """timm CaiT's pattern: a parameter (and a view of it) passed straight to a submodule,
    as CaiT's ``forward_cls`` passes its class token to each class-attention block."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(1, 1, 4))
        self.embed = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        self.head(self.token)  # the parameter itself
        return self.head(self.token.expand(x.shape[0], -1, -1) + x.mean(1, keepdim=True))


def test_a_parameter_passed_to_a_submodule_is_counted() -> None:
    model = ClassToken()
    found = model_structure(model, torch.randn(2, 5, 4))
    rows = by_name(found)
    assert [c.flops for c in rows["head"].calls] == [2 * 1 * 4 * 3, 2 * 2 * 4 * 3]
    assert found.flops == 2 * (2 * 5 * 4 * 4 + 4 * 3 + 2 * 4 * 3)
    assert hook_count(model) == 0 and all(p.grad is None for p in model.parameters())


def test_a_failure_in_hook_machinery_is_never_blamed_on_the_model() -> None:
    # torch's module tracker (what FlopCounterMode runs) fails on the pattern above: that
    # is a failure of the hooks around the model, so no ForwardError names the model.
    from torch.utils.module_tracker import ModuleTracker

    from hookscope.core.run import Probe, drive

    class Tracked(Probe[None]):
        def step(self, step) -> None:
            with ModuleTracker():
                step.forward()

        def finish(self) -> None:
            return None

    model = ClassToken()
    with pytest.raises(Exception) as caught:
        drive(model, torch.randn(2, 5, 4), Tracked())
    assert not isinstance(caught.value, HookscopeError)
    assert "own code" not in str(caught.value)
    assert hook_count(model) == 0


def test_a_failure_in_the_models_own_code_still_names_it() -> None:
    class Fails(ClassToken):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.embed(x) @ torch.ones(3, 3)  # a shape error between submodules

    with pytest.raises(HookscopeError, match=r"model's own code \(Fails\)"):
        model_structure(Fails(), torch.randn(2, 5, 4))


@pytest.mark.slow
def test_timm_cait_layers_run() -> None:
    timm = pytest.importorskip("timm")
    model = timm.create_model("cait_xxs24_224", pretrained=False, img_size=32, patch_size=16,
                              embed_dim=24, depth=1, num_heads=2, depth_token_only=1,
                              num_classes=3).eval()
    found = model_structure(model, torch.randn(1, 3, 32, 32))
    assert by_name(found)["blocks_token_only.0"].calls  # the class-attention block ran
    assert by_name(found)["head"].calls[0].flops == 2 * 24 * 3


# ----------------------------------------------------------------------------- FLOPs and bytes


def macs(layer) -> int | None:
    return layer.to_dict()["macs"]


@pytest.fixture(scope="module")
def resnet18_224(resnet18):
    """resnet18's structure at 224 px, batch 1 (FLOPs depend on shapes only)."""
    return model_structure(resnet18, torch.zeros(1, 3, 224, 224))


class Hand(nn.Module):
    """A conv, a Linear in a Sequential, a Linear called twice and a functional matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)  # 10x10 -> 8x8
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 8 * 8, 6))
        self.mix = nn.Linear(6, 6)
        self.register_buffer("w", torch.randn(6, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(self.mix(self.head(self.conv(x)))) @ self.w


def test_macs_of_a_hand_built_net() -> None:
    torch.manual_seed(0)
    model = Hand().eval()
    found = model_structure(model, torch.randn(2, 3, 10, 10))
    rows = by_name(found)
    batch = 2
    conv = batch * 4 * 3 * 3 * 3 * 8 * 8  # N*Cout*Cin*k*k*Hout*Wout
    linear = batch * 256 * 6  # N*in*out; the bias add is no multiply-add
    mix = batch * 6 * 6
    matmul = batch * 6 * 6  # y @ w, in the model's own forward
    assert macs(rows["conv"]) == conv and rows["conv"].flops == 2 * conv
    assert macs(rows["head.1"]) == macs(rows["head"]) == linear
    assert rows["head"].flops_own == 0 and macs(rows["head.0"]) == 0
    assert [c.flops for c in rows["mix"].calls] == [2 * mix, 2 * mix]  # both calls
    assert macs(rows["mix"]) == 2 * mix
    assert found.root.flops_own == 2 * matmul
    assert found.flops == found.root.flops == 2 * (conv + linear + 2 * mix + matmul)
    assert found.input_bytes == 2 * 3 * 10 * 10 * 4
    assert hook_count(model) == 0


def test_a_shared_module_accumulates_its_calls_under_its_one_name() -> None:
    model = Shared()
    found = model_structure(model, torch.randn(3, 4))
    rows = by_name(found)
    assert [c.flops for c in rows["enc"].calls] == [2 * 3 * 4 * 4] * 2
    assert macs(rows["enc"]) == 2 * 3 * 4 * 4
    assert macs(rows["head"]) == 3 * 4 * 10  # the tied weight is used all the same
    assert macs(rows["embed"]) == 0 and rows["embed"].calls == []
    assert found.flops == 2 * (2 * 3 * 4 * 4 + 3 * 4 * 10)


class Attention(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


def test_attention_inside_multihead_attention_is_counted() -> None:
    # In eval and inference mode nn.MultiheadAttention takes a fused fast path that has no
    # FLOP formula; counting switches it off for the pass and restores it.
    torch.manual_seed(0)
    model = Attention().eval()
    batch, tokens, dim = 2, 5, 16
    found = model_structure(model, torch.randn(batch, tokens, dim))
    projections = 4 * tokens * dim * dim  # q, k, v and out
    attention = 2 * tokens * tokens * dim  # q k^T and (softmax) v, over all heads
    assert macs(by_name(found)["attn"]) == batch * (projections + attention)
    assert torch.backends.mha.get_fastpath_enabled()


def test_hook_attribution_equals_flop_counter_modes_own_per_module_counts(resnet18) -> None:
    """Where FlopCounterMode's class-qualified names are unambiguous (no shared modules,
    every module called from its parent), its per-module counts equal the hooks' ones."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, 3, 64, 64)
    found = model_structure(resnet18, x)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        resnet18(x)
    theirs = {name.removeprefix("ResNet").removeprefix("."): sum(ops.values())
              for name, ops in counter.get_flop_counts().items() if name != "Global"}
    ours = {r.name: r.flops for r in [found.root, *found.layers] if r.flops}
    assert len(ours) == 37 and ours == theirs


def test_parameter_bytes_by_dtype_and_subtree_sums() -> None:
    model = nn.Sequential(nn.Linear(4, 3).half(),
                          nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)))
    found = model_structure(model)  # no example: bytes, but no FLOPs
    rows = by_name(found)
    assert rows["0"].params_bytes == {"float16": (4 * 3 + 3) * 2}
    assert rows["1.0"].params_bytes == {"float32": (3 * 2 + 2) * 4}
    assert rows["1.1"].params_bytes == {"float32": (2 + 2) * 4}  # buffers are no parameters
    assert rows["1"].params_bytes == {} and rows["1"].params_bytes_total == {"float32": 48}
    assert found.params_bytes == found.root.params_bytes_total == {"float16": 30,
                                                                   "float32": 48}
    assert found.root.flops is None and rows["0"].flops is None and macs(rows["0"]) is None
    totals = found.to_dict()["totals"]
    assert totals["flops"] is totals["macs"] is totals["activation_bytes"] is None
    assert totals["input_bytes"] is None
    # Tied weights count once: the head owns none of the embedding's bytes.
    shared = model_structure(Shared())
    head = by_name(shared)["head"]
    assert (head.params_bytes, head.params_bytes_total) == ({}, {"float32": 10 * 4 * 4})
    assert shared.root.params_bytes_total == {"float32": 4 * n_params(Shared())}


def _children(found, name: str) -> list:
    depth = 0 if not name else name.count(".") + 1
    prefix = f"{name}." if name else ""
    return [r for r in found.layers if r.depth == depth + 1 and r.name.startswith(prefix)]


def test_subtree_sums_are_own_plus_children(resnet18_224) -> None:
    found = resnet18_224
    for row in [found.root, *found.layers]:
        children = _children(found, row.name)
        assert row.flops == row.flops_own + sum(c.flops for c in children), row.name
        dtypes = {"float32"} if row.params_total else set()
        for dtype in dtypes:
            assert row.params_bytes_total[dtype] == row.params_bytes.get(dtype, 0) + sum(
                c.params_bytes_total.get(dtype, 0) for c in children), row.name
    leaves = [r for r in found.layers if not _children(found, r.name)]
    assert found.activation_bytes == sum(c.output_bytes for r in leaves for c in r.calls)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_totals_against_torchinfo(name, resnet18_224) -> None:
    import torchinfo

    model = load_model(name, weights="none", seed=0).model
    x = torch.zeros(1, 3, 224, 224)
    found = resnet18_224 if name == "resnet18" else model_structure(model, x)
    theirs = torchinfo.summary(model, input_data=x, verbose=0)
    # torchinfo also counts bias and BatchNorm terms as multiply-adds: they differ by little.
    assert found.flops / 2 == pytest.approx(theirs.total_mult_adds, rel=0.02)
    if name == "resnet18":
        assert round(found.flops / 2e9, 2) == round(theirs.total_mult_adds / 1e9, 2) == 1.81
    assert found.params_bytes == {"float32": theirs.total_param_bytes}
    # Per module, a convolution without bias: exactly torchinfo's Cout*Cin*k*k*Hout*Wout.
    rows = {id(model.get_submodule(r.name)): r for r in found.layers}
    convs = [i for i in theirs.summary_list
             if isinstance(i.module, nn.Conv2d) and i.module.bias is None]
    assert len(convs) > 15
    for info in convs:
        assert macs(rows[id(info.module)]) == info.macs, info.var_name


def test_vit_b_16_counts_attention_matmuls() -> None:
    from torchvision.models import ViT_B_16_Weights

    model = load_model("vit_b_16", weights="none", seed=0).model
    found = model_structure(model, torch.zeros(1, 3, 224, 224))
    tokens, dim, mlp, blocks, patch = 14 * 14 + 1, 768, 3072, 12, 16
    attention = 4 * tokens * dim * dim + 2 * tokens * tokens * dim  # q k v out; q k^T, a v
    block = attention + 2 * tokens * dim * mlp
    expected = 14 * 14 * dim * 3 * patch * patch + blocks * block + dim * 1000
    assert found.flops / 2 == pytest.approx(expected, rel=0.01)
    assert found.flops / 2e9 == pytest.approx(17.56, abs=0.01)
    # torchvision's own published count for this architecture (its "GFLOPS" are MACs).
    assert found.flops / 2e9 == pytest.approx(ViT_B_16_Weights.DEFAULT.meta["_ops"], abs=0.01)
    rows = by_name(found)
    assert macs(rows["encoder.layers.encoder_layer_0.self_attention"]) == attention
    assert macs(rows["encoder.layers.encoder_layer_0.mlp"]) == 2 * tokens * dim * mlp
    assert torch.backends.mha.get_fastpath_enabled() and hook_count(model) == 0


def test_tree_at_80_columns_shows_macs_and_totals(resnet18_224) -> None:
    import io

    from rich.console import Console

    from hookscope.render.tree import layers_view

    doc = {"model": "resnet18", "weights": {"requested": "none", "loaded": "random"},
           "device": "cpu", "inputs": []} | resnet18_224.to_dict()
    doc["layers"] = [r for r in doc["layers"] if r["depth"] == 1]
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(layers_view(doc))
    lines = console.file.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "  1.81G MACs  " in lines[1]
    assert "├── conv1  Conv2d  9,408 params  118M MACs  trainable  → 1x64x112x112" in lines
    assert "└── fc  Linear  513,000 params  512K MACs  trainable  → 1x1000" in lines
    assert any(line.startswith("├── relu  ReLU  0 params  → 1x64x112x112") for line in lines)
    totals = next(line for line in lines if line.startswith("totals:"))
    assert totals.startswith("totals: 1.81G MACs") and "params 46.8 MB" in totals


# ----------------------------------------------------------------------------- command line


def test_layers_json_contract(cli, resnet18) -> None:
    result = cli("layers", "resnet18", "--weights", "none", "--size", "64", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    for key in ("hookscope", "command", "model", "weights", "device", "inputs"):
        assert key in doc
    assert doc["command"] == "layers" and doc["inputs"] == []
    totals = doc["totals"]
    assert {k: totals[k] for k in ("params", "trainable_params", "modules")} == {
        "params": n_params(resnet18),
        "trainable_params": n_params(resnet18),
        "modules": len(list(resnet18.modules())) - 1,
    }
    assert totals["params_bytes"] == {"float32": 4 * n_params(resnet18)}
    assert totals["input_bytes"] == 3 * 64 * 64 * 4  # zeros of batch 1
    assert totals["macs"] * 2 == totals["flops"] == doc["root"]["flops"] > 0
    assert [row["name"] for row in doc["layers"]] == [n for n, _ in resnet18.named_modules()][1:]
    row = next(r for r in doc["layers"] if r["name"] == "layer1.0.relu")
    assert set(row) >= {"name", "type", "depth", "params", "params_total", "trainable", "calls"}
    assert [c["output_shape"] for c in row["calls"]] == [[1, 64, 16, 16]] * 2
    assert set(row["calls"][0]) >= {"input_shapes", "output_shape", "flops", "macs",
                                    "output_bytes"}
    assert row["calls"][0]["output_bytes"] == 64 * 16 * 16 * 4
    assert set(row) >= {"flops", "macs", "flops_own", "macs_own", "params_bytes",
                        "params_bytes_total"}


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
                        "output_shape,output_shapes,flops,macs,output_bytes,params_bytes,"
                        "params_bytes_total")
    # Booleans as JSON spells them (true/false), like every CSV.
    assert lines[1].startswith("conv1,Conv2d,1,9408,9408,true,0,1x3x64x64,1x64x32x32,")
    conv1_macs = 64 * 3 * 7 * 7 * 32 * 32  # Cout*Cin*k*k*Hout*Wout
    assert lines[1].endswith(f",{2 * conv1_macs},{conv1_macs},{64 * 32 * 32 * 4},"
                             f"{9408 * 4},{9408 * 4}")
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
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(layers_tree(doc))
    lines = console.file.getvalue().splitlines()
    conv1, conv2 = 8 * 3 * 9 * 16, 8 * 8 * 9 * 16  # Cout*Cin*k*k*Hout*Wout
    assert conv1 + conv2 + 8 * 5 == 12_712
    assert lines[0].startswith("tiny  TinyNet  869 params (own 0)  12.7K MACs  trainable  → 1x5")
    assert lines[1] == "├── conv1  Conv2d  224 params  3.46K MACs  trainable  → 1x8x4x4"
    assert lines[2] == "├── relu  ReLU  0 params  → #0 1x8x4x4  #1 1x8x4x4"
    assert lines[4] == "│   ├── block.0  Conv2d  584 params  9.22K MACs  trainable  → 1x8x4x4"
    # Leaf outputs: conv1, relu twice, block.0, block.1 (8x4x4 each), pool (8), fc (5).
    assert 4 * (5 * 8 * 4 * 4 + 8 + 5) == 2612 and 4 * 869 == 3476
    # Buffers: one BatchNorm2d(8): running mean and variance (float32), num_batches_tracked.
    assert 2 * 8 * 4 + 8 == 72
    assert lines[-1] == ("totals: 12.7K MACs (25.4K FLOPs) for batch 1  params 3.48 kB  "
                         "buffers 72 B  activations 2.61 kB  input 192 B")
