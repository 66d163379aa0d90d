"""Half precision on every run command: --dtype casts the model and its inputs, --autocast
runs under torch.autocast, float16 overflow is reported as non-finite, and a pair the device
cannot run is one line."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hookscope import collect_stats, run_debug
from hookscope.core.run import drive
from hookscope.probes.stats import StatsProbe


class Loud(nn.Module):
    """Its middle layer multiplies by 1000: fine in float32, past 65504 in float16."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.loud = nn.Linear(4, 4)
        self.last = nn.Linear(4, 2)
        with torch.no_grad():
            self.first.weight.copy_(torch.eye(4) * 100)
            self.loud.weight.copy_(torch.full((4, 4), 1000.0))
            for layer in (self.first, self.loud):
                layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.loud(self.first(x)))


def test_float16_overflow_is_reported_as_nonfinite_at_the_first_such_layer() -> None:
    model = Loud().eval()
    x = torch.ones(2, 4)
    assert all(row.nonfinite == 0 for row in collect_stats(model, x).layers)
    half = Loud().eval().half()
    rows = {row.name: row for row in collect_stats(half, x).layers}  # float32 input: cast
    assert rows["first"].nonfinite == 0 and rows["first"].max == pytest.approx(100)
    assert rows["loud"].nonfinite == 8  # 1000 * 4 * 100 = 400000 > 65504: Inf
    origin = run_debug(half, x).origin
    assert origin is not None and (origin.name, origin.source) == ("loud", "module")


def test_inputs_follow_the_model_dtype_and_autocast_leaves_the_model_alone() -> None:
    seen: list[torch.dtype] = []
    model = nn.Sequential(nn.Linear(4, 4)).eval()
    model.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    drive(model.to(torch.bfloat16), torch.ones(1, 4), StatsProbe(model))
    drive(model.float(), torch.ones(1, 4), StatsProbe(model), autocast=torch.bfloat16)
    assert seen == [torch.bfloat16, torch.float32]
    assert next(model.parameters()).dtype == torch.float32


@pytest.mark.parametrize("args,want", [
    (["--dtype", "bfloat16"], {"dtype": "bfloat16", "autocast": None}),
    (["--dtype", "float16"], {"dtype": "float16", "autocast": None}),
    (["--autocast"], {"dtype": "float32", "autocast": "bfloat16"}),
])
def test_half_precision_statistics_stay_close_to_float32(cli, cat_jpg, args, want) -> None:
    def run(*extra: str) -> dict:
        result = cli("stats", "resnet18", cat_jpg, "--weights", "none", "--size", "64",
                     "-f", "json", *extra)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)

    full, half = run(), run(*args)
    assert half["precision"] == want and full["precision"]["dtype"] == "float32"
    for a, b in zip(full["layers"], half["layers"], strict=True):
        assert b["nonfinite"] == 0
        scale = a["std"] or 1.0
        assert abs(a["mean"] - b["mean"]) < 0.05 * scale + 1e-3, a["name"]
    assert full["predictions"][0][0]["index"] == half["predictions"][0][0]["index"]


def test_precision_errors_are_one_line(cli, cat_jpg, monkeypatch) -> None:
    bad = cli("stats", "resnet18", cat_jpg, "--weights", "none", "--dtype", "float8")
    assert bad.exit_code == 2 and bad.stderr.strip().endswith(
        "--dtype 'float8': choose one of float32, float16, bfloat16.")

    def refuse(*args, **kwargs):
        raise RuntimeError('"slow_conv2d_cpu" not implemented for \'Half\'')

    monkeypatch.setattr(torch.nn.functional, "conv2d", refuse)
    unsupported = cli("stats", "resnet18", cat_jpg, "--weights", "none", "--dtype", "float16")
    lines = unsupported.stderr.strip().splitlines()
    assert unsupported.exit_code == 2 and len(lines) == 1
    assert "float16 is not supported on cpu" in lines[0] and "--dtype" in lines[0]
