"""The watch's layer flags (docs/watch.md, Layer flags): a gradient's sensitivity
‖∂L/∂y‖·‖y‖/|L| against absolute bounds and the call's own first healthy value, so that the
flags hold when most layers are affected (issue #28, finding 3). Before, ``vanish`` and
``explode`` were relative to the median call: with most gradients vanished, nothing was
``vanish`` and the one healthy layer was ``explode``; with most exactly zero, nothing at all."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.numerics.health import CHANGE, EXPLODE, VANISH, grad_flags, sensitivity
from hookscope.training.records import _output_norm
from tests.watch_logs import read_log

EPS32 = torch.finfo(torch.float32).eps


class MnistNet(nn.Module):
    """pytorch/examples' mnist ``Net``, at 16 px and a quarter of the width."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 8, 3), nn.Conv2d(8, 16, 3)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(16 * 6 * 6, 32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv2(torch.relu(self.conv1(x)))), 2)
        x = torch.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return torch.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def train(model: nn.Module, log_dir: Path, steps: int = 3, *, lr: float = 0.05,
          give_loss: bool = True, scale: Any = None) -> list[dict[str, Any]]:
    """``steps`` seeded SGD steps under the watch, each logged; the lines. ``scale(step)``
    multiplies that step's loss."""
    torch.manual_seed(1)
    data = [(torch.randn(16, 1, 16, 16), torch.randint(0, 10, (16,))) for _ in range(steps)]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with hookscope.watch(model, log_dir, every=1) as w:
        for step, (x, y) in enumerate(data):
            loss = nn.functional.nll_loss(model(x), y) * (scale(step) if scale else 1.0)
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss if give_loss else None)
    return read_log(log_dir)[1]


def flags(line: dict[str, Any]) -> dict[str, list[str]]:
    return {row["name"]: row["flags"] for row in line["layers"]}


def test_sensitivity_is_autograds(tmp_path: Path) -> None:
    """The row's sensitivity equals ‖∂L/∂y‖·‖y‖/|L| taken by autograd in float64."""
    torch.manual_seed(0)
    model = MnistNet().eval()  # no dropout: the same forward twice
    [line] = train(model, tmp_path, steps=1, lr=0.0)
    torch.manual_seed(1)  # train's first batch again
    x, y = torch.randn(16, 1, 16, 16), torch.randint(0, 10, (16,))
    outputs: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(lambda m, i, o, n=n: outputs.setdefault(n, o))
               for n, m in model.named_children()]
    loss = nn.functional.nll_loss(model(x), y)
    for t in outputs.values():
        t.retain_grad()
    loss.backward()
    for h in handles:
        h.remove()
    want = {n: t.grad.double().norm().item() * t.double().norm().item() / loss.item()
            for n, t in outputs.items()}
    for row in line["layers"]:
        n = math.prod(row["output_shape"])
        got = sensitivity(row["grad_norm"], _output_norm(row), line["loss"])
        # float32 sums of n squares (the norms, the moments): about sqrt(n)·eps relative.
        assert got == pytest.approx(want[row["name"]], rel=8 * math.sqrt(n) * EPS32), row["name"]


@pytest.mark.parametrize("fault", ["a backward hook", "the weight"])
def test_most_layers_vanishing_are_flagged_not_the_healthy_one(tmp_path: Path, fault: str) -> None:
    """mnist with the gradient through ``fc2`` times 1e-6: every layer below it vanishes."""
    torch.manual_seed(0)
    model = MnistNet()
    if fault == "the weight":
        with torch.no_grad():
            model.fc2.weight.mul_(1e-6)
    else:
        model.fc2.register_full_backward_hook(lambda m, gi, go: (gi[0] * 1e-6,))
    line = train(model, tmp_path)[0]
    found = flags(line)
    assert found["fc2"] == []  # the one healthy layer (the median rule: explode)
    assert {name: found[name] for name in ("conv1", "conv2", "fc1")} == dict.fromkeys(
        ("conv1", "conv2", "fc1"), ["vanish"])
    assert {"name": "fc1", "call": 0, "flags": ["vanish"]} in line["flagged"]


def test_exactly_zero_gradients_are_flagged(tmp_path: Path) -> None:
    """fc2's weight all zeros: no gradient passes it, every layer below gets exact zeros."""
    torch.manual_seed(0)
    model = MnistNet()
    with torch.no_grad():
        model.fc2.weight.zero_()
    line = train(model, tmp_path, steps=1)[0]
    assert all(row["grad_norm"] == 0.0 for row in line["layers"][:-1])
    assert flags(line) == {"conv1": ["zero_grad"], "conv2": ["zero_grad"],
                           "dropout1": ["zero_grad"], "fc1": ["zero_grad"],
                           "dropout2": ["zero_grad"], "fc2": []}


def test_a_healthy_run_flags_nothing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    lines = train(MnistNet(), tmp_path, steps=6)
    assert [line["flagged"] for line in lines] == [[]] * 6


def test_a_gradient_that_grows_from_its_own_first_value_explodes(tmp_path: Path) -> None:
    """No loss given: the sensitivity is in loss units, and a loss times 1e4 from step 2 on
    multiplies it by 1e4 (> CHANGE), while staying under EXPLODE."""
    torch.manual_seed(0)
    lines = train(MnistNet(), tmp_path, steps=4, lr=1e-6, give_loss=False,
                  scale=lambda step: 1e4 if step >= 2 else 1.0)
    assert [line["flagged"] for line in lines[:2]] == [[], []]
    for line in lines[2:]:
        assert all(row["flags"] == ["explode"] for row in line["layers"]), line["flagged"]
        assert all(row["grad_norm"] * _output_norm(row) < EXPLODE for row in line["layers"])


@pytest.mark.parametrize(("norm", "sens", "first", "want"), [
    (0.0, 0.0, 1.0, ["zero_grad"]),
    (1.0, VANISH / 2, None, ["vanish"]), (1.0, EXPLODE * 2, None, ["explode"]),
    (1.0, 0.5 / CHANGE, None, []), (1.0, 0.5 / CHANGE, 1.0, ["vanish"]),
    (1.0, 2.0 * CHANGE, None, []), (1.0, 2.0 * CHANGE, 1.0, ["explode"]),
    (1.0, math.nan, 1.0, []), (None, None, None, []),
])
def test_the_rule(norm: float | None, sens: float | None, first: float | None,
                  want: list[str]) -> None:
    assert grad_flags(norm, sens, first) == want
