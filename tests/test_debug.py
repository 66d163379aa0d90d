"""`hookscope debug`: the trace, the first non-finite origin and the crash locator."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hookscope.core.hooks import hook_count
from hookscope.probes.debug import run_debug
from hookscope.sources import load_model

NAN = float("nan")


def events_of(model: nn.Module, x: torch.Tensor, **kw) -> tuple[list[dict], object]:
    events: list = []
    report = run_debug(model, x, on_event=events.append, **kw)
    assert hook_count(model) == 0
    return [e.to_dict() for e in events], report


def ndjson(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def resnet18() -> nn.Module:
    return load_model("resnet18", weights="none", seed=0).model


# ----------------------------------------------------------------------------- the trace


def test_trace_order_shapes_and_statistics(tiny_net) -> None:
    x = torch.randn(2, 3, 8, 8)
    events, report = events_of(tiny_net, x)
    assert [(e["event"], e["name"], e["call"]) for e in events] == [
        ("enter", "conv1", 0), ("exit", "conv1", 0),
        ("enter", "relu", 0), ("exit", "relu", 0),
        ("enter", "block.0", 0), ("exit", "block.0", 0),
        ("enter", "block.1", 0), ("exit", "block.1", 0),
        ("enter", "relu", 1), ("exit", "relu", 1),
        ("enter", "pool", 0), ("exit", "pool", 0),
        ("enter", "fc", 0), ("exit", "fc", 0),
    ]
    with torch.no_grad():
        conv = tiny_net.conv1(x)
        relu = torch.relu(conv)
        block = tiny_net.block(relu)
    first = events[1]
    assert first["output_shape"] == list(conv.shape)
    assert first["mean"] == pytest.approx(conv.double().mean().item(), rel=1e-4, abs=1e-7)
    assert first["std"] == pytest.approx(conv.double().std().item(), rel=1e-4)
    # The in-place ReLU's statistics are of its own output, and its input shape is seen
    # before it runs.
    assert events[3]["min"] == 0.0
    assert events[3]["mean"] == pytest.approx(relu.double().mean().item(), rel=1e-4)
    assert events[8]["input_shapes"] == [list(block.shape)]
    assert events[2]["depth"] == 1 and events[4]["depth"] == 2
    assert report.origin is None and report.error is None
    assert report.calls == 7 and report.samples == 2 and report.output_shapes == [[2, 5]]


def test_selection_limits_the_trace_only(tiny_net) -> None:
    events, _ = events_of(tiny_net, torch.randn(1, 3, 8, 8), types=["ReLU"])
    assert {e["name"] for e in events} == {"relu"}
    events, _ = events_of(tiny_net, torch.randn(1, 3, 8, 8), max_depth=1, all_modules=True)
    assert [e["name"] for e in events if e["event"] == "exit"] == [
        "conv1", "relu", "block", "relu", "pool", "fc"]


# ----------------------------------------------------------------------------- non-finite


def test_nan_in_a_conv_weight_is_the_origin(resnet18) -> None:
    model = resnet18
    conv = model.layer2[0].conv2
    saved = conv.weight.detach().clone()
    with torch.no_grad():
        conv.weight[3, 5, 1, 1] = NAN
    try:
        x = torch.randn(1, 3, 64, 64)
        events, report = events_of(model, x, layers=["fc"])
        with torch.no_grad():
            b = model.layer2[0]
            h = model.layer1(model.maxpool(model.relu(model.bn1(model.conv1(x)))))
            inp = b.relu(b.bn1(b.conv1(h)))
            out = conv(inp)
    finally:
        with torch.no_grad():
            conv.weight.copy_(saved)
    origin = [e for e in events if e["event"] == "nonfinite"]
    assert len(origin) == 1
    o = origin[0]
    assert (o["name"], o["type"], o["call"], o["source"]) == (
        "layer2.0.conv2", "Conv2d", 0, "module")
    assert torch.isfinite(inp).all()
    assert o["input_stats"][0]["nonfinite"] == 0
    assert o["input_stats"][0]["mean"] == pytest.approx(inp.double().mean().item(), rel=1e-4)
    assert o["output_stats"][0]["nonfinite"] == int((~torch.isfinite(out)).sum())
    assert report.origin.name == "layer2.0.conv2"
    assert report.nonfinite_calls == 1  # fc, the only traced call, is non-finite too


def test_inf_in_the_input_is_reported_at_the_first_module(tiny_net) -> None:
    x = torch.randn(1, 3, 8, 8)
    x[0, 1, 2, 3] = float("inf")
    events, report = events_of(tiny_net, x, layers=["fc"])
    (o,) = [e for e in events if e["event"] == "nonfinite"]
    assert (o["name"], o["source"]) == ("conv1", "input")
    assert o["input_stats"][0]["nonfinite"] == 1
    assert report.to_dict()["origin"]["name"] == "conv1"


class LogInPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.log_()  # NaN for negative inputs, and the input is overwritten


class Scaled(nn.Module):
    """A container whose own code (not a child) makes the values non-finite."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.after = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.lin(x) / 0.0)


