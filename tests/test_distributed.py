"""``torchrun --nproc-per-node 2`` on CPU (gloo): the merged report equals a single-process run
on the same inputs, only rank 0 writes, and a failing rank prints its error, naming its rank,
and torchrun stops the others, without a hang. Each test starts real processes, so they are
marked slow."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_dataset import assert_close_docs, write_images

pytestmark = pytest.mark.slow

TORCHRUN = Path(sys.executable).with_name("torchrun")
#: Bounds joining and every wait (HOOKSCOPE_DIST_TIMEOUT), generous for a loaded machine.
DIST_TIMEOUT = 120
#: A hang guard, not a duration the tests expect: a run that takes this long is stuck.
HANG_GUARD = 600
#: For the tests that a failure ends every rank at once (torchrun stops the others), not after
#: a collective times out: a wait this long would run into the hang guard.
NO_TIMEOUT = {"HOOKSCOPE_DIST_TIMEOUT": str(4 * HANG_GUARD)}
#: torchrun's exit code when any rank failed; its report lists each rank's own.
TORCHRUN_FAILED = 1

MODEL = """
import os
import time

from torch import nn


class Head(nn.Module):
    def __init__(self, classes, fail_on_rank):
        super().__init__()
        self.fc = nn.Linear(16, classes)
        self.fail_on_rank = fail_on_rank

    def forward(self, x):
        if os.environ.get("RANK") == str(self.fail_on_rank):
            raise RuntimeError("this rank's kernels are missing")
        return self.fc(x)


