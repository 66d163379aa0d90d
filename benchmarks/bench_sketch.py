"""Cost of the percentile sketch against the range sketch it replaced (512 equal buckets
over [min, max], commit 28d4474), on activation-shaped tensors, whole output and per channel.

Both run in one process, interleaved (the minimum of each): the old module is read from git
history (``git show REV:hookscope/sketch.py``), so the repository must hold that commit. The
time of each includes its range pass (``finite_range``), which each sketch needs.

    python benchmarks/bench_sketch.py [--rev 28d4474] [--reps 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch
from _timing import timed  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from hookscope.channels import ChannelView
from hookscope.sketch import Sketch, finite_range

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
    text = subprocess.run(["git", "show", f"{rev}:hookscope/sketch.py"], cwd=root, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_sketch.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_sketch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sketch"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="28d4474")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    old = old_module(args.rev)
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

            timing = timed({"old": old_sketch, "new": new_sketch}, args.reps)
            store = new_sketch().counts
            results[f"{name} {'per channel' if dim else 'whole'}"] = {
                "old_ms": round(timing["old"][0] * 1e3, 2),
                "new_ms": round(timing["new"][0] * 1e3, 2),
                "new_vs_old": round(timing["new"][0] / timing["old"][0], 2),
                "store_kib": round(store.numel() * 8 / 1024, 1),
                "old_store_kib": round(view.channels * 512 * 8 / 1024, 1)}
    print(json.dumps({"threads": torch.get_num_threads(), "cases": results}, indent=1))


if __name__ == "__main__":
    main()
