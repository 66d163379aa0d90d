"""``hookscope gradcam``'s options from issue 11 end to end: several layers and their raw
maps, guided Grad-CAM files, metrics in the table, JSON and CSV, the smoothing flags, the
segmentation overlay's outline, and the help listing the registry."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from PIL import Image

from hookscope.cam.methods import method_names

FAST = ("--weights", "none", "--size", "64")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_help_lists_every_method(cli):
    r = cli("gradcam", "--help")
    assert r.exit_code == 0
    names = method_names()
    assert len(names) >= 18
    for name in names:
        assert name in r.stdout
    for flag in ("--aug-smooth", "--eigen-smooth", "--guided", "--mask", "--box-index",
                 "--iou", "--min-score", "--metrics", "--percentiles"):
        assert flag in r.stdout


def test_several_layers_raw_maps_and_guided(cli, cat_jpg, tmp_path):
    out = tmp_path / "o"
    r = cli("gradcam", "resnet18", cat_jpg, "--out", out, *FAST, "--layer", "layer3",
            "--layer", "layer4", "-m", "gradcam", "-m", "fullgrad", "--save-raw", "--guided",
            "--aug-smooth", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["layers"] == ["layer3", "layer4"] and doc["layer"] == "layer3"
    assert doc["layer_shapes"] == [[256, 4, 4], [512, 2, 2]] and doc["aug_smooth"] is True
    row = doc["results"][0]
    assert row["layers"] == ["layer3", "layer4"]
    assert set(row["raw_layers"]) == {"layer3", "layer4"} and row["raw"] == row["raw_layers"][
        "layer3"]
    assert np.load(row["raw_layers"]["layer3"]).shape == (4, 4)
    assert np.load(row["raw_layers"]["layer4"]).shape == (2, 2)
    guided = Image.open(row["guided"])
    assert guided.size == (64, 64) and guided.mode == "RGB"
    assert {p.name for p in out.iterdir()} >= {"cat.gradcam.layer3.npy", "cat.gradcam.layer4.npy",
                                               "cat.gradcam.guided.png", "cat.fullgrad.png"}


def test_metrics_table_json_and_csv(cli, samples, tmp_path):
    images = sorted(samples.glob("*.jpg"))[:2]
    args = ("gradcam", "resnet18", *images, *FAST, "-m", "gradcam", "-m", "eigencam",
            "--metrics", "all", "--percentiles", "25,75", "--force", "--out", tmp_path)
    r = cli(*args)
    assert r.exit_code == 0, r.output
    assert "metrics (mean over inputs)" in r.stdout
    for column in ("road", "deletion", "insertion", "drop", "increase"):
        assert column in r.stdout
    doc = json.loads(cli(*args, "--format", "json").stdout)
    assert set(doc["metrics"]) == {"gradcam", "eigencam"}
    means = doc["metrics"]["gradcam"]
    rows = [row for row in doc["results"] if row["method"] == "gradcam"]
    assert means["road"] == pytest.approx(np.mean([row["metrics"]["road"] for row in rows]))
    assert set(rows[0]["metrics"]) == {"road", "road_morf", "road_lerf", "deletion",
                                       "insertion", "drop", "increase"}
    table = list(csv.DictReader(io.StringIO(cli(*args, "--format", "csv").stdout)))
    assert list(table[0])[:12] == ["input", "method", "layer", "target", "label", "score",
                                   "prob", "peak_y", "peak_x", "overlay", "heatmap", "raw"]
    assert "road" in table[0] and table[0]["layers"] == "layer4"


def test_bad_percentiles_and_metrics_fail_before_the_model(cli, cat_jpg, tmp_path):
    r = cli("gradcam", "resnet18", cat_jpg, *FAST, "--out", tmp_path, "--metrics", "road",
            "--percentiles", "10,x")
    assert r.exit_code == 2 and "--percentiles '10,x'" in r.stderr
    r = cli("gradcam", "resnet18", cat_jpg, *FAST, "--out", tmp_path, "--metrics", "road",
            "--percentiles", "0,50")
    assert r.exit_code == 2 and "between 0 and 100" in r.stderr
    assert not list(tmp_path.iterdir())


def test_segmentation_overlay_is_outlined(cli, cat_jpg, tmp_path):
    mask = np.zeros((300, 451), dtype=np.uint8)
    mask[60:240, 150:330] = 255
    path = tmp_path / "mask.png"
    Image.fromarray(mask).save(path)
    out = tmp_path / "o"
    r = cli("gradcam", "lraspp_mobilenet_v3_large", cat_jpg, "--weights", "none", "--size",
            "64", "--target", "15", "--mask", path, "--out", out, "--format", "json",
            "--layer", "backbone.16")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["results"][0]
    assert row["target"] == 15 and row["label"] == "person" and row["region_pixels"] > 0
    overlay = np.asarray(Image.open(row["overlay"]))
    assert overlay.shape[:2] == (300, 451)
    white = (overlay == 255).all(axis=-1)
    assert white[150, 148:153].any() and white[59:62, 240].any()  # the edge, left and top
    assert not white[150, 200:280].any()  # inside: the heatmap
