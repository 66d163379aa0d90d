"""Cost of the percentile sketch against the range sketch it replaced (512 equal buckets
over [min, max], commit 28d4474), on activation-shaped tensors, whole output and per channel.

Both run in one process, interleaved, on one torch thread, timed in the thread's CPU time
(the minimum of each), so that a loaded machine inflates neither: the old module is read
from git history (``git show REV:hookscope/probes/sketch.py``), so the repository must hold that
commit. The time of each includes its range pass (``finite_range``), which each needs.

    python benchmarks/bench_sketch.py [--rev 28d4474] [--reps 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from hookscope.numerics.moments import ChannelView
from hookscope.numerics.sketch import Sketch, finite_range

#: (name, shape, transform): resnet-like outputs at batch 8.
CASES = [
    ("conv 8x64x112x112", (8, 64, 112, 112), lambda x: x),
    ("relu 8x64x56x56", (8, 64, 56, 56), torch.relu),
    ("conv 8x512x7x7", (8, 512, 7, 7), lambda x: x),
    ("relu 8x2048x7x7", (8, 2048, 7, 7), torch.relu),
    ("linear 8x1000", (8, 1000), lambda x: x),
]


def old_module(rev: str) -> ModuleType:
    """The replaced sketch module, loaded from git history."""
    root = Path(__file__).resolve().parents[1]
    text = subprocess.run(["git", "show", f"{rev}:hookscope/probes/sketch.py"], cwd=root, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_sketch.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_sketch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sketch"] = module
    spec.loader.exec_module(module)
    return module


def cpu_timed(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """The least thread CPU seconds of each function, interleaved after one warm-up run."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.thread_time()
            fn()
            best[name] = min(best[name], time.thread_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="28d4474")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    old = old_module(args.rev)
    torch.set_num_threads(1)  # every operation runs in this thread, so its CPU time is all
    torch.manual_seed(0)
    results = {}
    for name, shape, transform in CASES:
        x = transform(torch.randn(shape))
        for dim in (None, 1):
            view = ChannelView.of(x, dim)

            def new_sketch(view: ChannelView = view) -> Sketch:
                lo, hi, nonfinite = finite_range(view)
                return Sketch.of(view, lo, hi, nonfinite=nonfinite)

            def old_sketch(view: ChannelView = view) -> object:
                lo, hi, zeros, nonfinite = old.finite_range(view)
                return old.Sketch.of(view, lo, hi, zeros, nonfinite=nonfinite)

            timing = cpu_timed({"old": old_sketch, "new": new_sketch}, args.reps)
            store = new_sketch().counts
            results[f"{name} {'per channel' if dim else 'whole'}"] = {
                "old_ms": round(timing["old"] * 1e3, 2),
                "new_ms": round(timing["new"] * 1e3, 2),
                "new_vs_old": round(timing["new"] / timing["old"], 2),
                "store_kib": round(store.numel() * 8 / 1024, 1),
                "old_store_kib": round(view.channels * 512 * 8 / 1024, 1)}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
