"""The edges every command shares: signals, outputs checked before the model loads, limits,
model kinds hookscope cannot run, and a model that crashes, in each command alike."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hookscope.inputs.resolve import unique_stems

ROOT = Path(__file__).resolve().parent.parent
CAT = str(ROOT / "sample_images" / "cat.jpg")
SMALL = ("--weights", "none", "--size", "64")
RANDOM_INIT = "random initialisation"  # the warning --weights auto prints once loaded


def one_line(result, code: int) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("hookscope: error: "), result.stderr
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*"))


# ------------------------------------------------------------------------- signals


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = os.environ | {"HOOKSCOPE_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "hookscope", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


#: A hang guard, not an expected duration: a stopped run that has not ended by then is stuck.
HANG_GUARD = 300


def _stop_midway(args: list[str], cwd: Path, signum: int, group: bool = False
                 ) -> tuple[int, str]:
    """Start a long run, wait until the model has loaded and is running, send ``signum`` to
    it, or to its whole process group (its DataLoader workers too) as a terminal's Ctrl-C or
    a service manager's stop does."""
    proc = _start(args, cwd)
    assert proc.stderr is not None
    line = proc.stderr.readline()  # the random-initialisation warning: the model is loaded
    assert RANDOM_INIT in line, line
    time.sleep(1.0)
    assert proc.poll() is None, "the run ended before the signal"
    if group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    try:
        _, rest = proc.communicate(timeout=HANG_GUARD)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, rest


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    """64 inputs of 224 px: several seconds of resnet50 on two cores."""
    path = tmp_path_factory.mktemp("many") / "many.pt"
    torch.manual_seed(0)
    torch.save(torch.randn(64, 3, 224, 224), path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("signum,command", [
    (signal.SIGTERM, ["stats", "-f", "json", "-o", "stats.json"]),
    (signal.SIGHUP, ["gradcam", "--out", "out"]),
    (signal.SIGTERM, ["features", "--layer", "layer1.0.conv1", "--out", "out"]),
    (signal.SIGINT, ["features", "--layer", "conv1", "--out", "out", "-b", "4"]),
    (signal.SIGTERM, ["stats", "--workers", "2", "-b", "4", "-f", "json", "-o", "stats.json"]),
    (signal.SIGTERM, ["stats", "--workers", "2", "-b", "4", "-f", "json", "-o", "stats.json",
                      "group"]),
    (signal.SIGINT, ["stats", "--workers", "2", "-b", "4", "-f", "json", "-o", "stats.json",
                     "group"]),
    (signal.SIGHUP, ["stats", "--workers", "2", "-b", "4", "-f", "json", "-o", "stats.json",
                     "group"]),
    (signal.SIGTERM, ["watch", "--label", "0", "--steps", "1000", "--every", "1", "-b", "4",
                      "--log-dir", "runs/exp1"]),
], ids=["stats-TERM", "gradcam-HUP", "features-TERM", "features-INT", "stats-workers-TERM",
        "stats-workers-group-TERM", "stats-workers-group-INT", "stats-workers-group-HUP",
        "watch-TERM"])
def test_a_signal_midway_leaves_nothing_and_says_so(tmp_path, many, signum, command) -> None:
    name, *options = command
    group = options[-1] == "group"
    code, stderr = _stop_midway([name, "resnet50", str(many), "--weights", "auto",
                                 *options[:len(options) - group]], tmp_path, signum, group)
    expected = 130 if signum == signal.SIGINT else 128 + signum
    assert code == expected, stderr
    lines = [ln for ln in stderr.strip().splitlines() if "note:" not in ln]
    assert len(lines) == 1 and "no output was written" in lines[0], stderr
    assert "Traceback" not in stderr
    assert leftovers(tmp_path) == [], "no file, temporary file or created folder may remain"


# ------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("args", [
    ["stats", "resnet18", CAT, "-o", f"{CAT}/x.json"],
    ["stats", "resnet18", CAT, "-o", "/proc/x.json"],
    ["layers", "resnet18", "-o", "/proc/x.json"],
    ["gradcam", "resnet18", CAT, "--out", f"{CAT}/sub"],
    ["features", "resnet18", CAT, "--layer", "conv1", "--out", f"{CAT}/sub"],
    ["debug", "resnet18", CAT, "-o", f"{CAT}/x.txt"],
    ["models", "-o", "/proc/x.json"],
])
def test_output_locations_are_checked_before_the_model_loads(cli, args) -> None:
    line = one_line(cli(*args, "--weights", "auto") if args[0] != "models" else cli(*args), 2)
    assert "not a directory" in line or "/proc" in line
    # --weights auto warns once the model has loaded: it never got that far.


