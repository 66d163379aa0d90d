"""``hookscope.watch``'s non-finite locator (issue 28): a step an exception ends, blame by
production (a child, a parent's own code, ambiguity), the messages and ``nonfinite.json``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import MethodType

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


# ----------------------------------------------------------------------------- blame by production


class Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


def resnet(patch: Callable[[torch.Tensor], torch.Tensor] | None = None) -> nn.Module:
    """resnet18 (random weights); ``patch`` runs in ``layer2.0``'s own code on
    ``layer2.0.conv1``'s input, as a user's edited block would."""
    from torchvision.models import resnet18
    from torchvision.models.resnet import BasicBlock

    torch.manual_seed(0)
    model = resnet18(num_classes=4)
    block = model.layer2[0]

    def forward(self: BasicBlock, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(patch(x) if patch else x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))

    block.forward = MethodType(forward, block)
    return model


def located(model: nn.Module, tmp_path: Path) -> hookscope.NonFiniteError:
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(model, tmp_path) as w:
            nn.functional.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.tensor([0, 1])).backward()
            w.step()
    assert hook_count(model) == 0
    return caught.value


def test_a_nan_made_in_a_block_s_own_code_names_the_block(tmp_path: Path) -> None:
    # sqrt(x*x - 1) is NaN where |x| < 1: made between the block's children, not by conv1.
    error = located(resnet(lambda x: torch.sqrt(x * x - 1)), tmp_path)
    assert (error.module, error.phase, error.source) == ("layer2.0", "forward", "code")
    assert "layer2.0 (BasicBlock) made NaN in its own code (before its child layer2.0.conv1)" \
        in str(error)
    doc = json.loads((tmp_path / "nonfinite.json").read_text())["event"]
    assert doc["source"] == "code" and doc["between"] == ["", "layer2.0.conv1"]


def test_two_readers_of_a_tensor_are_named_as_a_doubt(tmp_path: Path) -> None:
    # sqrt(x*x) is finite, but its gradient at the ReLU's exact zeros is NaN; x is read by the
    # block's own code and by the shortcut: the hooks see only the sum of their gradients.
    error = located(resnet(lambda x: torch.sqrt(x * x)), tmp_path)
    assert (error.phase, error.source) == ("backward", "unclear")
    doc = json.loads((tmp_path / "nonfinite.json").read_text())["event"]
    assert sorted(doc["candidates"]) == ["layer2.0 (its own code)", "layer2.0.downsample.0"]
    assert "the hooks cannot tell which" in str(error)
    assert "downsample.0 produced" not in str(error)  # the old, confident, wrong blame


def test_a_nan_made_by_a_child_names_the_child(tmp_path: Path) -> None:
    model = resnet()
    block = model.layer2[0]
    block.bn1 = nn.Sequential(block.bn1, Log())  # log of a batch norm's negative half
    error = located(model, tmp_path)
    assert (error.module, error.phase, error.source) == ("layer2.0.bn1.1", "forward", "module")


def test_a_gradient_made_by_the_only_reader_names_it(tmp_path: Path) -> None:
    model = resnet()
    block = model.layer2[0]
    block.conv2 = nn.Sequential(Sqrt(), block.conv2)  # sqrt of the ReLU's exact zeros
    error = located(model, tmp_path)
    assert (error.module, error.phase, error.source) == ("layer2.0.conv2.0", "backward", "module")


# ----------------------------------------------------------------------------- messages


def test_warn_says_once_that_the_weights_are_nan_and_counts_repeats(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, "hookscope"):
        with hookscope.watch(model, tmp_path, nonfinite="warn") as w:
            for step in range(5):
                if step == 2:
                    with torch.no_grad():
                        model[0].weight[0, 0] = float("nan")
                model(torch.randn(8, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
                w.step()
    lines = [r.getMessage() for r in caplog.records]
    assert [f.module for _, _, f in w.findings] == ["0", "0", "0"]
    assert lines[0].startswith("step 2, forward: 0 (Linear) produced NaN from finite inputs")
    # Step 2's update spreads the NaN: unit 0 is NaN, so the gradients of 0.weight (row 0),
    # 0.bias (entry 0) and 2.weight (column 0) are; 2.bias's (a sum of ones) is not.
    assert lines[1].startswith("step 2: parameter 0.weight (and 2 more) is no longer finite")
    assert lines[2] == "repeated at 2 later steps (the last: 4): " + lines[0]
    assert len(lines) == 3


def test_nonfinite_json_tells_nan_from_no_gradient(tmp_path: Path) -> None:
    model = resnet()
    block = model.layer2[0]
    block.conv2 = nn.Sequential(Sqrt(), block.conv2)
    located(model, tmp_path)
    rows = json.loads((tmp_path / "nonfinite.json").read_text())["steps"][-1]["layers"]
    by = {(r["name"], r["call"]): r for r in rows}
    relu = by[("layer2.0.relu", 0)]  # its output is the sqrt's input: the gradient is not finite
    assert relu["values"] == "finite" and relu["grad_values"] in ("nan", "+inf", "-inf and +inf")
    assert by[("layer2.0.conv2.0", 0)]["grad_values"] == "finite"
    fc = by[("fc", 0)]
    assert fc["values"] == "finite" and fc["grad_values"] == "finite"


def test_check_names_the_event_s_module_first(tmp_path: Path) -> None:
    # A backward NaN: the logged rows before the sqrt (in execution order) hold it too.
    model = resnet()
    block = model.layer2[0]
    block.conv2 = nn.Sequential(Sqrt(), block.conv2)
    with pytest.raises(hookscope.NonFiniteError):
        with hookscope.watch(model, tmp_path, every=1) as w:
            nn.functional.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.tensor([0, 1])).backward()
            w.step()
    checked = CliRunner().invoke(app, ["check", str(tmp_path), "--format", "json"])
    (rule,) = json.loads(checked.stdout)["rules"]
    event = json.loads((tmp_path / "nonfinite.json").read_text())["event"]
    assert event["module"] == "layer2.0.conv2.0" and rule["offenders"][0] == event["message"]
    said = f"the watch stopped on a non-finite value at step 0: {event['message']}; "
    assert rule["detail"].startswith(said)
    assert "the first is" not in rule["detail"]  # no other module named first


def test_the_lightning_callback_reports_a_loss_that_raised(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning")
    from hookscope.integrations.lightning import WatchCallback

    class GAN(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = discriminator()

        def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
            out = self.net(batch[0])
            return nn.functional.binary_cross_entropy(out, torch.ones_like(out))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = GAN()
    trainer = lightning.Trainer(max_steps=2, accelerator="cpu", logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False,
                                callbacks=[WatchCallback(log_dir=tmp_path / "log")])
    data = torch.utils.data.TensorDataset(torch.randn(16, 4))
    with pytest.raises(hookscope.NonFiniteError) as caught:
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    assert caught.value.module == "net.1" and isinstance(caught.value.__cause__, RuntimeError)
    assert (tmp_path / "log" / "nonfinite.json").exists() and hook_count(module) == 0


def test_an_activation_s_range_is_derived_exactly_from_its_input_s(tmp_path: Path) -> None:
    # ReLU and Hardtanh outputs take their (min, max) from the input's (no second reduction):
    # the flight recorder's values are the tensors' own, in place or not, and a NaN made
    # before them is still blamed on its maker, not on the activations it passes through.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(inplace=True),
                          nn.Linear(6, 6), nn.ReLU6(), nn.Hardtanh(-0.1, 0.2), nn.Linear(6, 6), Log(),
                          nn.ReLU())
    seen: dict[str, tuple[float, float]] = {}

    def record(name: str, module: nn.Module, args: tuple[torch.Tensor], out: torch.Tensor) -> None:
        seen.setdefault(name, (out.detach().min().item(), out.detach().max().item()))

    for name, module in model.named_children():
        module.register_forward_hook(partial(record, name))
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(model, tmp_path) as w:
            model(torch.randn(16, 4) * 4).sum().backward()
            w.step()
    assert (caught.value.module, caught.value.source) == ("8", "module")
    rows = json.loads((tmp_path / "nonfinite.json").read_text())["steps"][-1]["layers"]
    by = {r["name"]: r for r in rows}
    for name in ("1", "3", "5", "6"):
        assert (by[name]["min"], by[name]["max"]) == pytest.approx(seen[name], abs=0), name
        assert by[name]["values"] == "finite"
    assert by["9"]["values"] == "nan" and by["9"]["min"] is None  # relu(NaN) is NaN


def test_a_reshape_s_range_is_its_input_s_and_an_allowed_inf_is_still_checked(
        tmp_path: Path) -> None:
    # Flatten and Unflatten take their input's (min, max) unreduced; where the input is only
    # checked for NaN (an allow_inf module's output), a ReLU after it is still checked for ±inf.
    torch.manual_seed(0)
    class Exp(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.exp()

    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Unflatten(1, (2, 36)), Exp(),
                          nn.ReLU(), nn.Flatten(), nn.Linear(72, 1))
    seen: dict[str, tuple[float, float]] = {}

    def record(name: str, module: nn.Module, args: tuple[torch.Tensor], out: torch.Tensor) -> None:
        seen.setdefault(name, (out.detach().min().item(), out.detach().max().item()))

    for name, module in model.named_children():
        module.register_forward_hook(partial(record, name))
    x = torch.randn(4, 1, 8, 8)
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(model, tmp_path / "a", allow_inf=["3"]) as w:
            model(x).sum().backward()
            w.step()
            with torch.no_grad():
                model[0].bias.fill_(1e3)  # exp makes +inf: allowed there
            model(x).sum().backward()
            w.step()
    # The allowed +inf passes the ReLU, whose output is checked: it is the first.
    assert (caught.value.module, caught.value.step) == ("4", 1)
    steps = json.loads((tmp_path / "a" / "nonfinite.json").read_text())["steps"]
    by = {r["name"]: r for r in steps[0]["layers"]}
    for name in ("1", "2", "5"):
        assert (by[name]["min"], by[name]["max"]) == pytest.approx(seen[name], abs=0), name
