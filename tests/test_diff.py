"""`hookscope diff`: two runs compared call by call, the first divergence, offline diffs."""

from __future__ import annotations

import copy
import csv
import io
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torchvision.models import get_model

from hookscope.core.errors import ForwardError, HookscopeError
from hookscope.core.hooks import hook_count
from hookscope.core.run import drive
from hookscope.numerics.diffsums import DiffSums
from hookscope.probes.diff import DEFAULT_TOLERANCE, DiffProbe, diff_models
from hookscope.render.diff import DIFF_COLUMNS, OFFLINE_COLUMNS
from tests.bounds import U32, diff_chain, sum_bound
from tests.conftest import TinyNet
from tests.test_cli_stats import one_error_line

SMALL = ["--weights", "none", "--size", "64"]
CHANGED = "layer2.0.conv1"
ROW = {"name", "type", "call", "shape", "max_abs", "rel_l2", "cosine", "nonfinite_a",
       "nonfinite_b"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path, Path]:
    """a.pt and b.pt: resnet18 state_dicts equal except one convolution; x.pt: two inputs."""
    folder = tmp_path_factory.mktemp("diff")
    torch.manual_seed(0)
    state = get_model("resnet18", weights=None).state_dict()
    torch.save(state, folder / "a.pt")
    changed = dict(state)
    weight = state[f"{CHANGED}.weight"]
    changed[f"{CHANGED}.weight"] = weight + 0.05 * torch.randn_like(weight)
    torch.save(changed, folder / "b.pt")
    torch.save(torch.randn(2, 3, 64, 64), folder / "x.pt")
    return folder / "a.pt", folder / "b.pt", folder / "x.pt"


