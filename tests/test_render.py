"""Rendering: tables drawn on a fixed-width in-memory console, compared as text."""

from __future__ import annotations

import io
import json
import math

from rich.console import Console

from hookscope.render import output, tables


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
    assert "nan" in relu and "99.5%" in relu and relu.rstrip().endswith("3")
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
