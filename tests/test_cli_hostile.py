"""What a new user found by trying hookscope the hostile way (issue 21, items 7 to 25): odd
seeds, streams and terminals, models that print, exit or return NaN, FIFOs, outputs that are
inputs, and the words of messages, tables and help."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import TinyNet

ROOT = Path(__file__).resolve().parent.parent
CAT = str(ROOT / "sample_images" / "cat.jpg")
SMALL = ("--size", "64")
#: A hang guard, not a timing: a run that reads its input twice waits forever.
HANG = 300

MODELS = f"""
import sys
import time

import torch
from torch import nn


{inspect.getsource(TinyNet)}

class Printing(TinyNet):
    def forward(self, x):
        print("hello from the model")
        return super().forward(x)


class ExitingLinear(nn.Linear):
    def forward(self, x):
        sys.exit(7)


class Exiting(TinyNet):
    def __init__(self):
        super().__init__()
        self.fc = ExitingLinear(8, 5)


class NanLogits(TinyNet):
    def forward(self, x):
        return super().forward(x) * float("nan")


class Slow(TinyNet):
    def forward(self, x):
        print("running", file=sys.stderr, flush=True)
        time.sleep(0.2)
        return super().forward(x)
"""


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> str:
    """The tests' TinyNet and variants of it, as a model file: ``{net}:Printing``."""
    path = tmp_path_factory.mktemp("code") / "hostile_net.py"
    path.write_text(MODELS)
    return str(path)


