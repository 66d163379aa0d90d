"""``hookscope.watch``'s non-finite locator (issue 28): a step an exception ends, blame by
production (a child, a parent's own code, ambiguity), the messages and ``nonfinite.json``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import hookscope
from hookscope.cli import app
from hookscope.core.hooks import hook_count


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def discriminator() -> nn.Module:
    """A sigmoid + BCE model: ``log`` makes NaN from the negative half of its input."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), Log(), nn.Linear(3, 1), nn.Sigmoid())


def bce_step(model: nn.Module, w: hookscope.Watch) -> None:
    out = model(torch.randn(8, 4))
    # BCE raises on a NaN input ("all elements of input should be between 0 and 1").
    nn.functional.binary_cross_entropy(out, torch.ones_like(out)).backward()
    w.step()


def test_a_loss_that_raises_on_nan_still_reports_the_producer(tmp_path: Path) -> None:
    model = discriminator()
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(model, tmp_path) as w:
            bce_step(model, w)
    error = caught.value
    assert (error.module, error.phase, error.step) == ("1", "forward", 0)
    assert isinstance(error.__cause__, RuntimeError) and "between 0 and 1" in str(error.__cause__)
    assert hook_count(model) == 0
    doc = json.loads((tmp_path / "nonfinite.json").read_text())
    assert doc["event"]["module"] == "1" and [s["step"] for s in doc["steps"]] == [0]
    # check fails the run on it.
    checked = CliRunner().invoke(app, ["check", str(tmp_path), "--format", "json"])
    assert checked.exit_code == 1, checked.output
    (rule,) = json.loads(checked.stdout)["rules"]
    assert rule["offenders"] == [doc["event"]["message"]]


def test_warn_logs_the_finding_and_lets_the_exception_go(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    model = discriminator()
    with caplog.at_level(logging.WARNING, "hookscope"), pytest.raises(RuntimeError, match="between"):
        with hookscope.watch(model, tmp_path, nonfinite="warn") as w:
            bce_step(model, w)
    assert [f.module for _, _, f in w.findings] == ["1"]
    assert "step 0, forward: 1 (Log) produced NaN" in caplog.text
    assert (tmp_path / "nonfinite.json").exists() and hook_count(model) == 0


def test_an_exception_after_a_finite_step_is_left_alone(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
    with pytest.raises(ValueError, match="boom"):
        with hookscope.watch(model, tmp_path):
            model(torch.randn(8, 4)).sum().backward()
            raise ValueError("boom")
    assert not (tmp_path / "nonfinite.json").exists() and hook_count(model) == 0
