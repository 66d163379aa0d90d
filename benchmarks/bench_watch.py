"""Benchmark: a training step under ``hookscope.watch`` against the same step unwatched.

One process, resnet18 (``weights=None``), batch 16 at 112 px by default, SGD: forward,
cross-entropy, backward, ``optimizer.step()``, ``zero_grad()``. Each variant trains its own
copy of the model under its own open watch, and the variants' steps are interleaved round by
round, so load from other processes hits every variant alike; ratios are of the minimum
step times (min over min), in wall-clock time and in this process's CPU time. On a loaded
machine the CPU time is the steadier figure (it does not count time spent waiting for a
core); ``--threads 1`` (the default) keeps it free of thread-pool spinning.

    .venv/bin/python benchmarks/bench_watch.py [--size 112] [--batch 16] [--rounds 8]

Variants: unwatched; ``every=100`` with the every-step check (off-steps); ``every=100``
with ``nonfinite="off"`` (off-steps: no hook at all); ``every=1`` (every step a logging
step, with the check). An ``every=100`` run's cost per step is its off-step plus a
hundredth of a logging step's extra, also printed (goals: 1.10x, 1.02x, 1.6x).
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import hookscope
from hookscope.sources import load_model

GOALS = {"check": 1.10, "off": 1.02, "every1": 1.6}


def make_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
              watch: hookscope.Watch | None) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if watch is not None:
            watch.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    os.environ.setdefault("HOOKSCOPE_OFFLINE", "1")
    torch.manual_seed(0)
    base = load_model(args.model, weights="none", device="cpu").model.train()
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.randint(0, 1000, (args.batch,))
    options = {"check": {"every": 100}, "off": {"every": 100, "nonfinite": "off"},
               "every1": {"every": 1}}
    folder = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    watches = {name: hookscope.watch(copy.deepcopy(base), folder / name, **kw)
               for name, kw in options.items()}
    # A second unwatched copy shows the noise floor: its ratio should read 1.00x.
    steps = {"bare": make_step(base, x, y, None),
             "bare2": make_step(copy.deepcopy(base), x, y, None)}
    for name, w in watches.items():
        w.__enter__()
        steps[name] = make_step(w.model, x, y, w)
    try:
        times = run(steps, args.rounds)
    finally:
        for w in watches.values():
            w.__exit__(None, None, None)
    report(args, times)


def run(steps: dict[str, Callable[[], None]],
        rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per clock and variant, the time of each step; one warm-up step each (a logging step
    for every watch: its step 0), then ``rounds`` interleaved rounds."""
    for step in steps.values():
        step()
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    times: dict[str, dict[str, list[float]]] = {c: {n: [] for n in steps} for c in clocks}
    for _ in range(rounds):
        for name, step in steps.items():
            start = {c: clock() for c, clock in clocks.items()}
            step()
            for c, clock in clocks.items():
                times[c][name].append(clock() - start[c])
    return times


def report(args: argparse.Namespace, times: dict[str, dict[str, list[float]]]) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.model} training step, batch {args.batch} at {args.size}px, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, load {load:.1f}; "
          f"min of {args.rounds} interleaved rounds")
    for clock, table in times.items():
        print(f"-- {clock} time")
        _table({name: min(t) for name, t in table.items()})


def _table(best: dict[str, float]) -> None:
    bare = best["bare"]
    logging_extra = best["every1"] - bare
    for name, label in (("bare", "unwatched"), ("bare2", "unwatched copy (noise floor)"),
                        ("check", "every=100, check (off-step)"),
                        ("off", "every=100, nonfinite=off (off-step)"),
                        ("every1", "every=1 (logging step)")):
        ratio = best[name] / bare
        line = f"{label:38s} {best[name] * 1e3:8.1f} ms  {ratio:5.3f}x"
        if name in ("check", "off"):
            amortised = (best[name] + logging_extra / 100) / bare
            line += f"  with 1/100 logging step {amortised:5.3f}x"
        if name in GOALS:
            line += f"  (goal {GOALS[name]:.2f}x)"
        print(line)


if __name__ == "__main__":
    main()