def one_line(result, code: int = 2) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("hookscope: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def hookscope(*args: object, env: dict[str, str] | None = None, cwd: Path | None = None,
              shell: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the installed command line in a child process (``shell``: through bash)."""
    base = os.environ | {"HOOKSCOPE_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "hookscope", *map(str, args)]
    if shell:
        command = ["bash", "-c", " ".join(command)]
    return subprocess.run(command, capture_output=True, text=True, env=base | (env or {}),
                          cwd=cwd, timeout=HANG)


# ------------------------------------------------------------------------- 7: a huge seed


def test_a_seed_beyond_64_bits_is_one_line(cli) -> None:
    line = one_line(cli("stats", "resnet18", CAT, "--weights", "none", *SMALL,
                        "--seed", "99999999999999999999"))
    assert "--seed 99999999999999999999" in line and str(2**64 - 1) in line


# ------------------------------------------------------------------------- 9, 10: terminals


TABLES = [
    ["stats", "{net}:TinyNet", CAT, *SMALL],
    ["layers", "{net}:TinyNet", *SMALL],
    ["debug", "{net}:TinyNet", CAT, *SMALL],
    ["grads", "{net}:TinyNet", CAT, *SMALL],
    ["ablate", "{net}:TinyNet", CAT, *SMALL, "--layer", "conv1"],
    ["check", "{net}:TinyNet", CAT, *SMALL],
    ["diff", "{net}:TinyNet", CAT, *SMALL, "--against-dtype", "bfloat16"],
    ["gradcam", "{net}:TinyNet", CAT, *SMALL, "--out", "{tmp}/cams"],
    ["features", "{net}:TinyNet", CAT, *SMALL, "--layer", "conv1", "--out", "{tmp}/maps"],
    ["models", "resnet1*"],
]


@pytest.mark.parametrize("args", TABLES, ids=[a[0] for a in TABLES])
def test_every_table_prints_on_an_ascii_stdout(net, tmp_path, args) -> None:
    from hookscope.cli import app

    args = [a.format(net=net, tmp=tmp_path) for a in args]
    result = CliRunner(charset="ascii").invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() and "Traceback" not in result.stderr
    result.stdout_bytes.decode("ascii")  # nothing but ASCII reached the stream


@pytest.mark.slow
@pytest.mark.parametrize("args", [["layers", "resnet18", "--weights", "none", "--max-depth", "1"],
                                  ["debug", "resnet18", CAT, "--weights", "none", *SMALL,
                                   "--max-depth", "1"]], ids=["layers", "debug"])
def test_a_stdout_that_is_not_utf8_gets_ascii(args) -> None:
    run = hookscope(*args, env={"PYTHONIOENCODING": "ascii"})
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert "->" in run.stdout  # the arrows, in ASCII


@pytest.mark.slow
def test_columns_zero_is_ignored(net) -> None:
    run = hookscope("stats", f"{net}:TinyNet", CAT, *SMALL, env={"COLUMNS": "0"})
    assert run.returncode == 0, run.stderr
    assert "conv1" in run.stdout and "non-finite" in run.stdout


# ------------------------------------------------------------------------- 11: a model prints


def test_a_model_that_prints_leaves_the_json_intact(cli, net) -> None:
    for command in ("stats", "grads", "check"):
        result = cli(command, f"{net}:Printing", CAT, *SMALL, "-f", "json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["command"] == command
        assert "hello from the model" in result.stderr
    debug = cli("debug", f"{net}:Printing", CAT, *SMALL, "-f", "ndjson")
    assert [json.loads(line)["event"] for line in debug.stdout.splitlines()][-1] == "summary"
    assert "hello from the model" in debug.stderr


# ------------------------------------------------------------------------- 12: read once


@pytest.fixture()
def weights(tmp_path) -> Path:
    torch.manual_seed(3)
    path = tmp_path / "w.pt"
    torch.save(TinyNet().state_dict(), path)
    return path


@pytest.mark.slow
def test_process_substitutions_are_read_once(net, weights) -> None:
    run = hookscope("stats", f"{net}:TinyNet", f"<(cat {CAT})", *SMALL, "-f", "json",
                    "--weights", f"<(cat {weights})", shell=True)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["weights"]["loaded"].startswith("file:/dev/fd/")
    again = hookscope("stats", f"{net}:TinyNet", CAT, *SMALL, "-f", "json", "--weights", weights)
    assert json.loads(again.stdout)["layers"] == doc["layers"]  # the same image, same weights


@pytest.mark.slow
def test_a_named_fifo_is_read_once(net, tmp_path) -> None:
    fifo = tmp_path / "in.jpg"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as fh:  # blocks until hookscope opens it
            fh.write(Path(CAT).read_bytes())

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    run = hookscope("stats", f"{net}:TinyNet", fifo, *SMALL, "-f", "json")
    writer.join(timeout=HANG)
    assert run.returncode == 0, run.stderr
    plain = hookscope("stats", f"{net}:TinyNet", CAT, *SMALL, "-f", "json")
    assert json.loads(run.stdout)["layers"] == json.loads(plain.stdout)["layers"]


# ------------------------------------------------------------------------- 13: sys.exit


def test_sys_exit_in_a_forward_is_exit_1_naming_the_module(cli, net) -> None:
    line = one_line(cli("stats", f"{net}:Exiting", CAT, *SMALL), 1)
    assert "fc (ExitingLinear" in line and "SystemExit: 7" in line


# ------------------------------------------------------------------------- 14: NaN logits


def test_nonfinite_logits_give_no_prediction(cli, net, tmp_path) -> None:
    model = f"{net}:NanLogits"
    stats = cli("stats", model, CAT, *SMALL, "-f", "json")
    assert stats.exit_code == 0 and json.loads(stats.stdout)["predictions"] == [None]
    assert "1 of 1 input(s) have non-finite logits" in stats.stderr
    table = cli("stats", model, CAT, *SMALL).stdout
    assert "non-finite logits: no prediction" in table and "nan%" not in table
    ablated = json.loads(cli("ablate", model, CAT, *SMALL, "--layer", "conv1", "-f",
                             "json").stdout)
    assert ablated["results"][0]["before"] is None and ablated["results"][0]["after"] is None
    check = cli("check", model, CAT, *SMALL, "--expect", "cat.jpg=1", "--min-prob", "0.1",
                "-f", "json")
    assert check.exit_code == 1 and "Traceback" not in check.stderr
    failed = {r["rule"]: r["offenders"] for r in json.loads(check.stdout)["rules"]
              if not r["passed"]}
    assert failed == {"expect": [f"{CAT}: non-finite logits (NaN or Inf), expected 1"],
                      "min_prob": [f"{CAT}: non-finite logits (NaN or Inf)"]}
    page = tmp_path / "report.html"
    report = cli("report", model, CAT, *SMALL, "-o", page)
    assert report.exit_code == 0, report.stderr
    assert "non-finite logits (NaN or Inf): no prediction" in page.read_text()


# ------------------------------------------------------------------------- 15, 20: preprocessing


@pytest.mark.parametrize("args,message", [
    (["--mean", "nan"], "--mean must be finite numbers, not nan"),
    (["--std", "0.2,inf,0.2"], "--std must be finite numbers"),
    (["--resize", "32", "--crop", "64"], "would be padded with zeros"),
    (["--resize", "100"], "The centre crop (224 px) is larger"),
])
def test_preprocessing_that_cannot_be_meant_is_refused(cli, args, message) -> None:
    assert message in one_line(cli("stats", "resnet18", CAT, "--weights", "none", *args))


# ------------------------------------------------------------------------- 16: diff --fail


def test_offline_diff_fails_when_a_statistic_turns_null(cli, net, tmp_path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert cli("stats", f"{net}:TinyNet", CAT, *SMALL, "-f", "json", "-o", a).exit_code == 0
    doc = json.loads(a.read_text())
    doc["layers"][2]["std"] = None  # overflowed: null, with no non-finite value counted
    b.write_text(json.dumps(doc))
    assert cli("diff", a, a, "--fail").exit_code == 0
    line = one_line(cli("diff", a, b, "--fail"), 1)
    assert doc["layers"][2]["name"] in line and "null (non-finite) on one side only" in line


# ------------------------------------------------------------------------- 17: blank maps


def test_blank_and_nonfinite_maps_have_no_peak(cli, net, tmp_path) -> None:
    zero, bad = tmp_path / "zero.pt", tmp_path / "bad.pt"
    torch.save(torch.zeros(1, 3, 64, 64), zero)
    x = torch.randn(1, 3, 64, 64)
    x[0, 0, 0, 0] = float("nan")
    torch.save(x, bad)
    for path, warning in ((zero, "zero everywhere at layer"), (bad, "is not finite (NaN or Inf")):
        result = cli("gradcam", f"{net}:TinyNet", path, *SMALL, "--out", tmp_path / path.stem,
                     "-f", "json", "--save-raw")
        assert result.exit_code == 0, result.stderr
        row = json.loads(result.stdout)["results"][0]
        assert row["peak"] is None and warning in result.stderr
    assert "zero everywhere" not in result.stderr  # the NaN input is blamed, not the layer


# ------------------------------------------------------------------------- 18: arguments


def test_model_args_for_a_model_not_from_code_are_refused(cli) -> None:
    line = one_line(cli("stats", "resnet18", CAT, "--weights", "none", "--model-arg", "foo=1"))
    assert "--model-arg" in line and "resnet18 is not one" in line


def test_ablate_refuses_a_second_layer(cli, net) -> None:
    line = one_line(cli("ablate", f"{net}:TinyNet", CAT, *SMALL, "--layer", "conv1",
                        "--layer", "fc"))
    assert "--layer is given 2 times (conv1, fc)" in line


# ------------------------------------------------------------------------- 19: -o an input


def test_an_output_that_is_an_input_is_refused_even_with_force(cli, net, tmp_path,
                                                               weights) -> None:
    image = tmp_path / "images" / "cat.jpg"
    image.parent.mkdir()
    image.write_bytes(Path(CAT).read_bytes())
    before = image.read_bytes()
    for output, args in ((image, [image]), (image, [image.parent]), (weights, [CAT]),
                         (Path(net), [CAT])):
        more = ["--weights", weights] if output == weights else []
        line = one_line(cli("stats", f"{net}:TinyNet", *args, *SMALL, *more, "-f", "json",
                            "-o", output, "--force"))
        assert f"{output} is" in line and "would replace it" in line
    assert image.read_bytes() == before
    doc = tmp_path / "a.json"
    assert cli("stats", f"{net}:TinyNet", CAT, *SMALL, "-f", "json", "-o", doc).exit_code == 0
    assert "would replace it" in one_line(cli("diff", doc, doc, "-o", doc, "--force"))


# ------------------------------------------------------------------------- 21: SIGUSR1


@pytest.mark.slow
def test_sigusr1_stops_cleanly_and_leaves_no_folder(net, tmp_path) -> None:
    many = tmp_path / "many.pt"
    torch.save(torch.randn(200, 3, 32, 32), many)
    work = tmp_path / "work"
    work.mkdir()
    env = os.environ | {"HOOKSCOPE_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "hookscope", "gradcam", f"{net}:Slow", many,
                             "--size", "32", "-b", "1", "--out", "out"], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    while "running" not in (line := proc.stderr.readline()):  # the model runs
        assert line, "the run ended before the signal"
    proc.send_signal(signal.SIGUSR1)
    _, rest = proc.communicate(timeout=HANG)
    assert proc.returncode == 128 + signal.SIGUSR1, rest
    assert "stopped by SIGUSR1; no output was written" in rest and "Traceback" not in rest
    assert list(work.iterdir()) == []


# ------------------------------------------------------------------------- 23: kinds


def test_the_segmentation_refusal_names_gradcam(cli) -> None:
    line = one_line(cli("grads", "fcn_resnet50", CAT, "--weights", "none"))
    assert "gradcam" in line and "features" in line


# ------------------------------------------------------------------------- 24, 25: tables


@pytest.fixture(scope="module")
def resnet_doc() -> dict:
    from hookscope.cli import app

    result = CliRunner().invoke(app, ["stats", "resnet18", CAT, "--weights", "none", *SMALL,
                                      "-f", "json", "--percentiles", "1,99"])
    return json.loads(result.stdout)


def _drawn(view: object, width: int) -> list[str]:
    from hookscope.render.console import render_text

    return render_text(view, width).splitlines()  # type: ignore[arg-type]


def test_requested_percentiles_are_the_last_columns(resnet_doc) -> None:
    from hookscope.render.tables import stats_view

    lines = _drawn(stats_view(resnet_doc, percentiles=("1", "99")), 200)
    heading = next(line for line in lines if "layer" in line and "mean" in line)
    assert heading.split()[-2:] == ["p1", "p99"]
    narrow = _drawn(stats_view(resnet_doc, percentiles=("1", "99")), 120)
    assert max(map(len, narrow)) <= 120 and "…" not in "\n".join(narrow)  # folded, not cut


def test_the_header_fits_80_columns(resnet_doc) -> None:
    from hookscope.render.tables import stats_view

    lines = _drawn(stats_view(resnet_doc), 80)
    assert lines[0].startswith("resnet18  weights: random (seed 0)  device: cpu")
    assert len(lines[0]) <= 80 and lines[1].startswith("layer calls: ")  # wrapped between words


@pytest.mark.parametrize("command", ["stats", "layers", "ablate", "grads", "check"])
def test_tables_in_files_and_pipes_have_no_trailing_spaces(cli, net, tmp_path, command) -> None:
    args = [command, f"{net}:TinyNet", *([] if command == "layers" else [CAT]), *SMALL,
            *(["--layer", "conv1"] if command == "ablate" else [])]
    piped = cli(*args)
    assert piped.exit_code == 0, piped.stderr
    out = tmp_path / "table.txt"
    assert cli(*args, "-o", out).exit_code == 0
    for text in (piped.stdout, out.read_text()):
        assert text.strip() and not [line for line in text.splitlines() if line.endswith(" ")]


def test_nonfinite_numbers_are_a_dash_as_json_has_null(cli, net, tmp_path) -> None:
    bad = tmp_path / "bad.pt"
    torch.save(torch.full((1, 3, 64, 64), float("nan")), bad)
    doc = json.loads(cli("stats", f"{net}:TinyNet", bad, *SMALL, "-f", "json").stdout)
    assert doc["layers"][0]["mean"] is None
    table = cli("stats", f"{net}:TinyNet", bad, *SMALL).stdout
    conv1 = next(line for line in table.splitlines() if " conv1 " in line)
    assert "nan" not in conv1 and " - " in conv1


def test_messages_name_what_is_wrong_in_whole_words(cli, net, tmp_path) -> None:
    holder = tmp_path / "objects.pt"
    torch.save({"when": __import__("datetime").date(2024, 1, 1)}, holder)
    line = one_line(cli("stats", "resnet18", holder, "--weights", "none"))
    assert "holds Python objects besides tensors" in line and "\x1b" not in line
    bare = net.removesuffix(":TinyNet")
    line = one_line(cli("stats", bare, CAT))
    assert f"name the model in it as {bare}:NAME" in line and "checkpoint" not in line


def test_clip_drops_terminal_styles_and_cuts_at_a_space() -> None:
    from hookscope.core.errors import clip

    text = "\x1b[1mWeights only load failed.\x1b[0m " + "`torch.load` from a file " * 20
    cut = clip(text, 100)
    assert "\x1b" not in cut and "[1m" not in cut and cut.endswith(" ...")
    assert cut.startswith("Weights only load failed. `torch.load` from")
    words = text.replace("\x1b[1m", "").replace("\x1b[0m", "").split()
    assert cut.removesuffix(" ...").split() == words[:len(cut.split()) - 1]  # whole words


def test_help_speaks_the_command_line_not_python(cli) -> None:
    for command in ("stats", "layers", "gradcam", "ablate", "check", "diff", "report", "models"):
        text = cli(command, "--help").stdout
        assert not re.search(r"<(list|str|int|float|file|dir|path)", text), (command, text)
        assert "{MODEL}" not in text and "INPUT......" not in text
    usage = cli("stats", "--help").stdout.splitlines()[0]
    assert usage.endswith("stats [OPTIONS] MODEL [INPUT...]")  # none with --data
    assert "--layers TEXT" in cli("stats", "--help").stdout
