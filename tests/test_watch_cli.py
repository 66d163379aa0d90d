"""``hookscope watch MODEL DATA``: smoke training under hookscope.watch, and the logs it
keeps read back by ``check`` and ``report``.

The losses are checked against an independent float64 computation of the same SGD steps;
the model file is checked byte for byte."""

from __future__ import annotations

import hashlib
import json
import signal
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torch import nn
from typer.testing import CliRunner

from hookscope.cli import app

pytestmark = pytest.mark.usefixtures("one_thread")

NET = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, classes: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, classes)

    def forward(self, x):
        return self.fc(self.pool(self.act(self.conv(x))).flatten(1))
'''
LABELS = [0, 2, 1, 2]


def run(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("watch")
    (root / "net.py").write_text(NET)
    torch.manual_seed(1)
    batch = torch.randn(4, 3, 12, 12)
    torch.save(batch, root / "x.pt")
    return {"root": root, "model": root / "net.py", "x": root / "x.pt"}


def _net(work: dict[str, Path]) -> nn.Module:
    """The model as `--weights none --seed 0` builds it, in float64."""
    namespace: dict[str, Any] = {}
    exec(compile(NET, "net.py", "exec"), namespace)  # noqa: S102
    torch.manual_seed(0)
    return namespace["Net"]().double()


def _sgd_losses(work: dict[str, Path], steps: int, lr: float) -> list[float]:
    """Cross-entropy of each step of plain SGD on the one batch, by hand, in float64."""
    net = _net(work).train()
    x = torch.load(work["x"]).double()
    y = torch.tensor(LABELS)
    losses = []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(net(x), y)
        net.zero_grad()
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
    return losses


def _common(work: dict[str, Path]) -> list[object]:
    return [f"{work['model']}:Net", work["x"], "--weights", "none", "--label",
            ",".join(map(str, LABELS)), "--batch-size", "4"]


def test_overfit_the_loss_falls_as_sgd_by_hand(work) -> None:
    r = run("watch", *_common(work), "--overfit", "--steps", "6", "--lr", "0.5",
            "--every", "2", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "watch" and doc["passed"] and doc["nonfinite"] is None
    got = [row["loss"] for row in doc["loss"]]
    want = _sgd_losses(work, 6, 0.5)
    # float32 forward and backward of a model this size against float64: a few ulp per
    # term, compounded over 6 steps; 1e-4 relative leaves a wide margin.
    assert got == pytest.approx(want, rel=1e-4)
    assert doc["loss_last"] < doc["loss_first"] and doc["steps_run"] == 6


def test_overfit_fails_when_the_loss_does_not_fall(work) -> None:
    r = run("watch", *_common(work), "--overfit", "--steps", "3", "--lr", "0")
    assert r.exit_code == 1, r.output
    assert "--overfit: the loss did not fall" in r.stderr
    assert "FAILED" in r.stdout


def test_an_absurd_learning_rate_names_the_module(work, tmp_path) -> None:
    log = tmp_path / "log"
    r = run("watch", *_common(work), "--steps", "5", "--lr", "1e30", "--format", "json",
            "--log-dir", log)
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    event = doc["nonfinite"]
    assert event["module"] in ("conv", "act", "fc") and event["phase"] in ("forward", "backward")
    assert f"{event['phase']}: {event['module']} (" in event["message"]
    assert event["message"] in r.stderr and not doc["passed"]
    assert doc["steps_run"] < 5
    # The log it kept: check fails on its non-finite event and writes JUnit.
    junit = tmp_path / "check.xml"
    checked = run("check", log, "--junit", junit)
    assert checked.exit_code == 1, checked.output
    failure = ET.parse(junit).getroot().find("testsuite/testcase[@name='nonfinite']/failure")
    assert failure is not None and event["message"] in (failure.text or "")


def test_the_model_file_is_never_written(work, tmp_path) -> None:
    weights = tmp_path / "w.pt"
    torch.save(_net(work).float().state_dict(), weights)
    before = hashlib.sha256(weights.read_bytes()).hexdigest(), weights.stat().st_mtime_ns
    r = run("watch", f"{work['model']}:Net", work["x"], "--weights", weights, "--label", "1",
            "--steps", "3", "--lr", "0.1")
    assert r.exit_code == 0, r.output
    assert (hashlib.sha256(weights.read_bytes()).hexdigest(),
            weights.stat().st_mtime_ns) == before


def test_the_loaded_model_is_left_as_it_came(work) -> None:
    from hookscope.inputs.resolve import iter_batches, resolve_inputs
    from hookscope.sources import LoadOptions, load
    from hookscope.training.smoke import SmokeOptions, smoke_labels, train

    loaded = load(f"{work['model']}:Net", LoadOptions(weights="none"))
    loaded.model.eval()
    state = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    inputs = resolve_inputs([str(work["x"])])
    report = train(loaded, lambda: iter_batches(inputs, loaded.preprocess, batch_size=2),
                   smoke_labels("0,1,2,0", None, None), SmokeOptions(steps=4, lr=0.5))
    assert len(report.losses) == 4 and report.failure is None
    assert all(torch.equal(v, loaded.model.state_dict()[k]) for k, v in state.items())
    assert not any(m.training for m in loaded.model.modules())
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                   for m in loaded.model.modules())
    assert all(p.grad is None for p in loaded.model.parameters())


def test_image_folder_classes_are_the_labels(work, samples, tmp_path) -> None:
    from hookscope.training.smoke import smoke_labels

    data = tmp_path / "data"
    for folder, name in (("dog", "cat.jpg"), ("cat", "coffee.jpg"), ("cat", "rocket.jpg")):
        (data / folder).mkdir(parents=True, exist_ok=True)
        (data / folder / name).write_bytes((samples / name).read_bytes())
    r = run("watch", f"{work['model']}:Net", data, "--weights", "none", "--size", "16",
            "--steps", "2", "--format", "json")
    assert r.exit_code == 0, r.output
    assert "cat=0, dog=1" in r.stderr  # as torchvision's ImageFolder numbers them
    assert smoke_labels(None, ["dog", "cat"], None).entries == (1, 0)
    assert smoke_labels(None, ["2", "0"], None).entries == (2, 0)


def test_more_class_folders_than_classes_says_where_the_classes_came_from(work, samples,
                                                                         tmp_path) -> None:
    data = tmp_path / "data"
    for folder, name in (("bird", "cat.jpg"), ("cat", "coffee.jpg"), ("dog", "rocket.jpg")):
        (data / folder).mkdir(parents=True, exist_ok=True)
        (data / folder / name).write_bytes((samples / name).read_bytes())
    r = run("watch", f"{work['model']}:Net", data, "--weights", "none", "--model-arg", "classes=2",
            "--size", "16", "--steps", "2")
    assert r.exit_code == 2, r.output
    [line] = r.stderr.strip().splitlines()[-1:]
    assert "--label" not in line.split(";")[0]
    assert "class folder 'dog' is class 2 (the class folders in sorted order)" in line
    assert "the model has 2 classes (0 to 1)" in line


def test_bad_input_is_one_line_before_training(work, tmp_path) -> None:
    no_labels = run("watch", f"{work['model']}:Net", work["x"], "--weights", "none")
    assert no_labels.exit_code == 2 and "--label" in no_labels.stderr
    log = tmp_path / "log"
    log.mkdir()
    (log / "watch.jsonl").write_text("{}\n")
    taken = run("watch", *_common(work), "--log-dir", log, "--steps", "2")
    assert taken.exit_code == 2 and "--force" in taken.stderr, taken.output
    assert "--log-dir" in taken.stderr and "--out" not in taken.stderr, taken.output
    assert (log / "watch.jsonl").read_text() == "{}\n"
    segmentation = run("watch", "fcn_resnet50", work["x"], "--weights", "none", "--label", "0")
    assert segmentation.exit_code == 2 and "segmentation model" in segmentation.stderr
    for r in (no_labels, taken, segmentation):
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_kept_log_draws_the_training_page(work, tmp_path) -> None:
    log, page = tmp_path / "log", tmp_path / "train.html"
    r = run("watch", *_common(work), "--steps", "4", "--every", "1", "--lr", "0.1",
            "--log-dir", log)
    assert r.exit_code == 0, r.output
    drawn = run("report", log, "-o", page)
    assert drawn.exit_code == 0, drawn.output
    text = page.read_text(encoding="utf-8")
    for section in ('id="heat-grad_norm"', 'id="lines-update_ratio"', 'id="lines-loss"'):
        assert section in text
    assert [f'data-name="{n}"' in text for n in ("conv", "act", "fc")] == [True] * 3


def test_rules_check_the_training_log(work, tmp_path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text("max_update_ratio = 1e-9\n")  # any SGD step with lr 0.1 moves more
    r = run("watch", *_common(work), "--steps", "3", "--every", "1", "--lr", "0.1",
            "--rules", rules, "--format", "json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    [_, ratio] = doc["check"]["rules"]
    assert ratio["rule"] == "max_update_ratio" and not ratio["passed"]
    assert doc["failure"] == "1 of 2 rules failed: max_update_ratio" and doc["log_dir"] is None
    rules.write_text("max_grad_norm = 1e9\nlast = 2\n")
    ok = run("watch", *_common(work), "--steps", "3", "--every", "1", "--lr", "0.1",
             "--rules", rules)
    assert ok.exit_code == 0, ok.output
    rules.write_text("min_prob = 0.5\n")
    bad = run("watch", *_common(work), "--rules", rules)
    assert bad.exit_code == 2 and "min_prob checks a model run" in bad.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_the_log_dir_as_it_was(work, tmp_path, monkeypatch,
                                                         signum) -> None:
    from hookscope.session import Interrupted
    from hookscope.training import smoke

    empty, earlier = tmp_path / "empty", tmp_path / "earlier"
    empty.mkdir()
    done = run("watch", *_common(work), "--steps", "2", "--every", "1", "--log-dir", earlier)
    assert done.exit_code == 0, done.output
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}
    step = smoke.TrainProbe.step

    def stopped(self, s) -> None:
        step(self, s)
        if len(self.losses) == 3:  # some lines are written by now
            raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted(signum)

    monkeypatch.setattr(smoke.TrainProbe, "step", stopped)
    for folder, force in ((empty, []), (earlier, ["--force"])):
        r = run("watch", *_common(work), "--steps", "6", "--every", "1", "--log-dir", folder,
                *force)
        assert r.exit_code == (130 if signum == signal.SIGINT else 128 + signum), r.output
        assert "no output was written" in r.stderr
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == \
            (before if force else {}), "the folder is as it was, an earlier log whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "empty"]


def test_the_log_dir_is_never_an_input(work, tmp_path) -> None:
    data = tmp_path / "data" / "val"
    for label in ("0", "1"):
        (data / label).mkdir(parents=True)
        Image.new("RGB", (16, 16), (40 * int(label), 90, 200)).save(data / label / "x.png")
    (tmp_path / "runs").mkdir()
    torch.save(torch.randn(2, 3, 12, 12), tmp_path / "runs" / "x.pt")
    for inputs, log_dir in (([data], data), ([data], data / "0" / "log"),
                            ([tmp_path / "runs" / "x.pt"], tmp_path / "runs"),
                            ([data / "0" / "x.png"], tmp_path / "data")):
        r = run("watch", f"{work['model']}:Net", *inputs, "--weights", "none", "--label", "0",
                "--steps", "1", "--log-dir", log_dir)
        assert r.exit_code == 2, r.output
        assert len(r.stderr.strip().splitlines()) == 1 and "--log-dir" in r.stderr \
            and "an input is never an output" in r.stderr, r.stderr
        assert not (log_dir / "watch.jsonl").exists()
