"""Rendering: tables drawn on a fixed-width in-memory console, compared as text."""

from __future__ import annotations

import io
import json
import math
import re

import pytest
from rich.console import Console

from hookscope.core import files as output
from hookscope.render import ablate, camview, features, grads, tables, tree


def _render(renderable, width: int = 100) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


DOC = {
    "model": "tiny", "weights": {"requested": "none", "loaded": "random (seed 0)"},
    "device": "cpu", "inputs": ["a.jpg"], "input_shape": [3, 8, 8],
    "predictions": [[{"index": 2, "label": "tabby", "prob": 0.5}]],
    "layers": [
        {"name": "conv1", "type": "Conv2d", "call": 0, "input_shapes": [[1, 3, 8, 8]],
         "output_shape": [1, 4, 8, 8], "output_shapes": [[1, 4, 8, 8]], "mean": 0.25,
         "std": 1.5, "min": -2.0, "max": 3.0, "zero_fraction": 0.0, "nonfinite": 0},
        {"name": "relu", "type": "ReLU", "call": 1, "input_shapes": [[1, 4, 8, 8]],
         "output_shape": [1, 4, 8, 8], "output_shapes": [[1, 4, 8, 8]], "mean": math.nan,
         "std": math.nan, "min": 0.0, "max": 0.0, "zero_fraction": 0.995, "nonfinite": 3},
    ],
}


def test_stats_view_text() -> None:
    text = _render(tables.stats_view(DOC))
    lines = text.splitlines()
    assert lines[0].startswith("tiny  weights: random (seed 0)  device: cpu  inputs: 1")
    conv = next(line for line in lines if " conv1 " in line)
    assert "1x3x8x8" in conv and "1x4x8x8" in conv and "0.25" in conv and "0.0%" in conv
    relu = next(line for line in lines if " relu " in line)
    # A NaN mean is null in JSON and "-" in the table, never "nan" (issue 21, item 25).
    assert "nan" not in relu and relu.split()[6:8] == ["-", "-"]
    assert "99.5%" in relu and relu.rstrip().endswith("3")
    assert "tabby" in text and "50.00%" in text


def test_nonfinite_row_is_red_and_dead_layer_yellow() -> None:
    table = tables.stats_table(DOC["layers"][:1] + [DOC["layers"][1] | {"nonfinite": 0}])
    assert [row.style for row in table.rows] == [None, "yellow"]
    table = tables.stats_table(DOC["layers"])
    assert table.rows[1].style == "red"


def test_json_and_csv_write_nonfinite_as_null_and_empty() -> None:
    doc = json.loads(output.dumps_json(DOC))
    assert doc["layers"][1]["mean"] is None and doc["layers"][0]["mean"] == 0.25
    csv_text = output.dumps_csv(DOC["layers"], ["name", "output_shape", "mean", "nonfinite"])
    assert csv_text.splitlines() == ["name,output_shape,mean,nonfinite", "conv1,1x4x8x8,0.25,0",
                                     "relu,1x4x8x8,,3"]


# ----------------------------------------------------------------------------- fitting to width
# Hand-built documents shaped like resnet18's (batch 8, 224x224): long dotted names, wide
# shapes, floats in e-notation and nan. Each table is drawn at 80, 120 and 200 columns: Rich
# folds the widest columns first, so every character of every cell is still there.

WIDTHS = (80, 120, 200)
ENVELOPE = {"model": "resnet18", "weights": {"requested": "none", "loaded": "random (seed 0)"},
            "device": "cpu", "inputs": ["sample_images/cat.jpg"], "input_shape": [3, 224, 224]}
VALUES = [-1.234567e-05, 0.2107129, math.nan, 123456.7, -3.5, 0.0, 1e-07, 42.0, -0.0227023]
BLOCK_PARTS = [("conv1", "Conv2d"), ("bn1", "BatchNorm2d"), ("relu", "ReLU"),
               ("conv2", "Conv2d"), ("bn2", "BatchNorm2d"), ("relu", "ReLU")]


