"""Benchmark: a training step under ``hookscope.watch`` against the same step unwatched.

One process, two models: resnet18 (``weights=None``), batch 16 at 112 px, and a small CNN
(two conv-ReLU-pool stages and a linear head), batch 32 at 32 px; SGD: forward,
cross-entropy, backward, ``optimizer.step()``, ``zero_grad()``. Each variant trains its own
copy of the model (under its own open watch), and the variants' steps are interleaved round
by round, so load from other processes hits every variant alike. The figure is this
process's CPU time (``time.process_time``: it does not count time spent waiting for a core;
``--threads 1``, the default, keeps it free of thread-pool spinning); the ratios printed
are of the minimum step times, of the median ones, and the median over rounds of each
round's ratio (paired: a round's variants ran within a second of each other, so load that
comes and goes cancels; a minimum is one lucky round).

    .venv/bin/python benchmarks/bench_watch.py [--rounds 8] [--models resnet18,cnn]

Variants: unwatched; a second unwatched copy (the noise floor); ``every=100`` with the
every-step check (off-steps); ``every=100`` with ``nonfinite="off"`` (off-steps: no hook at
all); ``every=1`` (every step a logging step, with the check); and the unwatched step under
``torch.autograd.set_detect_anomaly(True)`` (anomaly mode), the tool the check replaces. An
``every=100`` run's cost per step is its off-step plus a hundredth of a logging step's
extra, also printed. Goals (issue 28): the check at most 1.05x on resnet18 and 1.15x on the
small CNN, ``nonfinite="off"`` 1.02x, ``every=1`` well under anomaly mode.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import hookscope
from hookscope.sources import load_model

#: Per model: (batch, size, classes, steps timed together) and the goals of the variants.
MODELS = {"resnet18": ((16, 112, 1000, 1), {"check": 1.05, "off": 1.02}),
          "cnn": ((32, 32, 10, 10), {"check": 1.15, "off": 1.02})}
LABELS = {"bare": "unwatched", "bare2": "unwatched copy (noise floor)",
          "check": "every=100, check (off-step)", "off": "every=100, nonfinite=off (off-step)",
          "every1": "every=1 (logging step)", "anomaly": "anomaly mode, unwatched"}


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def make_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
              watch: hookscope.Watch | None, anomaly: bool = False) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step() -> None:
        with torch.autograd.set_detect_anomaly(True) if anomaly else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        if watch is not None:
            watch.step()

    return step


def bench(name: str, rounds: int) -> dict[str, list[float]]:
    """Each variant's CPU time per step, over ``rounds`` interleaved rounds."""
    (batch, size, classes, together), _ = MODELS[name]
    torch.manual_seed(0)
    base = small_cnn() if name == "cnn" else load_model(name, weights="none", device="cpu").model
    base.train()
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, classes, (batch,))
    options = {"check": {"every": 100}, "off": {"every": 100, "nonfinite": "off"},
               "every1": {"every": 1}}
    folder = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    watches = {v: hookscope.watch(copy.deepcopy(base), folder / v, **kw) for v, kw in options.items()}
    steps = {"bare": make_step(base, x, y, None),
             "bare2": make_step(copy.deepcopy(base), x, y, None),
             "anomaly": make_step(copy.deepcopy(base), x, y, None, anomaly=True)}
    for v, w in watches.items():
        w.__enter__()
        steps[v] = make_step(w.model, x, y, w)
    try:
        for step in steps.values():  # a warm-up step each (every watch's step 0 is logged)
            step()
        times: dict[str, list[float]] = {v: [] for v in steps}
        for _ in range(rounds):
            for v, step in steps.items():
                start = time.process_time()
                for _ in range(together):
                    step()
                times[v].append((time.process_time() - start) / together)
    finally:
        for w in watches.values():
            w.__exit__(None, None, None)
    return times


def report(name: str, times: dict[str, list[float]]) -> None:
    (batch, size, _, together), goals = MODELS[name]
    print(f"-- {name}, batch {batch} at {size}px: CPU time per step ({together} timed together), "
          "ratios to the unwatched step's: of the minimums, of the medians, paired median")
    low = {v: min(t) for v, t in times.items()}
    mid = {v: statistics.median(t) for v, t in times.items()}
    paired = {v: statistics.median(a / b for a, b in zip(t, times["bare"], strict=True))
              for v, t in times.items()}
    extra = low["every1"] - low["bare"]  # a logging step's extra cost
    for v, label in LABELS.items():
        line = (f"{label:38s} {low[v] * 1e3:8.1f} ms  min {low[v] / low['bare']:5.3f}x  "
                f"median {mid[v] / mid['bare']:5.3f}x  paired {paired[v]:5.3f}x")
        if v in ("check", "off"):
            line += f"  with 1/100 logging step {(low[v] + extra / 100) / low['bare']:5.3f}x"
        if v in goals:
            line += f"  (goal {goals[v]:.2f}x)"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,cnn")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HOOKSCOPE_OFFLINE", "1")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"load average {load:.1f} at the start; {args.rounds} interleaved rounds")
    for name in args.models.split(","):
        report(name, bench(name, args.rounds))
    end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {end:.1f} at the end")


if __name__ == "__main__":
    main()
