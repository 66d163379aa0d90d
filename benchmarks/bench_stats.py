"""Cost of `hookscope.collect_stats` on every leaf module against a bare forward pass.

Prints, per model and batch size, the ratio of collect_stats to a bare
``torch.inference_mode()`` forward, measured in one process with interleaved repetitions
(the minimum of each, so a noisy neighbour inflates neither side), and the same ratio for a
hand-written hook that calls ``output.mean().item()`` and ``output.std().item()``. Then peak
RSS of a bare forward and of collect_stats, each in a fresh subprocess.

    python benchmarks/bench_stats.py [--models resnet18 resnet50] [--batches 1 8] [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys

import torch
from _timing import timed  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from torchvision.models import get_model

from hookscope import collect_stats
from hookscope.hooks import select_sites


def handwritten(model: torch.nn.Module, x: torch.Tensor) -> None:
    """The hand-written debug hook people write: mean and std per leaf, synchronously."""
    rows = []

    def hook(m, a, o, name: str = "") -> None:
        rows.append((name, o.mean().item(), o.std().item()))

    handles = [s.module.register_forward_hook(lambda m, a, o, n=s.name: hook(m, a, o, n))
               for s in select_sites(model)]
    try:
        with torch.inference_mode():
            model(x)
    finally:
        for h in handles:
            h.remove()


def ratios(name: str, batch: int, reps: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = get_model(name, weights=None).eval()
    x = torch.randn(batch, 3, 224, 224)

    def bare() -> None:
        with torch.inference_mode():
            model(x)

    cases = {
        "bare": bare,
        "hookscope": lambda: collect_stats(model, x),
        "handwritten": lambda: handwritten(model, x),
    }
    results = timed(cases, reps)  # interleaved, so drift hits every case alike
    base = results["bare"][0]
    return {"bare_ms": base * 1e3} | {
        key: best / base for key, (best, _median) in results.items() if key != "bare"
    }


def peak_rss(name: str, batch: int, mode: str) -> float:
    code = f"""
import resource, torch
from torchvision.models import get_model
from hookscope import collect_stats
torch.manual_seed(0)
model = get_model({name!r}, weights=None).eval()
x = torch.randn({batch}, 3, 224, 224)
with torch.inference_mode():
    model(x)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(2):
    if {mode!r} == "bare":
        with torch.inference_mode():
            model(x)
    else:
        collect_stats(model, x)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()

    rows = []
    for name in args.models:
        for batch in args.batches:
            row = {"model": name, "batch": batch} | ratios(name, batch, args.reps)
            if not args.no_memory:
                bare = peak_rss(name, batch, "bare")
                stats = peak_rss(name, batch, "stats")
                row |= {"rss_bare_mib": bare, "rss_stats_mib": stats, "rss_ratio": stats / bare}
            rows.append(row)
            if not args.json:
                print(
                    f"{name:10s} batch {batch:2d}  bare {row['bare_ms']:8.1f} ms  "
                    f"hookscope x{row['hookscope']:.3f}  hand-written hook x{row['handwritten']:.3f}"
                    + (f"  peak RSS {row['rss_bare_mib']:.0f} -> {row['rss_stats_mib']:.0f} MiB "
                       f"(x{row['rss_ratio']:.3f})" if not args.no_memory else ""),
                    flush=True,
                )
    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    if args.json:
        print(json.dumps({"machine": machine, "torch": torch.__version__, "rows": rows}, indent=2))
    else:
        print(f"torch {torch.__version__}, {machine}; ratios are min-over-reps / min-over-reps")


if __name__ == "__main__":
    main()
