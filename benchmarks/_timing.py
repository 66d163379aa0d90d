"""Timing shared by the benchmark scripts (run them as ``python benchmarks/bench_*.py``)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

#: ``--clock``: the wall clock, or this process's CPU time (all its threads).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def add_clock(parser: argparse.ArgumentParser) -> None:
    """The ``--clock wall|cpu`` option; ``CLOCKS[args.clock]`` is the clock."""
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall-clock time, or this process's CPU time: steadier on a loaded "
                        "machine (with --threads 1 it counts the one core's work)")


def timed(fns: dict[str, Callable[[], object]], repeat: int,
          clock: Callable[[], float] = time.perf_counter) -> dict[str, tuple[float, float]]:
    """(min, median) seconds per function.

    Runs are interleaved, so load from other processes on a shared machine hits every
    function alike; one warm-up run each comes first. ``clock``: ``time.process_time`` for
    this process's CPU time, steadier than the wall clock on a loaded machine.
    """
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: (min(t), statistics.median(t)) for name, t in times.items()}