def _resnet_calls() -> list[tuple[str, str, int, list[int], list[int]]]:
    """(name, type, call, input shape, output shape) of each call of resnet18's stem, layer1,
    layer4 and head, in forward order (layers 2 and 3 would only add rows of the same kind)."""
    stem = [8, 64, 112, 112]
    calls = [("conv1", "Conv2d", 0, [8, 3, 224, 224], stem), ("bn1", "BatchNorm2d", 0, stem, stem),
             ("relu", "ReLU", 0, stem, stem), ("maxpool", "MaxPool2d", 0, stem, [8, 64, 56, 56])]
    for layer, channels, size in [(1, 64, 56), (4, 512, 7)]:
        out = [8, channels, size, size]
        for block in (0, 1):
            relu_calls = 0
            for part, kind in BLOCK_PARTS:
                call = relu_calls if part == "relu" else 0
                relu_calls += part == "relu"
                calls.append((f"layer{layer}.{block}.{part}", kind, call, out, out))
            if layer > 1 and block == 0:
                wide = [8, channels // 2, size * 2, size * 2]
                calls += [(f"layer{layer}.0.downsample.0", "Conv2d", 0, wide, out),
                          (f"layer{layer}.0.downsample.1", "BatchNorm2d", 0, out, out)]
    return calls + [("avgpool", "AdaptiveAvgPool2d", 0, [8, 512, 7, 7], [8, 512, 1, 1]),
                    ("fc", "Linear", 0, [8, 512], [8, 1000])]


def _value(i: int) -> float:
    return VALUES[i % len(VALUES)]


def _stats_rows() -> list[dict]:
    rows = []
    for i, (name, kind, call, shape_in, shape_out) in enumerate(_resnet_calls()):
        mean = _value(i)
        rows.append({
            "name": name, "type": kind, "call": call, "input_shapes": [shape_in],
            "output_shape": shape_out, "output_shapes": [shape_out], "mean": mean,
            "std": abs(_value(i + 1)), "min": _value(i + 2), "max": _value(i + 3),
            "zero_fraction": (i % 7) / 7, "nonfinite": 3 if math.isnan(mean) else 0,
            "input_stats": {"mean": _value(i + 4), "std": _value(i + 5), "nonfinite": i % 2},
        })
    return rows


def _stats_cells(i: int, row: dict) -> list[str]:
    ins = row["input_stats"]
    return [str(i), row["name"], row["type"], str(row["call"]),
            "x".join(map(str, row["input_shapes"][0])), "x".join(map(str, row["output_shape"])),
            *(tables.fmt_float(row[k]) for k in ("mean", "std", "min", "max")),
            f"{row['zero_fraction']:.1%}", str(row["nonfinite"]), tables.fmt_float(ins["mean"]),
            tables.fmt_float(ins["std"]), str(ins["nonfinite"])]


STATS_HEADERS = ["#", "layer", "type", "call", "input", "output", "mean", "std", "min", "max",
                 "zeros", "non-finite", "in mean", "in std", "in non-finite"]


def _lines(renderable, width: int) -> list[str]:
    lines = _render(renderable, width).splitlines()
    assert lines and max(len(line) for line in lines) <= width
    return lines


def _characters(texts) -> list[str]:
    return sorted("".join(texts).replace(" ", ""))


def _joined(lines: list[str]) -> str:
    """Lines as one string, so a footnote wrapped at any width reads as one sentence."""
    return re.sub(r"\s+", " ", " ".join(lines))


def _check_table(table, width: int, headers: list[str], rows: list[list[str]]) -> None:
    """Draw a table within ``width``: nothing cut or hidden (every character of its title,
    headers and cells is drawn), and where it fits, one line a row holding each cell whole."""
    lines = _lines(table, width)
    rule = next(i for i, line in enumerate(lines) if line.startswith("─"))
    assert "…" not in "".join(lines) and "hidden" not in "".join(lines)
    assert _characters(lines[:rule] + lines[rule + 1:]) == _characters(
        [table.title or "", *headers, *(cell for row in rows for cell in row)])
    body = [line for line in lines[rule + 1:] if line.strip()]
    if width == 200:
        assert len(body) == len(rows)
        for line, cells in zip(body, rows, strict=True):
            for cell in cells:
                assert not cell or re.search(rf"(?<!\S){re.escape(cell)}(?!\S)", line), (cell, line)


@pytest.mark.parametrize("width", WIDTHS)
def test_stats_table_fits_the_width(width: int) -> None:
    rows = _stats_rows()
    cells = [_stats_cells(i, row) for i, row in enumerate(rows)]
    _check_table(tables.stats_table(rows, input_stats=True), width, STATS_HEADERS, cells)


@pytest.mark.parametrize("width", WIDTHS)
def test_stats_view_and_predictions_fit(width: int) -> None:
    labels = ["tabby, tabby cat", "tiger cat", "Egyptian cat", "lynx, catamount", "hand-held computer"]
    preds = [{"index": 281 + i, "label": label, "prob": 0.5 / (i + 1)} for i, label in enumerate(labels)]
    doc = ENVELOPE | {"layers": _stats_rows()[-6:], "predictions": [preds]}
    lines = _lines(tables.stats_view(doc), width)
    assert lines[0].startswith("resnet18  weights: random (seed 0)")
    cells = [["sample_images/cat.jpg" if i == 0 else "", str(i + 1), str(p["index"]), p["label"],
              f"{p['prob']:.2%}"] for i, p in enumerate(preds)]
    table = tables.predictions_table(doc["inputs"], [preds])
    _check_table(table, width, ["input", "rank", "class", "label", "prob"], cells)


def _grad_rows() -> list[dict]:
    flags = [None, "vanish", None, "explode", None, "nonfinite"]
    return [{"name": name, "type": kind, "call": call, "shape": shape_out,
             "norm": abs(_value(i)), "mean": _value(i + 1), "std": abs(_value(i + 2)),
             "max_abs": abs(_value(i + 3)), "nonfinite": i % 3, "flag": flags[i % len(flags)]}
            for i, (name, kind, call, _, shape_out) in enumerate(reversed(_resnet_calls()))]


@pytest.mark.parametrize("width", WIDTHS)
def test_grads_tables_fit_the_width(width: int) -> None:
    rows = _grad_rows()
    cells = [[str(i), r["name"], r["type"], str(r["call"]), "x".join(map(str, r["shape"])),
              *(tables.fmt_float(r[k]) for k in ("norm", "mean", "std", "max_abs")),
              str(r["nonfinite"]), r["flag"] or ""] for i, r in enumerate(rows)]
    headers = ["#", "layer", "type", "call", "shape", "norm", "mean", "std", "max |g|",
               "non-finite", "flag"]
    _check_table(grads.layers_table(rows), width, headers, cells)
    params = [{"name": f"{name}.weight", "grad_norm": _value(i), "weight_norm": abs(_value(i + 3)),
               "ratio": _value(i + 6)} for i, (name, *_) in enumerate(_resnet_calls())]
    cells = [[p["name"], *(tables.fmt_float(p[k]) for k in ("grad_norm", "weight_norm", "ratio"))]
             for p in params]
    _check_table(grads.params_table(params), width,
                 ["parameter", "grad norm", "weight norm", "ratio"], cells)
    doc = ENVELOPE | {"loss": "ce", "targets": [281], "objective": 2.5, "median_norm": 1e-06,
                      "first_nonfinite": "layer4.0.downsample.0", "layers": rows[:6],
                      "params": params[:6]}
    _lines(grads.grads_view(doc), width)


def _preds(offset: int) -> list[dict]:
    labels = ["tabby, tabby cat", "tiger cat", "hand-held computer", "lynx, catamount", "pitcher"]
    return [{"index": 281 + (i + offset) % 5, "label": labels[(i + offset) % 5],
             "prob": 0.4 / (i + 1), "logit": 2.0 - i} for i in range(5)]


@pytest.mark.parametrize("width", WIDTHS)
def test_ablate_tables_fit_the_width(width: int) -> None:
    ranking = [{"channel": c, "drop": _value(c), "delta_prob": _value(c + 1), "kl": _value(c + 2)}
               for c in range(12)]
    result = {"input": "sample_images/cat.jpg", "layer": "layer4.1.downsample.0",
              "channels": list(range(64)), "mode": "noise:0.5", "target": 281,
              "target_label": "tabby, tabby cat", "before": _preds(0), "after": _preds(1),
              "delta_logit": -1.234567e-05, "delta_prob": math.nan, "kl": 0.0123,
              "ranking": ranking}
    cells = [[str(r + 1), *(v for p in (b, a) for v in (f"{p['index']} {p['label']}",
                                                         f"{p['prob']:.2%}"))]
             for r, (b, a) in enumerate(zip(result["before"], result["after"], strict=True))]
    _check_table(ablate._top_table(result), width, ["rank", "before", "prob", "after", "prob"],
                 cells)
    cells = [[str(i), str(r["channel"]), *(tables.fmt_float(r[k]) for k in ("drop", "delta_prob", "kl"))]
             for i, r in enumerate(ranking[:10], 1)]
    _check_table(ablate._ranking_table(ranking, 10), width,
                 ["rank", "channel", "logit drop", "Δ prob", "KL"], cells)
    text = "\n".join(_lines(ablate.ablate_view(ENVELOPE | {"results": [result]}), width))
    assert "layer4.1.downsample.0" in text and "-1.235e-05" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_cam_table_fits_the_width(width: int) -> None:
    results = [{"input": "sample_images/cat.jpg", "method": method, "target": 281,
                "label": "tabby, tabby cat", "score": _value(i), "prob": 0.004150180146,
                "peak": [215, 295], "overlay": f"out/cams/cat.layer4.1.conv2.{method}.png"}
               for i, method in enumerate(["gradcam", "gradcam++", "eigencam"])]
    cells = [["sample_images/cat.jpg" if i == 0 else "", r["method"], "281", r["label"],
              tables.fmt_float(r["score"]), "0.42%", "215,295", r["overlay"]]
             for i, r in enumerate(results)]
    headers = ["input", "method", "class", "label", "score", "prob", "peak y,x", "overlay"]
    _check_table(camview.cam_table(results), width, headers, cells)
    doc = ENVELOPE | {"layer": "layer4.1.conv2", "layer_shape": [512, 7, 7], "layer_default": True,
                      "out": "out/cams", "results": results}
    _lines(camview.cam_view(doc), width)


@pytest.mark.parametrize("width", WIDTHS)
def test_features_view_fits_the_width(width: int) -> None:
    layers = ["layer1.0.conv1", "layer4.0.downsample.0", "layer4.1.relu", "layer4.1.relu"]
    grids = [{"input": "sample_images/cat.jpg", "layer": layer, "type": "Conv2d", "call": i // 3,
              "shape": [512, 7, 7], "channels": list(range(64)), "nonfinite": 3 * (i == 1),
              "path": f"out/features/cat.{layer}.{i // 3}.png"} for i, layer in enumerate(layers)]
    cells = [[g["input"], g["layer"], str(g["call"]), "512x7x7", "64/512", str(g["nonfinite"]),
              g["path"]] for g in grids]
    view = features.features_view(ENVELOPE | {"out": "out/features", "tensorboard": None, "grids": grids})
    assert _lines(view, width)[0].startswith("resnet18  weights: random (seed 0)")
    _check_table(view.renderables[1], width, ["input", "layer", "call", "shape", "shown",
                                              "non-finite", "file"], cells)


MODELS = [("fasterrcnn_mobilenet_v3_large_320_fpn", "detection", ["COCO_V1"]),
          ("keypointrcnn_resnet50_fpn", "detection", ["COCO_LEGACY", "COCO_V1"]),
          ("quantized_resnext101_32x8d", "quantization", ["IMAGENET1K_FBGEMM_V1", "IMAGENET1K_FBGEMM_V2"]),
          ("deeplabv3_resnet101", "segmentation", ["COCO_WITH_VOC_LABELS_V1"]),
          ("resnet18", "classification", ["IMAGENET1K_V1"])]


@pytest.mark.parametrize("width", WIDTHS)
def test_models_table_fits_the_width(width: int) -> None:
    doc = {"models": [{"name": n, "task": t, "weights": w, "default": w[-1]} for n, t, w in MODELS]}
    cells = [[n, t, w[-1], ", ".join(w)] for n, t, w in MODELS]
    _check_table(tree.models_table(doc), width, ["model", "task", "default weights",
                                                 "all weights"], cells)


def _node(name: str, kind: str, params: int, total: int, trainable: object,
          shape: list[int]) -> dict:
    return {"name": name, "type": kind, "depth": name.count(".") + 1, "params": params,
            "params_total": total, "trainable": trainable,
            "calls": [{"output_shape": shape, "output_shapes": [shape]}]}


def _layers_doc() -> dict:
    """A resnet18-like ``layers`` document: containers, leaves, a shared relu, partly trainable."""
    rows: dict[str, dict] = {}
    for name, kind, _, _, shape in _resnet_calls():
        parts = name.split(".")
        for depth in range(1, len(parts)):
            parent = ".".join(parts[:depth])
            if parent not in rows:
                container = "BasicBlock" if depth == 2 else "Sequential"
                rows[parent] = _node(parent, container, 0, 2_359_808, depth != 3 or None, shape)
        if name in rows:  # a module called again
            rows[name]["calls"].append({"output_shape": shape, "output_shapes": [shape]})
        else:
            params = 0 if kind in ("ReLU", "MaxPool2d", "AdaptiveAvgPool2d") else 1_179_648
            rows[name] = _node(name, kind, params, params,
                               "partly" if kind == "Linear" else True, shape)
    root = {"name": "", "type": "ResNet", "depth": 0, "params": 0, "params_total": 11_689_512,
            "trainable": True, "calls": [{"output_shape": [8, 1000], "output_shapes": [[8, 1000]]}]}
    return ENVELOPE | {"root": root, "layers": list(rows.values()),
                       "totals": {"params": 11_689_512, "trainable_params": 11_689_512,
                                  "modules": len(rows) + 1}}


@pytest.mark.parametrize("width", (50, *WIDTHS))
def test_layers_tree_keeps_names_whole(width: int) -> None:
    doc = _layers_doc()
    lines = _lines(tree.layers_view(doc), width)
    text = "\n".join(lines)
    nodes = [line for line in lines if re.match(r"[│ ]*[├└]── ", line)]
    assert [re.sub(r"^[│ ]*[├└]── ", "", line).split("  ")[0] for line in nodes] == \
        [row["name"] for row in doc["layers"]]  # one line a node, its full dotted name first
    assert "…" not in text
    for line, row in zip(nodes, doc["layers"], strict=True):
        shapes = re.findall(r"\d+(?:x\d+)+", line)  # every shape shown is whole
        assert all(s in {"x".join(map(str, c["output_shape"])) for c in row["calls"]}
                   for s in shapes)
    if width >= 120:
        assert "layer4.0.downsample.0  Conv2d  1,179,648 params  trainable  → 8x512x7x7" in text
        assert "layer4.1.relu  ReLU  0 params  trainable  → #0 8x512x7x7  #1 8x512x7x7" in text


def test_long_names_fold_and_are_never_cut() -> None:
    long = "encoder.layers.11.attention.output.dense"
    table = tables.DataTable(["layer", tables.num("mean"), tables.num("std")])
    table.add_row(long, "-1.235e-05", "0.25")
    table.add_row("fc[0]", "nan", "1")  # a string cell is literal, not markup
    _check_table(table, 30, ["layer", "mean", "std"], [[long, "-1.235e-05", "0.25"],
                                                       ["fc[0]", "nan", "1"]])
    assert f"{long}  -1.235e-05  0.25" in _render(table, 60)
