"""``hookscope.watch`` under ``torchrun --nproc-per-node 2`` with DDP on gloo: rank 0 writes
rows equal to one process over both ranks' batches, and a NaN on rank 1 ends both ranks
naming rank 1. Real processes, so slow; the subprocess timeout is only a hang guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import hookscope

from .watch_logs import read_log

pytestmark = pytest.mark.slow

TORCHRUN = Path(sys.executable).with_name("torchrun")
#: A generous hang guard: both runs take seconds; a hang would take this long to fail.
HANG_GUARD = 240

SCRIPT = '''
import sys

import torch
import torch.distributed as dist
from torch import nn

import hookscope


class Log(nn.Module):
    """log(x + offset); an absurd offset on one rank makes NaN from finite inputs."""

    def __init__(self):
        super().__init__()
        self.offset = 10.0

    def forward(self, x):
        return torch.log(x + self.offset)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), Log(), nn.Linear(12, 3))


def data(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4 + rank, 6, generator=g), torch.randint(0, 3, (4 + rank,), generator=g)


def main(mode, log_dir, out):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = net()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.0)  # the weights stay those of the reference
    try:
        with hookscope.watch(ddp, log_dir, every=2) as w:
            for step in range(5):
                x, y = data(step, rank)
                if mode == "nan" and rank == 1 and step == 3:
                    model[3].offset = -1e6
                loss = nn.functional.cross_entropy(ddp(x), y, reduction="sum")
                loss.backward()
                opt.step()
                opt.zero_grad()
                w.step()
        result = "ok"
    except hookscope.NonFiniteError as exc:
        result = f"{exc.rank}|{exc.module}|{exc.phase}|{exc.step}|{exc}"
    with open(f"{out}-{rank}.txt", "w") as f:
        f.write(result)
    dist.barrier()  # both ranks are done before either tears the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
'''


def torchrun(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HOOKSCOPE_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(hookscope.__file__).parents[1]),
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", "--standalone",
                           str(folder / "script.py"), *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("watch-ddp")
    (work / "script.py").write_text(SCRIPT)
    return work


def load_script(folder: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("watch_ddp_script", folder / "script.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FIELDS = ("mean", "std", "min", "max", "zero_fraction", "nonfinite", "grad_norm", "grad_mean",
          "grad_std", "grad_nonfinite")


def test_rank_zero_writes_rows_equal_to_one_process_over_both_batches(folder: Path) -> None:
    result = torchrun(folder, "train", str(folder / "log"), str(folder / "train"))
    assert result.returncode == 0, result.stderr
    assert (folder / "train-0.txt").read_text() == "ok" == (folder / "train-1.txt").read_text()
    envelope, lines, event = read_log(folder / "log")
    assert envelope["world_size"] == 2 and event is None
    assert [line["step"] for line in lines] == [0, 2, 4]

    script = load_script(folder)
    model = script.net()
    torch.set_num_threads(1)
    with hookscope.watch(model, folder / "single", every=2) as w:
        for step in range(5):
            (x0, y0), (x1, y1) = script.data(step, 0), script.data(step, 1)
            out = model(torch.cat([x0, x1]))
            nn.functional.cross_entropy(out, torch.cat([y0, y1]), reduction="sum").backward()
            model.zero_grad()
            w.step()
    _, single, _ = read_log(folder / "single")
    for merged, alone in zip(lines, single, strict=True):
        assert len(merged["layers"]) == len(alone["layers"]) == 5
        for a, b in zip(merged["layers"], alone["layers"], strict=True):
            assert a["name"] == "module." + b["name"] and a["call"] == b["call"]
            for key in FIELDS:
                if isinstance(b[key], float):
                    # The same float32 values, moments merged in float64 (Chan): the merge
                    # order changes only rounding, ~1e-7 of the values' size.
                    size = max(abs(b["mean"]), b["std"], abs(b["grad_mean"] or 0),
                               b["grad_std"] or 0, 1e-30)
                    assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6 * size), key
                else:
                    assert a[key] == b[key], key
        # The weights are the same; each rank's loss is a sum over its batch and DDP
        # averages the ranks' gradients: half the one-process gradient over both batches.
        for a, b in zip(merged["params"], alone["params"], strict=True):
            assert a["name"] == "module." + b["name"]
            assert a["norm"] == pytest.approx(b["norm"], rel=1e-6)
            assert a["grad_norm"] == pytest.approx(b["grad_norm"] / 2, rel=1e-5)


def test_a_nan_on_rank_one_ends_both_ranks_naming_rank_one(folder: Path) -> None:
    result = torchrun(folder, "nan", str(folder / "nanlog"), str(folder / "nan"))
    outcomes = [(folder / f"nan-{rank}.txt").read_text() for rank in (0, 1)]
    for outcome in outcomes:
        rank, module, phase, step, message = outcome.split("|", 4)
        assert (rank, module, phase, step) == ("1", "module.3", "forward", "3"), outcome
        assert message.startswith("rank 1: step 3, forward: module.3 (Log) produced NaN")
    assert outcomes[0] == outcomes[1]
    event = json.loads((folder / "nanlog" / "nonfinite.json").read_text())
    assert event["event"]["rank"] == 1 and event["event"]["module"] == "module.3"
    assert [s["step"] for s in event["steps"]] == [0, 1, 2, 3]
    assert result.returncode == 0, result.stderr  # each rank caught the error itself