def test_dash_is_stdout_and_links_are_written_through(cli, tmp_path) -> None:
    dash = cli("layers", "resnet18", *SMALL, "-f", "json", "-o", "-")
    assert dash.exit_code == 0 and json.loads(dash.stdout)["command"] == "layers"
    assert not Path("-").exists()
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    done = cli("layers", "resnet18", *SMALL, "-f", "json", "-o", link, "--force")
    assert done.exit_code == 0, done.stderr
    assert link.is_symlink() and json.loads(target.read_text())["command"] == "layers"
    assert cli("layers", "resnet18", *SMALL, "-f", "json", "-o", "/dev/null").exit_code == 0


def test_a_full_disk_is_one_line(cli) -> None:
    line = one_line(cli("layers", "resnet18", *SMALL, "-f", "json", "-o", "/dev/full"), 2)
    assert "/dev/full" in line and "space" in line.lower()


def test_every_command_has_the_common_output_options(cli) -> None:
    for command in ("stats", "models", "layers", "debug", "gradcam", "grads", "features",
                    "ablate"):
        text = cli(command, "--help").stdout
        for flag in ("--output", "--force", "--quiet", "--traceback", "--format"):
            assert flag in text, (command, flag)


# ------------------------------------------------------------------------- limits, kinds


@pytest.mark.parametrize("args,message", [
    (["--size", "100000"], "between 8 and 8192"),
    (["--size", "8000", "-b", "4096"], "GiB"),
    (["-b", "100000"], "between 1 and 4096"),
])
def test_sizes_that_cannot_fit_are_refused(cli, args, message) -> None:
    assert message in one_line(cli("stats", "resnet18", CAT, "--weights", "none", *args), 2)


@pytest.mark.parametrize("args,message", [
    (["stats", "raft_small", CAT], "optical-flow"),
    (["layers", "raft_small"], "optical-flow"),
    (["grads", "fasterrcnn_mobilenet_v3_large_320_fpn", CAT], "detection model"),
    (["grads", "fcn_resnet50", CAT], "segmentation model"),
    (["ablate", "ssdlite320_mobilenet_v3_large", CAT, "--layer", "x"], "detection model"),
    (["gradcam", "r3d_18", CAT], "video"),
])
def test_model_kinds_that_cannot_run_are_refused_before_the_forward(cli, args, message) -> None:
    assert message in one_line(cli(*args, "--weights", "none"), 2)


# ------------------------------------------------------------------------- a crashing model


@pytest.fixture(scope="module")
def gray(tmp_path_factory) -> str:
    """A one-channel input: resnet18's conv1 raises on it."""
    path = tmp_path_factory.mktemp("gray") / "gray.pt"
    torch.save(torch.randn(1, 1, 64, 64), path)
    return str(path)