def test_inputs_are_checked_before_an_in_place_module_runs() -> None:
    model = nn.Sequential(nn.Identity(), LogInPlace(), nn.Identity())
    x = torch.tensor([[-1.0, 2.0]])
    events, report = events_of(model, x)
    assert report.origin is not None
    assert (report.origin.name, report.origin.source) == ("1", "module")
    assert report.origin.input_stats[0]["min"] == -1.0  # seen before log_ overwrote it


def test_a_container_is_the_origin_when_its_own_code_breaks() -> None:
    model = nn.Sequential(Scaled())
    _, report = events_of(model, torch.ones(1, 4))
    assert report.origin.name == "0"  # not 0.after, whose input was already non-finite


# ----------------------------------------------------------------------------- crashes


def test_crash_locator_outside_the_selection(resnet18) -> None:
    events, report = events_of(resnet18, torch.zeros(1, 1, 32, 32), layers=["fc"])
    assert [e["event"] for e in events] == ["error"]
    err = events[0]
    assert (err["name"], err["type"], err["input_shapes"]) == ("conv1", "Conv2d", [[1, 1, 32, 32]])
    assert "channels" in err["message"] and err["exception"] == "RuntimeError"
    assert isinstance(report.failure.cause, RuntimeError)


def test_a_failing_event_consumer_is_not_a_model_crash(tiny_net) -> None:
    def closed(event) -> None:
        raise BrokenPipeError

    with pytest.raises(BrokenPipeError):
        run_debug(tiny_net, torch.randn(1, 3, 8, 8), on_event=closed)
    assert hook_count(tiny_net) == 0


# ----------------------------------------------------------------------------- command line


def test_cli_resnet18_one_channel_224_crash(cli, tmp_path) -> None:
    path = tmp_path / "gray.pt"
    torch.save(torch.zeros(1, 1, 224, 224), path)
    result = cli("debug", "resnet18", path, "--weights", "none")
    assert result.exit_code == 1
    assert "conv1" in result.stdout and "1x1x224x224" in result.stdout
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "conv1" in err[0] and "[1, 1, 224, 224]" in err[0]
    assert "Traceback" not in result.stderr

    result = cli("debug", "resnet18", path, "--weights", "none", "--format", "ndjson",
                 "--type", "Linear", "--traceback")
    assert result.exit_code == 1
    events = ndjson(result.stdout)
    assert [e["event"] for e in events] == ["error", "summary"]
    assert events[0]["name"] == "conv1" and events[0]["input_shapes"] == [[1, 1, 224, 224]]
    assert events[1]["error"]["name"] == "conv1" and events[1]["command"] == "debug"
    assert "Traceback" in result.stderr


