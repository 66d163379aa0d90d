"""``hookscope gradcam`` end to end: files, sizes, JSON, errors, --force."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hookscope.render.heatmap import colorize, heatmap_images, output_paths

FAST = ("--weights", "none", "--size", "64")


# One intra-op thread: on a shared 2-core machine, two spinning threads run 10x slower.
pytestmark = pytest.mark.usefixtures("one_thread")


def _images(samples: Path) -> list[Path]:
    return sorted(samples.glob("*.jpg"))


def test_writes_one_overlay_per_image_at_original_size(cli, samples, tmp_path):
    out = tmp_path / "out"
    images = _images(samples)
    r = cli("gradcam", "resnet18", *images, "--out", out, *FAST, "-m", "gradcam",
            "-m", "eigencam", "--save-raw", "--format", "json", "--batch-size", "3")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "gradcam" and doc["model"] == "resnet18"
    assert doc["weights"]["loaded"].startswith("random")
    assert doc["layer"] == "layer4" and doc["layer_default"] is True
    assert len(doc["results"]) == 2 * len(images)
    for row in doc["results"]:
        assert set(row) >= {"input", "method", "layer", "target", "label", "score", "prob",
                            "overlay", "heatmap", "raw", "peak"}
        src = Image.open(row["input"])
        overlay, heat = Image.open(row["overlay"]), Image.open(row["heatmap"])
        assert overlay.size == src.size and heat.size == src.size
        assert overlay.mode == "RGB"
        raw = np.load(row["raw"])
        assert raw.dtype == np.float32 and raw.ndim == 2 and raw.min() >= 0
        y, x = row["peak"]
        assert 0 <= y < src.size[1] and 0 <= x < src.size[0]
        assert 0 <= row["prob"] <= 1 and isinstance(row["label"], str)
    names = sorted(p.name for p in out.iterdir())
    assert "cat.gradcam.png" in names and "cat.eigencam.heatmap.png" in names
    assert not [n for n in names if n.endswith(".part")]


def test_table_output_names_the_layer(cli, cat_jpg, tmp_path):
    r = cli("gradcam", "resnet18", cat_jpg, "--out", tmp_path, *FAST, "--layer", "layer3")
    assert r.exit_code == 0, r.output
    assert "layer: layer3" in r.stdout and "cat.gradcam.png" in r.stdout


def test_existing_outputs_are_not_overwritten(cli, cat_jpg, tmp_path):
    assert cli("gradcam", "resnet18", cat_jpg, "--out", tmp_path, *FAST).exit_code == 0
    target = tmp_path / "cat.gradcam.png"
    before = target.read_bytes()
    target.write_bytes(b"keep me")
    r = cli("gradcam", "resnet18", cat_jpg, "--out", tmp_path, *FAST)
    assert r.exit_code == 2
    assert "already exists" in r.stderr and "--force" in r.stderr
    assert "Traceback" not in r.output
    assert target.read_bytes() == b"keep me"
    r = cli("gradcam", "resnet18", cat_jpg, "--out", tmp_path, *FAST, "--force")
    assert r.exit_code == 0, r.output
    assert target.read_bytes() == before


def test_target_list_mismatch(cli, samples, tmp_path):
    out = tmp_path / "o"
    r = cli("gradcam", "resnet18", *_images(samples), "--out", out, *FAST, "--target", "1,2")
    assert r.exit_code == 2
    assert "2 targets for 4 input" in r.stderr
    assert not out.exists() or not any(out.iterdir())


def test_per_input_targets_and_labels(cli, samples, tmp_path):
    images = _images(samples)[:3]
    r = cli("gradcam", "resnet18", *images, "--out", tmp_path, *FAST, "--batch-size", "2",
            "--target", "tabby,7,top2", "--format", "json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["results"]
    assert rows[0]["target"] == 281 and rows[0]["label"] == "tabby"
    assert rows[1]["target"] == 7


def test_non_spatial_layer_says_why(cli, cat_jpg, tmp_path):
    r = cli("gradcam", "resnet18", cat_jpg, "--out", tmp_path / "o", *FAST, "--layer", "fc")
    assert r.exit_code == 2
    assert "no spatial dimensions" in r.stderr and "'fc'" in r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_unknown_layer_method_and_colormap(cli, cat_jpg, tmp_path):
    r = cli("gradcam", "resnet18", cat_jpg, "--out", tmp_path, *FAST, "--layer", "layer44")
    assert r.exit_code == 2
    assert "layer4" in r.stderr and "hookscope layers" in r.stderr
    r = cli("gradcam", "resnet18", cat_jpg, "--out", tmp_path, *FAST, "-m", "gradcampp")
    assert r.exit_code == 2
    r = cli("gradcam", "resnet18", cat_jpg, "--out", tmp_path, *FAST, "--colormap", "jett")
    assert r.exit_code == 2 and "jet" in r.stderr
    assert not list(tmp_path.iterdir())


def test_tensor_input_overlay_is_denormalised(cli, tmp_path):
    torch.manual_seed(0)
    batch = torch.randn(2, 3, 48, 40)
    path = tmp_path / "x.pt"
    torch.save(batch, path)
    out = tmp_path / "o"
    r = cli("gradcam", "resnet18", path, "--out", out, "--weights", "none", "--format", "json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["results"]
    assert [Path(row["overlay"]).name for row in rows] == ["x_0.gradcam.png", "x_1.gradcam.png"]
    assert Image.open(rows[0]["overlay"]).size == (40, 48)


def test_vit_block_output(cli, cat_jpg, tmp_path):
    r = cli("gradcam", "vit_b_16", cat_jpg, "--out", tmp_path, "--weights", "none",
            "--layer", "encoder.layers.encoder_layer_10", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["layer_shape"] == [768, 14, 14]
    assert Image.open(doc["results"][0]["overlay"]).size == Image.open(cat_jpg).size


def test_help_lists_registry_methods(cli):
    r = cli("gradcam", "--help")
    assert r.exit_code == 0
    for name in ("gradcam++", "xgradcam", "layercam", "hirescam", "eigencam", "scorecam"):
        assert name in r.stdout


# ----------------------------------------------------------------------------- rendering


def test_overlay_geometry_and_colours():
    img = Image.new("RGB", (100, 60), (10, 20, 30))
    values = np.zeros((8, 8), np.float32)
    values[0, 0] = 1.0
    over, heat = heatmap_images(values, img, (20.0, 0.0, 80.0, 60.0), cmap="jet", alpha=1.0)
    assert over.size == heat.size == (100, 60) and heat.mode == "RGBA"
    arr = np.asarray(over)
    assert tuple(arr[30, 5]) == (10, 20, 30)  # outside the crop: the image, untinted
    assert tuple(arr[1, 21]) == tuple(colorize(np.array([[1.0]]), "jet")[0, 0])
    assert np.asarray(heat)[30, 5, 3] == 0 and np.asarray(heat)[30, 50, 3] == 255
    full_over, full_heat = heatmap_images(values, img, None, alpha=0.0)
    assert full_heat.mode == "RGB" and np.array_equal(np.asarray(full_over), np.asarray(img))


def test_output_paths_keep_same_stems_apart(tmp_path):
    plans = output_paths(["cat", "cat", "dog"], ["gradcam"], tmp_path, save_raw=False)
    names = [p["gradcam"]["overlay"].name for p in plans]
    assert names == ["cat.gradcam.png", "cat-2.gradcam.png", "dog.gradcam.png"]
    assert plans[0]["gradcam"]["raw"] is None
    # The same names as every other command's files (inputs.unique_stems): a made-up name
    # never takes a stem that is given elsewhere.
    plans = output_paths(["cat", "cat", "cat-2"], ["gradcam"], tmp_path, save_raw=False)
    names = [p["gradcam"]["overlay"].name for p in plans]
    assert names == ["cat.gradcam.png", "cat-3.gradcam.png", "cat-2.gradcam.png"]


def test_failure_mid_run_leaves_no_files(cli, cat_jpg, tmp_path):
    broken = tmp_path / "zz_broken.jpg"
    broken.write_bytes(cat_jpg.read_bytes()[:3000])  # header fine, pixels truncated
    out = tmp_path / "o"
    r = cli("gradcam", "resnet18", cat_jpg, broken, "--out", out, *FAST, "--batch-size", "1")
    assert r.exit_code == 2, r.output
    assert "zz_broken.jpg" in r.stderr
    assert not out.exists()


def test_gradcam_help_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from hookscope.cli import app; "
            "r = CliRunner().invoke(app, ['gradcam', '--help']); "
            "assert r.exit_code == 0 and 'scorecam' in r.stdout; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_constant_map_is_flagged_in_json_and_on_stderr(cli, cat_jpg, tmp_path):
    # At 64 px AlexNet's avgpool repeats a 1x1 grid: its map is constant up to rounding.
    r = cli("gradcam", "alexnet", cat_jpg, "--out", tmp_path, *FAST, "--layer", "avgpool",
            "--save-raw", "--format", "json")
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)["results"]
    raw = np.load(row["raw"]).astype(np.float64)
    assert raw.max() - raw.min() <= 1e-5 * np.abs(raw).max()
    assert row["constant"] is True and row["peak"] is None
    assert "some maps are constant at layer 'avgpool'" in r.stderr
    heat = np.asarray(Image.open(row["heatmap"]).convert("RGBA"), dtype=np.int64)
    shown = heat[heat[..., 3] > 0]  # the crop's pixels (outside it, transparent)
    assert len(shown) and (shown == shown[0]).all()  # one colour, not a stretched heatmap
    r = cli("gradcam", "alexnet", cat_jpg, "--out", tmp_path / "b", *FAST, "--format", "json")
    (row,) = json.loads(r.stdout)["results"]
    assert row["layer"] == "features.11" and row["constant"] is False and row["peak"]