@pytest.mark.parametrize("args", [
    ["stats", "-f", "json", "-o", "{out}/x.json"],
    ["layers", "-f", "json", "-o", "{out}/x.json"],
    ["debug", "-f", "json", "-o", "{out}/x.json"],
    ["gradcam", "--out", "{out}/cams"],
    ["grads", "-f", "csv", "-o", "{out}/x.csv"],
    ["features", "--layer", "layer1.0.conv1", "--out", "{out}/maps"],
    ["ablate", "--layer", "layer4", "-o", "{out}/x.txt"],
    ["ablate", "--layer", "layer4", "--sweep", "--channels", "0-3", "-o", "{out}/x.txt"],
])
def test_a_crashing_model_is_one_line_exit_1_and_no_file(cli, tmp_path, gray, args) -> None:
    name, *options = args
    options = [o.replace("{out}", str(tmp_path)) for o in options]
    result = cli(name, "resnet18", gray, "--weights", "none", *options)
    line = one_line(result, 1)
    assert "conv1 (Conv2d, input shapes [[1, 1, 64, 64]])" in line, line
    assert leftovers(tmp_path) == []


def test_debug_still_traces_a_crash_on_stdout(cli, gray) -> None:
    result = cli("debug", "resnet18", gray, "--weights", "none", "-f", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["summary"]["error"]["name"] == "conv1"
    assert doc["events"][-1]["event"] == "error"


def test_debug_prints_nothing_before_a_bad_selection(cli) -> None:
    result = cli("debug", "resnet18", CAT, *SMALL, "--layers", "nothing*")
    assert result.stdout == "" and "matches no module" in one_line(result, 2)


# ------------------------------------------------------------------------- selection, modes


def test_unique_stems_never_collide() -> None:
    assert unique_stems(["cat", "cat", "cat_1"]) == ["cat", "cat-2", "cat_1"]
    assert unique_stems(["cat", "cat", "cat-2"]) == ["cat", "cat-3", "cat-2"]
    assert unique_stems(["a", "b", "a", "a"]) == ["a", "b", "a-2", "a-3"]


def test_same_stem_twice_writes_two_feature_grids(cli, tmp_path) -> None:
    twin = tmp_path / "in" / "cat.jpg"
    twin.parent.mkdir()
    twin.write_bytes(Path(CAT).read_bytes())
    out = tmp_path / "maps"
    result = cli("features", "resnet18", CAT, twin, *SMALL, "--layer", "conv1", "--out", out,
                 "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["cat-2.conv1.png", "cat.conv1.png"]


def test_wildcards_select_leaves_and_exact_names_select_containers(cli) -> None:
    def names(*args: str) -> set[str]:
        doc = json.loads(cli("stats", "resnet18", CAT, *SMALL, "-f", "json", *args).stdout)
        return {row["name"] for row in doc["layers"]}

    leaves = names("--layers", "layer4.*")
    assert "layer4.0.conv1" in leaves and "layer4.0" not in leaves
    assert names("--layers", "layer4") == {"layer4"}
    assert "layer4.0" in names("--layers", "layer4.*", "--all-modules")


def test_layers_and_type_that_do_not_overlap_say_so(cli) -> None:
    line = one_line(cli("stats", "resnet18", CAT, *SMALL, "-l", "layer4.*", "-t", "Linear"), 2)
    assert "each match modules, but no module matches both" in line


def test_train_mode_uses_batch_statistics(cli, tmp_path) -> None:
    path = tmp_path / "x.pt"
    torch.manual_seed(0)
    torch.save(torch.randn(4, 3, 64, 64) * 3 + 2, path)

    def bn1(*extra: str) -> dict:
        doc = json.loads(cli("stats", "resnet18", path, "--weights", "none", "-f", "json",
                             "--layers", "bn1", *extra).stdout)
        return doc["layers"][0]

    train, evaluated = bn1("--train-mode"), bn1()
    assert abs(train["mean"]) < 1e-4 and train["std"] == pytest.approx(1.0, abs=1e-2)
    assert abs(evaluated["mean"] - train["mean"]) > 1e-3  # running statistics: not normalised


def test_targets_and_labels(cli, tmp_path) -> None:
    line = one_line(cli("gradcam", "resnet18", CAT, *SMALL, "--target", "top0",
                        "--out", tmp_path), 2)
    assert "ranks start at top1" in line and "laptop" not in line
    line = one_line(cli("grads", "resnet18", CAT, *SMALL, "--loss", "ce"), 2)
    assert line.endswith("--loss ce needs --label: the true class (an index or a label).")
