"""`hookscope stats` end to end: formats, the JSON contract, atomic output, error contract."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision.models import get_model

from tests.test_stats import reference

ENVELOPE = {"hookscope", "command", "model", "weights", "device", "inputs"}
ROW = {"name", "type", "call", "input_shapes", "output_shape", "mean", "std", "min", "max",
       "zero_fraction", "nonfinite"}
SMALL = ["--weights", "none", "--size", "64"]


def one_error_line(result, code: int = 2) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[-1].startswith("hookscope: error: ")
    assert [ln for ln in lines if "error" in ln] == [lines[-1]]
    return lines[-1]


def test_json_contract_and_values_match_independent_hooks(cli, cat_jpg) -> None:
    result = cli("stats", "resnet18", cat_jpg, *SMALL, "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert ENVELOPE <= set(doc) and {"input_shape", "predictions", "layers"} <= set(doc)
    assert doc["command"] == "stats" and doc["model"] == "resnet18"
    assert doc["weights"] == {"requested": "none", "loaded": "random (seed 0)", "num_classes": 1000}
    assert doc["device"] == "cpu" and doc["inputs"] == [str(cat_jpg)]
    assert doc["input_shape"] == [3, 64, 64]
    assert len(doc["predictions"]) == 1 and len(doc["predictions"][0]) == 5
    assert set(doc["predictions"][0][0]) == {"index", "label", "prob"}
    assert all(ROW <= set(row) for row in doc["layers"])

    # Independent: the same preprocessing and seeded model, plain hooks, float64 statistics.
    from hookscope.sources import load_model

    loaded = load_model("resnet18", weights="none", size=64)
    x = loaded.preprocess(Image.open(cat_jpg).convert("RGB")).unsqueeze(0)
    outputs: dict[tuple[str, int], torch.Tensor] = {}
    counts: dict[str, int] = {}
    handles = []
    for name, module in loaded.model.named_modules():
        if name and not list(module.children()):
            def hook(m, a, o, name=name):
                counts[name] = counts.get(name, 0) + 1
                outputs[(name, counts[name] - 1)] = o.detach().double().clone()
            handles.append(module.register_forward_hook(hook))
    with torch.no_grad():
        logits = loaded.model(x)
    for h in handles:
        h.remove()
    assert [(r["name"], r["call"]) for r in doc["layers"]] == list(outputs)
    relu_calls = [r["call"] for r in doc["layers"] if r["name"] == "layer1.0.relu"]
    assert relu_calls == [0, 1]
    for row in doc["layers"]:
        want = reference(outputs[(row["name"], row["call"])])
        for key in ("mean", "std", "min", "max", "zero_fraction"):
            assert row[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (row["name"], key)
    top = torch.softmax(logits, 1)[0].topk(5)
    assert [p["index"] for p in doc["predictions"][0]] == top.indices.tolist()
    assert doc["predictions"][0][0]["label"] == loaded.categories[top.indices[0]]


def test_table_output(cli, cat_jpg) -> None:
    result = cli("stats", "resnet18", cat_jpg, *SMALL, "--layers", "layer1.*", "--type", "ReLU")
    assert result.exit_code == 0, result.stderr
    assert "layer1.0.relu" in result.stdout and "layer2" not in result.stdout
    assert "top predictions" in result.stdout
    assert result.stderr == ""  # --weights none: no warning


def test_csv_output_and_input_stats(cli, cat_jpg) -> None:
    result = cli("stats", "resnet18", cat_jpg, *SMALL, "--format", "csv", "--input-stats",
                 "--type", "Conv2d")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert rows[0]["name"] == "conv1" and rows[0]["input_shapes"] == "1x3x64x64"
    assert rows[0]["output_shape"] == "1x64x32x32"
    assert float(rows[0]["input_std"]) > 0
    assert all(r["type"] == "Conv2d" for r in rows)


def test_nonfinite_written_as_null(cli, tmp_path) -> None:
    x = torch.randn(1, 3, 64, 64)
    x[0, 0, 0, 0] = float("nan")
    torch.save(x, tmp_path / "nan.pt")
    result = cli("stats", "resnet18", tmp_path / "nan.pt", "--weights", "none", "--format",
                 "json", "--layers", "conv1")
    doc = json.loads(result.stdout)
    assert "NaN" not in result.stdout
    assert doc["layers"][0]["nonfinite"] > 0


def test_several_batches_merge_exactly(cli, samples) -> None:
    one = json.loads(cli("stats", "resnet18", samples, *SMALL, "--format", "json",
                         "--layers", "fc", "--batch-size", "4").stdout)
    split = json.loads(cli("stats", "resnet18", samples, *SMALL, "--format", "json",
                           "--layers", "fc", "--batch-size", "1").stdout)
    assert len(one["inputs"]) == 4
    for key in ("mean", "std", "min", "max"):
        assert split["layers"][0][key] == pytest.approx(one["layers"][0][key], rel=1e-4)


def test_output_file_atomic_and_not_overwritten(cli, cat_jpg, tmp_path) -> None:
    out = tmp_path / "stats.json"
    assert cli("stats", "resnet18", cat_jpg, *SMALL, "-f", "json", "-o", out).exit_code == 0
    assert json.loads(out.read_text())["command"] == "stats"
    again = cli("stats", "resnet18", cat_jpg, *SMALL, "-f", "json", "-o", out)
    assert "--force" in one_error_line(again)
    assert cli("stats", "resnet18", cat_jpg, *SMALL, "-f", "json", "-o", out,
               "--force").exit_code == 0
    failed = tmp_path / "failed.json"
    bad = cli("stats", "resnet18", cat_jpg, tmp_path / "missing.jpg", *SMALL, "-o", failed)
    one_error_line(bad)
    assert not failed.exists() and not list(tmp_path.glob(".*.part"))


@pytest.fixture()
def bad_files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("text")
    (tmp_path / "trunc.jpg").write_bytes(Path("sample_images/cat.jpg").read_bytes()[:5000])
    torch.save(torch.randn(4, 4), tmp_path / "flat.pt")
    torch.save(get_model("resnet34", weights=None).state_dict(), tmp_path / "r34.pt")
    torch.save({"w": torch.ones(2), "obj": Path(".")}, tmp_path / "pickled.pt")
    (tmp_path / "junk.pt").write_text("junk")
    Image.new("RGB", (200, 200)).save(tmp_path / "bomb.png")
    return {p.name: p for p in tmp_path.iterdir()}


@pytest.mark.parametrize(
    "args,message",
    [
        (["stats", "resnet18", "{missing.jpg}"], "no such file"),
        (["stats", "resnet18", "{trunc.jpg}"], "truncated"),
        (["stats", "resnet18", "{notes.txt}"], "not an image"),
        (["stats", "resnet18", "{empty}"], "holds no images"),
        (["stats", "resnett18", "{cat}"], "Did you mean: resnet18"),
        (["stats", "resnet18", "{cat}", "--layers", "layer9*"], "matches no module"),
        (["stats", "resnet18", "{cat}", "--type", "Conv3d"], "Types present"),
        (["stats", "resnet18", "{cat}", "--weights", "{nope.pt}"], "not found"),
        (["stats", "resnet18", "{cat}", "--weights", "{junk.pt}"], "not a PyTorch checkpoint"),
        (["stats", "resnet18", "{cat}", "--weights", "{r34.pt}"], "another architecture"),
        (["stats", "resnet18", "{cat}", "--weights", "{pickled.pt}"], "--trust-checkpoint"),
        (["stats", "resnet18", "{cat}", "--device", "cuda:7"], "--device"),
        (["stats", "resnet18", "{bomb.png}"], "decompression-bomb"),
    ],
)
def test_bad_input_one_line_exit_2(cli, bad_files, cat_jpg, monkeypatch, args, message) -> None:
    from PIL import Image as PILImage

    if "{bomb.png}" in args:
        monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 10_000)
    folder = next(iter(bad_files.values())).parent
    filled = []
    for a in args:
        if a == "{cat}":
            a = str(cat_jpg)
        elif a.startswith("{"):
            a = str(folder / a.strip("{}"))
        filled.append(a)
    if "--weights" not in filled:
        filled += ["--weights", "none"]
    line = one_error_line(cli(*filled, "--size", "64"))
    assert __import__("re").search(message, line), line


def test_traceback_flag_shows_traceback(cli, tmp_path) -> None:
    result = cli("stats", "resnet18", tmp_path / "x.jpg", "--weights", "none", "--traceback")
    assert result.exit_code == 2 and "Traceback" in result.stderr


def test_a_2d_tensor_is_a_batch_of_feature_vectors(cli, tmp_path) -> None:
    # (N, F) is a valid batch (any rank, sample dimension first): a conv model's own forward
    # then refuses it, exit 1, naming the module.
    torch.save(torch.randn(4, 4), tmp_path / "flat.pt")
    line = one_error_line(cli("stats", "resnet18", tmp_path / "flat.pt", "--weights", "none"),
                          code=1)
    assert "conv1" in line and "[4, 4]" in line


def test_crash_in_forward_is_a_clean_error(cli, tmp_path) -> None:
    torch.save(torch.randn(1, 1, 32, 32), tmp_path / "gray.pt")
    line = one_error_line(cli("stats", "resnet18", tmp_path / "gray.pt", "--weights", "none"),
                          code=1)  # the model's forward raised: exit 1, as in every command
    assert "conv1" in line and "[1, 1, 32, 32]" in line


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    env = os.environ | {"HOOKSCOPE_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "hookscope", *args], capture_output=True,
                          text=True, env=env, timeout=300, **kw)


def test_installed_command_pipes_json_and_reads_stdin(cat_jpg) -> None:
    exe = Path(sys.executable).parent / "hookscope"
    with cat_jpg.open("rb") as stdin:
        proc = subprocess.run(
            [str(exe), "stats", "resnet18", "-", "--size", "64", "--format", "json",
             "--layers", "fc"],
            stdin=stdin, capture_output=True, env=os.environ | {"HOOKSCOPE_OFFLINE": "1"},
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["inputs"] == ["-"] and doc["weights"]["loaded"].startswith("random")
    # auto without weights: exactly one warning line, on stderr, never in the JSON stream.
    assert proc.stderr.decode().count("warning") == 1


def test_help_does_not_import_torch() -> None:
    code = ("import sys; from hookscope.cli import app\n"
            "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert 'torchvision' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "stats" in proc.stdout


def test_version() -> None:
    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("hookscope ")
