"""Timing shared by the benchmark scripts (run them as ``python benchmarks/bench_*.py``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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
