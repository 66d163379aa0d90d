"""Cost of `hookscope.collect_stats` on every leaf module against a bare forward pass.

Prints, per model and batch size, the ratio of collect_stats to a bare
``torch.inference_mode()`` forward, measured in one process with interleaved repetitions
(the minimum of each, so a noisy neighbour inflates neither side), and the same ratio for a
hand-written hook that calls ``output.mean().item()`` and ``output.std().item()``.

Then memory: how much each of a bare forward and collect_stats raises peak RSS. Each is
measured in a fresh subprocess that loads the model, makes the input, and takes its baseline
before the first forward pass, since peak RSS (``ru_maxrss``) is a high-water mark that
an earlier forward pass would already have raised. On Linux the high-water mark is also
reset there (``/proc/self/clear_refs``), so a transient peak while the model was built
cannot hide growth; elsewhere the baseline is ``ru_maxrss`` itself. The goal is
growth(collect_stats) <= 1.10 x growth(bare) + 16 MiB; it is reported, never asserted.

    python benchmarks/bench_stats.py [--models resnet18 resnet50] [--batches 1 8] [--reps 7]
        [--threads 1] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import resource
import statistics
import subprocess
import sys

import torch
from _timing import CLOCKS, add_clock, timed  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from torchvision.models import get_model

from hookscope import collect_stats
from hookscope.core.select import select_sites

#: growth(collect_stats) <= GOAL_FACTOR * growth(bare) + GOAL_SLACK_MIB
GOAL_FACTOR = 1.10
GOAL_SLACK_MIB = 16.0


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


def setup(name: str, batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return get_model(name, weights=None).eval(), torch.randn(batch, 3, 224, 224)


def ratios(name: str, batch: int, reps: int, clock: str = "wall") -> dict[str, float]:
    """Each case's min-over-reps time over the bare forward's."""
    model, x = setup(name, batch)

    def bare() -> None:
        with torch.inference_mode():
            model(x)

    cases = {"bare": bare, "hookscope": lambda: collect_stats(model, x),
             "handwritten": lambda: handwritten(model, x)}
    # Interleaved, so drift hits every case alike; the CPU clock is steadier on a loaded machine.
    results = timed(cases, reps, CLOCKS[clock])
    base = results["bare"][0]
    return {"bare_ms": base * 1e3} | {
        key: best / base for key, (best, _median) in results.items() if key != "bare"
    }


# ---- peak memory, measured in a child process (this script run with --child) ----

def _rss_mib(field: str) -> float | None:
    """``VmRSS`` or ``VmHWM`` (peak) from /proc/self/status, or None off Linux."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _maxrss_mib() -> float:
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale / 1024


def _reset_peak() -> bool:
    """Reset the process's RSS high-water mark (Linux 4.0+); False where that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _rss_mib("VmHWM") is not None


def child(name: str, batch: int, mode: str, calls: int) -> None:
    """Print the growth of peak RSS over a baseline taken before the first forward pass."""
    model, x = setup(name, batch)
    gc.collect()  # so that leftovers of model building are not freed inside the measurement
    if _reset_peak():
        base, peak = _rss_mib("VmRSS") or 0.0, lambda: _rss_mib("VmHWM") or 0.0
    else:
        base, peak = _maxrss_mib(), _maxrss_mib
    growth = []
    for _ in range(calls):
        if mode == "bare":
            with torch.inference_mode():
                model(x)
        else:
            collect_stats(model, x)
        growth.append(peak() - base)
    print(json.dumps({"base_mib": base, "growth_mib": growth}))


def peak_growth(name: str, batch: int, mode: str, calls: int, threads: int) -> dict[str, float]:
    """Peak-RSS growth of ``calls`` runs of ``mode`` in a fresh subprocess."""
    cmd = [sys.executable, __file__, "--child", name, str(batch), mode, str(calls),
           "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"base": result["base_mib"], "growth": max(result["growth_mib"])}


def memory(name: str, batch: int, args: argparse.Namespace) -> dict[str, float | bool]:
    """Median over ``--mem-runs`` subprocesses of each mode's peak-RSS growth, and the goal."""
    runs = {mode: [peak_growth(name, batch, mode, args.mem_calls, args.threads)
                   for _ in range(args.mem_runs)]
            for mode in ("bare", "stats")}
    bare = statistics.median(r["growth"] for r in runs["bare"])
    stats = statistics.median(r["growth"] for r in runs["stats"])
    goal = GOAL_FACTOR * bare + GOAL_SLACK_MIB
    return {"rss_base_mib": runs["bare"][0]["base"], "rss_growth_bare_mib": bare,
            "rss_growth_stats_mib": stats, "rss_goal_mib": goal, "rss_goal_met": stats <= goal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch threads, here and in the memory subprocesses")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--mem-runs", type=int, default=3,
                        help="subprocesses per memory figure (the median is reported)")
    parser.add_argument("--mem-calls", type=int, default=2,
                        help="forward passes per subprocess (the highest peak counts)")
    add_clock(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        name, batch, mode, calls = args.child
        child(name, int(batch), mode, int(calls))
        return

    rows = []
    for name in args.models:
        for batch in args.batches:
            row = {"model": name, "batch": batch} | ratios(name, batch, args.reps, args.clock)
            if not args.no_memory:
                row |= memory(name, batch, args)
            rows.append(row)
            if not args.json:
                print(
                    f"{name:10s} batch {batch:2d}  bare {row['bare_ms']:8.1f} ms  "
                    f"hookscope x{row['hookscope']:.3f}  hand-written hook x{row['handwritten']:.3f}"
                    + ("" if args.no_memory else
                       f"  peak RSS growth: bare {row['rss_growth_bare_mib']:.0f} MiB, hookscope "
                       f"{row['rss_growth_stats_mib']:.0f} MiB (goal <= {row['rss_goal_mib']:.0f}"
                       f": {'met' if row['rss_goal_met'] else 'MISSED'})"),
                    flush=True,
                )
    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    if args.json:
        print(json.dumps({"machine": machine, "torch": torch.__version__, "rows": rows}, indent=2))
    else:
        print(f"torch {torch.__version__}, {machine}; ratios are min-over-reps / min-over-reps"
              + ("" if args.no_memory else
                 f"; peak RSS growth is over a baseline taken after loading, before the first "
                 f"forward (median of {args.mem_runs} subprocesses, {args.mem_calls} passes "
                 f"each); goal: hookscope <= {GOAL_FACTOR:.2f} x bare + {GOAL_SLACK_MIB:.0f} MiB"))


if __name__ == "__main__":
    main()