@pytest.fixture(scope="module")
def two_checkpoints(checkpoints) -> dict:
    """`diff resnet18 x.pt --weights a.pt --against-weights b.pt -f json`, run once."""
    from typer.testing import CliRunner

    from hookscope.cli import app

    a, b, x = checkpoints
    result = CliRunner().invoke(app, ["diff", "resnet18", str(x), "--weights", str(a),
                                      "--against-weights", str(b), "-f", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def run_json(cli, *args: object, code: int = 0) -> dict:
    result = cli("diff", *args, "-f", "json")
    assert result.exit_code == code, result.stderr
    return json.loads(result.stdout)


def reference(model_a: nn.Module, model_b: nn.Module, x: torch.Tensor,
              name: str) -> dict[int, dict[str, float]]:
    """Each call of module ``name`` compared with plain hooks, in float64."""
    sides = []
    for model in (model_a, model_b):
        seen: list[torch.Tensor] = []
        module = dict(model.named_modules())[name]
        handle = module.register_forward_hook(
            lambda m, args, out, seen=seen: seen.append(out.double().clone()))
        with torch.no_grad():
            model.eval()(x)
        handle.remove()
        sides.append(seen)
    return {call: {"max_abs": float((a - b).abs().max()),
                   "rel_l2": float((a - b).norm() / a.norm()),
                   "cosine": float((a * b).sum() / (a.norm() * b.norm()))}
            for call, (a, b) in enumerate(zip(*sides, strict=True))}


# ----------------------------------------------------------------------------- two checkpoints


def test_two_checkpoints_name_the_changed_conv_and_nothing_before_it(checkpoints,
                                                                     two_checkpoints) -> None:
    a, b, x = checkpoints
    doc = two_checkpoints
    assert doc["command"] == "diff" and doc["offline"] is False
    assert doc["weights"]["loaded"] == f"file:{a}"
    assert doc["against"]["weights"]["loaded"] == f"file:{b}"
    assert doc["tolerance"] == DEFAULT_TOLERANCE
    first = doc["first_divergence"]
    assert (first["name"], first["call"], first["reason"]) == (CHANGED, 0, "rel_l2")
    names = [(r["name"], r["call"]) for r in doc["layers"]]
    at = names.index((CHANGED, 0))
    assert at > 10 and all(ROW <= set(r) for r in doc["layers"])
    for row in doc["layers"][:at]:
        assert row["rel_l2"] == 0 and row["max_abs"] == 0 and row["cosine"] == 1, row["name"]
        assert not row["exceeds"]
    assert doc["layers"][at]["rel_l2"] > 0.1 and doc["layers"][at]["exceeds"]
    # The shortcut of the changed block does not see the change.
    assert doc["layers"][names.index(("layer2.0.downsample.0", 0))]["rel_l2"] == 0
    assert doc["unmatched_a"] == [] and doc["unmatched_b"] == []
    assert doc["outputs"]["inputs"] == 2 and doc["outputs"]["kl_mean"] > 0

    # Independent: the same checkpoints in plain torchvision models, plain hooks, float64.
    models = []
    for path in (a, b):
        model = get_model("resnet18", weights=None)
        model.load_state_dict(torch.load(path, weights_only=True))
        models.append(model)
    inputs = torch.load(x, weights_only=True)
    rows = {(r["name"], r["call"]): r for r in doc["layers"]}
    for name in (CHANGED, "layer2.0.relu", "layer4.1.bn2", "fc"):
        for call, want in reference(*models, inputs, name).items():
            for key, value in want.items():
                assert rows[(name, call)][key] == pytest.approx(value, rel=1e-5, abs=1e-9), \
                    (name, call, key)


def test_fail_exits_1_only_when_the_runs_part(cli, checkpoints) -> None:
    a, b, x = checkpoints
    result = cli("diff", "resnet18", x, "--weights", a, "--against-weights", b, "--fail",
                 "-f", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["first_divergence"]["name"] == CHANGED  # still written
    assert CHANGED in result.stderr.strip().splitlines()[-1]
    same = cli("diff", "resnet18", x, "--weights", a, "--against-weights", a, "--fail",
               "-f", "json")
    assert same.exit_code == 0, same.stderr
    doc = json.loads(same.stdout)
    assert doc["first_divergence"] is None
    assert all(r["rel_l2"] == 0 for r in doc["layers"])
    assert doc["outputs"]["top1_agreement"] == 1 and doc["outputs"]["max_abs_logit"] == 0
    # No call above a loose tolerance, but a top-1 prediction differs: still exit 1.
    loose = cli("diff", "resnet18", x, "--weights", a, "--against-weights", b, "--fail",
                "--tolerance", "1e9", "--layers", "layer1.*", "-f", "json")
    doc = json.loads(loose.stdout)
    assert doc["first_divergence"] is None and doc["outputs"]["top1_agreement"] < 1
    assert loose.exit_code == 1 and "top-1" in loose.stderr


def test_table_and_csv(cli, checkpoints, two_checkpoints) -> None:
    from hookscope.render.console import render_text
    from hookscope.render.diff import diff_view

    a, b, x = checkpoints
    result = cli("diff", "resnet18", x, "--weights", a, "--against-weights", b)
    assert result.exit_code == 0, result.stderr
    assert f"first divergence: {CHANGED}" in result.stdout
    for width in (80, 120):
        text = render_text(diff_view(two_checkpoints), width=width)
        assert all(len(line) <= width for line in text.splitlines()), width
        assert CHANGED in text and "rel L2" in text
    result = cli("diff", "resnet18", x, "--weights", a, "--against-weights", b, "-f", "csv",
                 "--type", "Conv2d")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert tuple(rows[0]) == DIFF_COLUMNS
    assert rows[0]["name"] == "conv1" and float(rows[0]["rel_l2"]) == 0
    assert {r["exceeds"] for r in rows} == {"true", "false"}


# ----------------------------------------------------------------------------- precision


def test_float32_against_bfloat16_gives_small_finite_errors_and_the_same_top1(cli) -> None:
    doc = run_json(cli, "resnet18", "sample_images/cat.jpg", "sample_images/coffee.jpg",
                   *SMALL, "--against-dtype", "bfloat16")
    assert doc["against"]["precision"]["dtype"] == "bfloat16"
    assert doc["precision"]["dtype"] == "float32"
    rels = [r["rel_l2"] for r in doc["layers"]]
    assert all(r is not None and math.isfinite(r) and r < 0.1 for r in rels)
    # bfloat16's rounding (8 bits) is well above the default tolerance from the first call.
    assert max(rels) > DEFAULT_TOLERANCE
    assert doc["first_divergence"] is not None
    assert doc["outputs"]["top1_agreement"] == 1


@pytest.mark.slow
def test_a_dtype_a_detectors_operators_cannot_run_is_refused_before_it_runs(
        cli, cat_jpg, monkeypatch) -> None:
    """torchvision's nms has no bfloat16 or float16 kernel on the CPU: the side is named,
    nothing runs, and the note both loads make is said once."""
    import hookscope.core.run

    def no_forward(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model ran")

    monkeypatch.setattr(hookscope.core.run, "drive", no_forward)
    det = "fasterrcnn_mobilenet_v3_large_320_fpn"
    result = cli("diff", det, cat_jpg, *SMALL, "--against-dtype", "bfloat16")
    line = one_error_line(result)
    assert line.startswith("hookscope: error: Side B") and "nms" in line
    assert "--against-autocast" in line
    assert result.stderr.count("size is ignored") == 1
    result = cli("diff", det, cat_jpg, *SMALL, "--dtype", "float16", "--against-dtype",
                 "float32")
    assert one_error_line(result).startswith("hookscope: error: Side A") and "nms" in result.stderr


def test_a_failure_of_side_a_names_side_a(tiny_net) -> None:
    other = copy.deepcopy(tiny_net)

    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    tiny_net.fc = Boom()
    with pytest.raises(ForwardError, match=r"^Side A: .*fc") as caught:
        diff_models(tiny_net, other, torch.randn(2, 3, 8, 8))
    assert caught.value.module == "fc"


def test_float32_noise_stays_under_the_default_tolerance(tiny_net) -> None:
    """float32 against float64 (the float32 run's own rounding): far under the default."""
    torch.manual_seed(1)
    other = copy.deepcopy(tiny_net).double()
    report = diff_models(tiny_net, other, torch.randn(4, 3, 16, 16))
    rels = [row.sums.rel_l2 for row in report.layers]
    assert 0 < max(rels) < DEFAULT_TOLERANCE / 100
    assert report.first_divergence is None and not report.failed


# ----------------------------------------------------------------------------- pairing


class Renamed(TinyNet):
    """TinyNet with its pooling renamed and an extra module: names differ partly."""

    def __init__(self) -> None:
        super().__init__()
        self.avg = self.pool
        del self.pool
        self.extra = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.block(x))
        return self.fc(self.extra(self.avg(x).flatten(1)))


class WiderPool(TinyNet):
    """TinyNet whose pooling output is 2x2: one call's shapes differ, later ones match."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.block(x))
        return self.fc(self.pool(x).mean((2, 3)))


def test_against_model_lists_the_calls_on_one_side(cli, checkpoints) -> None:
    x = checkpoints[2]
    doc = run_json(cli, "resnet34", x, "--weights", "none", "--against-model", "resnet18",
                   "--layers", "layer1.*")
    assert doc["against"]["model"] == "resnet18"
    only_a = {(r["name"], r["call"]) for r in doc["unmatched_a"]}
    assert ("layer1.2.conv1", 0) in only_a and ("layer1.1.conv1", 0) not in only_a
    assert doc["unmatched_b"] == []
    assert {r["name"] for r in doc["layers"]} >= {"layer1.0.conv1", "layer1.1.bn2"}

    torch.manual_seed(0)
    model, other = TinyNet().eval(), Renamed().eval()
    other.load_state_dict(model.state_dict())
    report = diff_models(model, other, torch.randn(2, 3, 8, 8)).to_dict()
    assert [r["name"] for r in report["unmatched_a"]] == ["pool"]
    assert {r["name"] for r in report["unmatched_b"]} == {"avg", "extra"}
    assert all(r["rel_l2"] == 0 for r in report["layers"])  # same weights, same calls


def test_shape_mismatch_is_reported_not_crashed_on(tiny_net) -> None:
    other = WiderPool().eval()
    other.load_state_dict(tiny_net.state_dict())
    report = diff_models(tiny_net, other, torch.randn(2, 3, 8, 8))
    rows = {r.name: r for r in report.layers}
    assert rows["pool"].shape == [2, 8, 1, 1] and rows["pool"].shape_b == [2, 8, 2, 2]
    assert math.isnan(rows["pool"].sums.rel_l2)
    assert report.first_divergence == {"name": "pool", "type": "AdaptiveAvgPool2d", "call": 0,
                                       "rel_l2": pytest.approx(math.nan, nan_ok=True),
                                       "reason": "shape"}
    assert rows["fc"].sums.rel_l2 < 1e-6  # the mean of a 2x2 pool is the 1x1 pool


# ----------------------------------------------------------------------------- the library


class NaNAfter(nn.Module):
    """Writes NaN into the first channel of its input's copy."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, 0] = float("nan")
        return x


def test_nonfinite_values_are_counted_and_left_out_of_the_sums(tiny_net) -> None:
    other = copy.deepcopy(tiny_net)
    other.block[1] = nn.Sequential(other.block[1], NaNAfter())
    x = torch.randn(2, 3, 8, 8)
    report = diff_models(tiny_net, other, x, layers=["block.*", "relu"], all_modules=True)
    rows = {(r.name, r.call): r for r in report.layers}
    bn = rows[("block.1", 0)]
    assert bn.sums.nonfinite_a == 0 and bn.sums.nonfinite_b == 2 * 8 * 8
    assert report.first_divergence is not None
    assert report.first_divergence["name"] == "block.1"
    assert report.first_divergence["reason"] == "nonfinite"
    # Independent: the finite part, by hand in float64.
    with torch.no_grad():
        a = tiny_net.block(tiny_net.relu(tiny_net.conv1(x))).double()
    kept = a[:, 1:]
    assert bn.sums.n == kept.numel()
    assert bn.sums.sq_a == pytest.approx(float((kept**2).sum()), rel=1e-6)
    assert bn.sums.rel_l2 == 0 and bn.sums.max_abs == 0


def test_no_hooks_are_left_and_flags_restored_even_when_b_raises(tiny_net) -> None:
    other = copy.deepcopy(tiny_net)
    tiny_net.train()
    x = torch.randn(2, 3, 8, 8)
    diff_models(tiny_net, other, [x, x])
    assert hook_count(tiny_net) == 0 and hook_count(other) == 0
    assert all(m.training for m in tiny_net.modules())

    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    other.fc = Boom()
    with pytest.raises(ForwardError) as caught:
        diff_models(tiny_net, other, x)
    assert str(caught.value).startswith("Side B (the second run")
    assert caught.value.module == "fc"
    assert hook_count(tiny_net) == 0 and hook_count(other) == 0
    with pytest.raises(HookscopeError, match="same module"):
        DiffProbe(tiny_net, tiny_net)


class AddsInPlace(nn.Module):
    """Changes its convolution's output in place in its own code, not in a module."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        out += 1.0
        out.relu_()
        return self.head(out.mean((2, 3)))


def test_outputs_changed_in_place_later_are_compared_as_they_were(tiny_net) -> None:
    """The conv output is changed by `+=` and `relu_` after its hook; B is a copy of A, so
    every call must compare equal, and against a changed copy the conv must differ by the
    change alone (computed by hand)."""
    torch.manual_seed(0)
    model = AddsInPlace().eval()
    x = torch.randn(2, 3, 8, 8)
    same = diff_models(model, copy.deepcopy(model), x)
    assert [r.name for r in same.layers] == ["conv", "head"]
    assert all(r.sums.rel_l2 == 0 and r.sums.max_abs == 0 for r in same.layers)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.conv.bias.add_(0.5)
    report = diff_models(model, other, x)
    with torch.no_grad():
        a = model.conv(x).double()
    assert report.layers[0].sums.max_abs == pytest.approx(0.5, rel=1e-6)
    assert report.layers[0].sums.rel_l2 == pytest.approx(float(0.5 * a.numel() ** 0.5 / a.norm()),
                                                         rel=1e-5)
    # TinyNet's ReLU(inplace=True) after conv1 and after the block: identical runs are equal.
    twin = diff_models(tiny_net, copy.deepcopy(tiny_net), x)
    assert len(twin.layers) == 7 and all(r.sums.rel_l2 == 0 for r in twin.layers)


def test_device_path_gives_the_host_path_sums() -> None:
    """The branch-free accelerator path, run on the CPU, against the chunked host path."""
    from hookscope.numerics.diffsums import _compare_device, _compare_host

    torch.manual_seed(0)
    a = torch.randn(300_000)
    b = a + 1e-3 * torch.randn_like(a)
    clean = [_compare_host(a, b), _compare_device(a, b).tolist()]
    x0, y0 = a.double(), b.double()  # before the values below are spoilt
    b[::1000] = float("nan")
    a[5] = float("inf")
    masked = [_compare_host(a, b), _compare_device(a, b).tolist()]
    x, y = a.double(), b.double()
    both = x.isfinite() & y.isfinite()
    d = (x - y)[both]
    want = (300_000, int(both.sum()), float(d @ d), float(x[both] @ x[both]),
            float(y[both] @ y[both]), float(d.abs().max()), 1, 300)
    assert want[1] == 300_000 - 301
    for found in masked:
        assert found == pytest.approx(want, rel=1e-6)
    host, device = clean
    assert host[:2] == (300_000, 300_000) and host[6:] == (0, 0)
    assert host[5] == pytest.approx(device[5], rel=U32)  # one float32 difference, rounded
    # The host sums are float32 chains, the device's float64.
    chain = diff_chain()
    for value, exact, terms in zip(host[2:5], device[2:5], ((x0 - y0) ** 2, x0 * x0, y0 * y0),
                                   strict=True):
        assert abs(value - exact) <= sum_bound(terms, chain)


def test_at_most_one_batch_of_a_is_held_and_reports_merge(tiny_net) -> None:
    other = copy.deepcopy(tiny_net)
    with torch.no_grad():
        other.fc.weight.mul_(1.5)
    batches = [torch.randn(2, 3, 8, 8), torch.randn(3, 3, 8, 8)]
    probe = DiffProbe(tiny_net, other)
    held_after: list[int] = []
    step = probe.step

    def spy(s) -> None:
        step(s)
        held_after.append(len(probe.kept))

    probe.step = spy  # type: ignore[method-assign]
    report = drive(tiny_net, batches, probe)
    calls = len(report.layers)  # selected calls of one forward pass (relu twice)
    assert held_after == [0, 0]
    assert 0 < probe.peak_kept <= calls
    parts = [diff_models(tiny_net, other, b) for b in batches]
    merged = parts[0].merge(parts[1])
    for row, want in zip(report.layers, merged.layers, strict=True):
        assert row.sums.sq_diff == pytest.approx(want.sums.sq_diff, rel=1e-12)
        assert row.sums.rel_l2 == pytest.approx(want.sums.rel_l2, rel=1e-12)
    assert report.outputs is not None and merged.outputs is not None
    assert report.outputs.inputs == 5 == merged.outputs.inputs
    assert report.outputs.kl_sum == pytest.approx(merged.outputs.kl_sum, rel=1e-12)
    assert report.first_divergence is not None and report.first_divergence["name"] == "fc"


def test_relative_error_and_cosine_edge_cases() -> None:
    zero = DiffSums(numel=4, n=4)
    assert zero.rel_l2 == 0 and math.isnan(zero.cosine)
    only_b = DiffSums(numel=4, n=4, sq_diff=1.0, sq_b=1.0)
    assert only_b.rel_l2 == math.inf and math.isnan(only_b.cosine)
    assert math.isnan(DiffSums().rel_l2)
    from hookscope.core.files import dumps_json

    assert json.loads(dumps_json({"rel_l2": only_b.rel_l2}))["rel_l2"] is None


# ----------------------------------------------------------------------------- offline


@pytest.fixture(scope="module")
def stats_docs(tmp_path_factory, checkpoints) -> tuple[Path, Path, dict]:
    """A saved stats document and a copy with one layer's mean changed by hand."""
    from hookscope.core.files import dumps_json
    from hookscope.probes.stats import collect_stats
    from hookscope.sources import load_model

    # What `hookscope stats x.pt --weights none -f json` writes: envelope and report.
    folder = tmp_path_factory.mktemp("offline")
    loaded = load_model("resnet18", weights="none")
    report = collect_stats(loaded.model, torch.load(checkpoints[2], weights_only=True),
                           categories=loaded.categories)
    text = dumps_json(loaded.envelope("stats", ["x.pt[0]", "x.pt[1]"]) | report.to_dict())
    doc = json.loads(text)
    (folder / "a.json").write_text(text)
    changed = copy.deepcopy(doc)
    row = next(r for r in changed["layers"] if r["name"] == "layer3.0.bn1")
    row["mean"] += 0.5 * row["std"]
    changed["layers"] = [r for r in changed["layers"] if r["name"] != "layer4.1.bn2"]
    (folder / "b.json").write_text(json.dumps(changed))
    return folder / "a.json", folder / "b.json", doc


def test_offline_diff_of_two_stats_documents(cli, stats_docs) -> None:
    a, b, original = stats_docs
    doc = run_json(cli, a, b)
    assert doc["offline"] is True and doc["files"] == [str(a), str(b)]
    assert doc["model"] == "resnet18" and doc["against"]["model"] == "resnet18"
    first = doc["first_divergence"]
    assert (first["name"], first["reason"]) == ("layer3.0.bn1", "rel")
    rows = {r["name"]: r for r in doc["layers"] if r["call"] == 0}
    bn = rows["layer3.0.bn1"]
    want = next(r for r in original["layers"] if r["name"] == "layer3.0.bn1")
    assert bn["mean_delta"] == pytest.approx(0.5 * want["std"])
    assert bn["mean_rel"] == pytest.approx(0.5 * want["std"] / max(abs(want["mean"]),
                                                                    want["std"]))
    assert bn["std_delta"] == 0 and bn["exceeds"]
    assert [r["name"] for r in doc["unmatched_a"]] == ["layer4.1.bn2"]
    assert doc["unmatched_b"] == []
    assert all(r["rel"] == 0 for r in doc["layers"] if r["name"] != "layer3.0.bn1")
    assert doc["outputs"]["top1_agreement"] == 1

    assert cli("diff", a, b, "--fail", "-f", "json").exit_code == 1
    assert cli("diff", a, a, "--fail", "-f", "json").exit_code == 0
    assert cli("diff", a, b, "--fail", "--tolerance", "10").exit_code == 0
    table = cli("diff", a, b)
    assert "first divergence: layer3.0.bn1" in table.stdout
    rows_csv = list(csv.DictReader(io.StringIO(cli("diff", a, b, "-f", "csv").stdout)))
    assert tuple(rows_csv[0]) == OFFLINE_COLUMNS


# ----------------------------------------------------------------------------- bad input


def test_bad_inputs_are_one_line_exit_2(cli, checkpoints, stats_docs, tmp_path) -> None:
    x = checkpoints[2]
    line = one_error_line(cli("diff", "resnet18", x, *SMALL))
    assert "--against-weights" in line and "--against-dtype" in line
    line = one_error_line(cli("diff", "resnet18", x, *SMALL, "--against-dtype", "float8"))
    assert "--against-dtype" in line and "bfloat16" in line
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"command": "models", "models": []}))
    line = one_error_line(cli("diff", stats_docs[0], models))
    assert "'models' document" in line and "stats" in line
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "not a JSON document" in one_error_line(cli("diff", broken, stats_docs[0]))
    line = one_error_line(cli("diff", stats_docs[0], stats_docs[1], "--against-dtype",
                              "bfloat16"))
    assert "--against-dtype" in line
    assert "two saved" in one_error_line(cli("diff", stats_docs[0], x))
    assert "Cannot read" in one_error_line(cli("diff", tmp_path / "no.json", stats_docs[0]))


def test_a_note_both_sides_make_is_said_once(capsys) -> None:
    import logging

    from hookscope.render.console import setup_logging

    setup_logging()
    log = logging.getLogger("hookscope")
    for _side in "AB":  # each side's load says the same
        log.info("size is ignored: this model's preprocessing does not resize")
    log.warning("size is ignored: this model's preprocessing does not resize")
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["hookscope: note: size is ignored: this model's preprocessing does not resize",
                     "hookscope: warning: size is ignored: this model's preprocessing does not "
                     "resize"]