class Small(nn.Module):
    def __init__(self, classes=10, fail_on_rank=-1, die_on_rank=-1, hang_on_rank=-1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = Head(classes, fail_on_rank)
        self.die_on_rank, self.hang_on_rank = die_on_rank, hang_on_rank

    def forward(self, x):
        if os.environ.get("RANK") == str(self.die_on_rank):
            os._exit(9)  # killed without a word
        if os.environ.get("RANK") == str(self.hang_on_rank):
            time.sleep(3600)  # stops responding, without exiting
        return self.head(self.pool(self.features(x)).flatten(1))
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model's file and 20 images of several sizes (7 batches of 3: 3 and 4 per rank)."""
    folder = tmp_path_factory.mktemp("dist")
    (folder / "small_model.py").write_text(MODEL)
    write_images(folder / "imgs", 20)
    return folder


def hookscope(work: Path, *args: object, ranks: int = 2, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    """``hookscope ARGS`` in ``work``, under torchrun when ``ranks`` > 1, one thread each."""
    launcher = [str(TORCHRUN), "--nproc-per-node", str(ranks), "--standalone", "-m"] \
        if ranks > 1 else [sys.executable, "-m"]
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "HOOKSCOPE_DIST_TIMEOUT": str(DIST_TIMEOUT),
               "HOOKSCOPE_OFFLINE": "1", **(env or {})}
    return subprocess.run([*launcher, "hookscope", *map(str, args)], cwd=work, env=environ,
                          capture_output=True, text=True, timeout=HANG_GUARD)


def errors(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("hookscope:")]


def rank_exited(result: subprocess.CompletedProcess[str], rank: int, code: int) -> bool:
    """Whether torchrun's failure report lists ``rank`` with exit code ``code``."""
    return re.search(rf"rank\s*: {rank} \(local_rank: {rank}\)\s*exitcode\s*: {code} ",
                     result.stderr) is not None


def stopped_rank_0(lines: list[str]) -> bool:
    """Whether ``lines`` are at most one line of rank 0 saying it stopped: the signal torchrun
    sends, or the gathering of the reports that the gone rank left."""
    return len(lines) <= 1 and all(
        line.startswith("hookscope: error: rank 0: ")
        and ("no output was written" in line or "another rank stopped" in line)
        for line in lines)


@pytest.fixture()
def run_both(work: Path, cli, one_thread, monkeypatch: pytest.MonkeyPatch):
    """``run_both(name, *args)``: the JSON of a two-rank run, and of one process (in this
    one, with one thread like each rank) on the same command in the same folder."""
    monkeypatch.chdir(work)

    def run(name: str, *args: object) -> tuple[dict, dict]:
        out = work / f"{name}.json"
        result = hookscope(work, *args, "-f", "json", "-o", out, "--force", "-q")
        assert result.returncode == 0, result.stderr
        assert errors(result) == [], result.stderr
        single = cli(*args, "-f", "json", "-q")
        assert single.exit_code == 0, single.stderr
        return json.loads(out.read_text()), json.loads(single.stdout)

    return run


MODEL_ARGS = ["small_model.py:Small", "imgs", "--size", "32", "-b", "3"]


def test_stats_with_channels_and_percentiles_equal_one_process(run_both) -> None:
    ranked, one = run_both("stats", "stats", *MODEL_ARGS, "--per-channel",
                           "--percentiles", "0.1,50,99.9")
    assert ranked["inputs"] == one["inputs"] and len(one["inputs"]) == 20
    assert ranked["predictions"] == one["predictions"]
    assert len(ranked["layers"]) == len(one["layers"]) > 5
    for a, b in zip(ranked["layers"], one["layers"], strict=True):
        # Exactly: counts, min, max, zeros, the sketches; moments within 1e-6 relative.
        for key in ("name", "call", "input_shapes", "output_shape", "output_shapes", "min",
                    "max", "zero_fraction", "nonfinite", "percentiles", "channel_dim"):
            assert a[key] == b[key], (a["name"], key)
        for key in ("mean", "std"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-12), (a["name"], key)
        for ca, cb in zip(a["channels"], b["channels"], strict=True):
            for key in ("channel", "count", "min", "max", "zero_fraction", "nonfinite",
                        "percentiles"):
                assert ca[key] == cb[key], (a["name"], ca["channel"], key)
            for key in ("mean", "std"):
                assert ca[key] == pytest.approx(cb[key], rel=1e-6, abs=1e-12), key


@pytest.mark.parametrize("command, extra", [
    ("grads", ["--loss", "ce", "--label", "3"]),
    ("debug", []),
    ("ablate", ["--layer", "features.3", "--sweep", "--channels", "0-5"]),
])
def test_grads_debug_and_ablate_equal_one_process(run_both, command: str,
                                                  extra: list[str]) -> None:
    ranked, one = run_both(command, command, *MODEL_ARGS, *extra)
    assert_close_docs(ranked, one)


def test_a_rank_without_a_batch_changes_nothing(run_both) -> None:
    # 20 inputs in one batch of 32: rank 1 runs none, and its empty report merges away.
    ranked, one = run_both("grads-one-batch", "grads", "small_model.py:Small", "imgs", "--size",
                           "32", "-b", "32")
    assert_close_docs(ranked, one)


def test_check_with_class_folders_and_junit(work: Path, cli, one_thread,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(work)
    for i, name in enumerate(("0", "7")):  # class folders named by class index
        write_images(work / "classes" / name, 4, seed=10 + i)
    args = ["check", "small_model.py:Small", "classes", "--size", "32", "-b", "3", "-f", "json",
            "-q", "--junit"]
    ranked = hookscope(work, *args, "check.2.xml")
    single = cli(*args, "check.1.xml")
    assert ranked.returncode == single.exit_code in (0, 1), ranked.stderr  # the random verdict
    doc, one = json.loads(ranked.stdout), json.loads(single.stdout)
    assert_close_docs(doc, one)
    expect = next(r for r in doc["rules"] if r["rule"] == "expect")
    assert len(expect["limit"]) == 8
    assert (work / "check.2.xml").read_text() == (work / "check.1.xml").read_text()


def test_a_corrupt_image_on_one_rank_ends_every_rank_naming_the_rank_and_file(work: Path
                                                                             ) -> None:
    bad = work / "bad"
    paths = write_images(bad, 20)
    data = paths[16].read_bytes()
    paths[16].write_bytes(data[: len(data) * 2 // 3])  # rank 1's part; the header still reads
    out = work / "bad.json"
    result = hookscope(work, "stats", "small_model.py:Small", "bad", "--size", "32", "-b", "3",
                       "-f", "json", "-o", out, env=NO_TIMEOUT)  # stopped at once, not by a timeout
    assert result.returncode == TORCHRUN_FAILED and rank_exited(result, 1, 2), result.stderr
    failed = [line for line in errors(result) if line.startswith("hookscope: error: rank 1: ")]
    assert len(failed) == 1, result.stderr
    assert failed[0].startswith("hookscope: error: rank 1: bad/img16.jpg: corrupt or truncated")
    assert stopped_rank_0([line for line in errors(result) if line not in failed]), result.stderr
    assert not out.exists()


def test_a_crash_in_the_model_on_one_rank_names_the_rank_and_the_module(work: Path) -> None:
    out = work / "crash.json"
    result = hookscope(work, "stats", *MODEL_ARGS, "--model-arg", "fail_on_rank=1", "-f", "json",
                       "-o", out)
    assert result.returncode == TORCHRUN_FAILED and rank_exited(result, 1, 1), result.stderr
    failed = [line for line in errors(result) if line.startswith("hookscope: error: rank 1: ")]
    assert len(failed) == 1, result.stderr
    assert "head" in failed[0] and "kernels are missing" in failed[0]
    assert stopped_rank_0([line for line in errors(result) if line not in failed]), result.stderr
    assert not out.exists()


def test_a_rank_killed_without_a_word_ends_the_run_without_output(work: Path) -> None:
    out = work / "killed.json"
    result = hookscope(work, "stats", *MODEL_ARGS, "--model-arg", "die_on_rank=1", "-f",
                       "json", "-o", out, env=NO_TIMEOUT)  # torchrun stops rank 0 at once
    assert result.returncode == TORCHRUN_FAILED and rank_exited(result, 1, 9), result.stderr
    assert stopped_rank_0(errors(result)), result.stderr
    assert not out.exists()


def test_a_rank_that_stops_responding_ends_the_run_after_the_timeout(work: Path) -> None:
    out = work / "hung.json"
    result = hookscope(work, "stats", *MODEL_ARGS, "--model-arg", "hang_on_rank=1", "-f",
                       "json", "-o", out, env={"HOOKSCOPE_DIST_TIMEOUT": "30"})
    assert result.returncode == TORCHRUN_FAILED and rank_exited(result, 0, 1), result.stderr
    lines = errors(result)  # rank 1, stopped by torchrun, says nothing
    assert len(lines) == 1 and lines[0].startswith(
        "hookscope: error: rank 0: gathering the reports failed ("), result.stderr
    assert not out.exists()


def test_a_command_that_does_not_merge_is_refused_by_each_rank(work: Path) -> None:
    result = hookscope(work, "features", *MODEL_ARGS, "--layer", "features.0")
    assert result.returncode == TORCHRUN_FAILED, result.stderr
    refused = [line for line in errors(result)
               if "`hookscope features` does not run under torchrun" in line]
    assert refused, result.stderr  # the first rank to refuse; torchrun may stop the other first
    assert any(rank_exited(result, rank, 2) for rank in (0, 1)), result.stderr
    assert stopped_rank_0([line for line in errors(result) if line not in refused]), \
        result.stderr