def test_cli_nan_checkpoint_origin_and_exit_codes(cli, tmp_path) -> None:
    model = load_model("resnet18", weights="none", seed=3).model
    with torch.no_grad():
        model.layer3[1].conv1.weight[0, 0, 0, 0] = NAN
    ckpt = tmp_path / "nan.pt"
    torch.save(model.state_dict(), ckpt)
    x = tmp_path / "x.pt"
    torch.save(torch.randn(2, 3, 64, 64), x)

    result = cli("debug", "resnet18", x, "--weights", ckpt, "--format", "ndjson")
    assert result.exit_code == 0, result.stderr
    events = ndjson(result.stdout)
    (origin,) = [e for e in events if e["event"] == "nonfinite"]
    assert (origin["name"], origin["type"], origin["source"]) == (
        "layer3.1.conv1", "Conv2d", "module")
    assert all(s["nonfinite"] == 0 for s in origin["input_stats"])
    assert events[-1]["event"] == "summary"
    assert events[-1]["origin"]["name"] == "layer3.1.conv1"
    enters = [e for e in events if e["event"] == "enter"]
    assert len(enters) == len([e for e in events if e["event"] == "exit"]) > 0
    assert all(line.startswith("{") for line in result.stdout.splitlines())

    result = cli("debug", "resnet18", x, "--weights", ckpt, "--fail-on-nonfinite",
                 "--layers", "layer3.1.*")
    assert result.exit_code == 1
    assert "first non-finite: layer3.1.conv1" in result.stdout
    assert "layer3.1.conv1" in result.stderr and "Traceback" not in result.stderr
    traced = {line.split()[1] for line in result.stdout.splitlines()
              if line.lstrip().startswith(("→", "←"))}
    assert traced == {"layer3.1.conv1", "layer3.1.bn1", "layer3.1.relu", "layer3.1.relu#1",
                      "layer3.1.conv2", "layer3.1.bn2"}


def test_cli_inf_input_text_and_json(cli, tmp_path) -> None:
    t = torch.randn(1, 3, 64, 64)
    t[0, 2, 10, 10] = -float("inf")
    path = tmp_path / "inf.pt"
    torch.save(t, path)
    result = cli("debug", "resnet18", path, "--weights", "none", "--format", "json",
                 "--max-depth", "1")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["command"] == "debug" and doc["summary"]["origin"]["name"] == "conv1"
    assert doc["summary"]["origin"]["source"] == "input"
    names = {e["name"] for e in doc["events"] if e["event"] == "exit"}
    assert "layer1" in names and "layer1.0" not in names  # cut at depth 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["resnet19", "{x}"], "resnet18"),
        (["resnet18", "missing.pt", "--weights", "none"], "missing.pt"),
        (["resnet18", "{x}", "--weights", "none", "--layers", "layer9*"], "--layers"),
    ],
)
def test_cli_bad_input(cli, tmp_path, args, message) -> None:
    x = tmp_path / "x.pt"
    torch.save(torch.zeros(3, 32, 32), x)
    result = cli("debug", *[a.format(x=x) for a in args])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


def test_trace_lines_render_as_text() -> None:
    from hookscope.render.tree import trace_line

    enter = {"event": "enter", "name": "layer1.0.relu", "type": "ReLU", "call": 1, "depth": 3,
             "input_shapes": [[1, 64, 8, 8]]}
    assert trace_line(enter).plain == "    → layer1.0.relu#1 ReLU  in 1x64x8x8"
    exit_ = {"event": "exit", "name": "fc", "type": "Linear", "call": 0, "depth": 1,
             "output_shapes": [[1, 10]], "mean": 0.5, "std": 2.0, "min": -1.0, "max": 3.0,
             "nonfinite": 2}
    assert trace_line(exit_).plain == (
        "← fc Linear  out 1x10  mean 0.5  std 2  min -1  max 3  non-finite 2")
