"""Cost of `hookscope diff` against the two bare forward passes it needs.

Prints, per model and batch size, the ratio of a diff of the model against itself (the
second side loaded again with ``--against-dtype float32``, so both sides run the same
float32 model) to two bare ``torch.inference_mode()`` forward passes, one per side, measured
in one process with interleaved repetitions (the minimum of each, so a noisy neighbour
inflates neither side). The goal is a ratio of at most 1.5; it is reported, never asserted.
``--breakdown`` also times a diff that keeps A's outputs but compares nothing, to split the
overhead into keeping (hooks and copies) and comparing. ``--clock cpu`` times with the
process's CPU time instead of the wall clock: on a shared, busy machine that is the steadier
figure, best with ``--threads 1`` (idle worker threads spin, and their spinning counts).

    python benchmarks/bench_diff.py [--models resnet18 resnet50] [--batches 1 8] [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch

from hookscope.core.run import drive
from hookscope.probes.diff import DiffProbe
from hookscope.sources import LoadOptions, load

GOAL = 1.5


def timed(fns: dict[str, Callable[[], object]], repeat: int,
          clock: Callable[[], float]) -> dict[str, list[float]]:
    """Seconds per run of each function by ``clock``: ``_timing.timed``'s interleaved runs,
    one warm-up each, with a choice of clock, and every run kept."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return times


class KeepOnly(DiffProbe):
    """A diff that keeps A's outputs and runs B, but compares nothing (the breakdown)."""

    def compare(self, call, output) -> None:  # type: ignore[no-untyped-def]
        self.kept.pop(call.key, None)


def ratios(name: str, batch: int, args: argparse.Namespace) -> dict[str, float]:
    a = load(name, LoadOptions(weights="none", device="cpu"))
    b = load(name, LoadOptions(weights="none", device="cpu", dtype="float32"))
    torch.manual_seed(0)
    x = torch.randn(batch, 3, 224, 224)

    def bare() -> None:
        with torch.inference_mode():
            a.model(x)
            b.model(x)

    cases = {
        "bare": bare,
        "diff": lambda: drive(a.model, x, DiffProbe(a.model, b.model)),
    }
    if args.breakdown:
        cases["keep"] = lambda: drive(a.model, x, KeepOnly(a.model, b.model))
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    times = timed(cases, args.reps, clock)  # interleaved, so drift hits every case alike
    base = min(times["bare"])
    row = {"bare_ms": base * 1e3}
    for key, runs in times.items():
        if key != "bare":
            # min/min, and the median of each repetition's own ratio (its runs are adjacent,
            # so a burst of load from elsewhere hits both).
            row[key] = min(runs) / base
            row[f"{key}_paired"] = statistics.median(
                run / bare for run, bare in zip(runs, times["bare"], strict=True))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall-clock time, or the process's CPU time")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time keeping A's outputs without comparing")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models:
        for batch in args.batches:
            row = {"model": name, "batch": batch} | ratios(name, batch, args)
            rows.append(row)
            if not args.json:
                keep = (f"  keep-only x{row['keep']:.3f} (paired x{row['keep_paired']:.3f})"
                        if "keep" in row else "")
                met = "met" if row["diff"] <= GOAL else "MISSED"
                print(f"{name:10s} batch {batch:2d}  two bare passes {row['bare_ms']:8.1f} ms  "
                      f"diff x{row['diff']:.3f} (paired x{row['diff_paired']:.3f}; {met}: goal "
                      f"<= {GOAL}){keep}", flush=True)
    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    if args.json:
        print(json.dumps({"machine": machine, "torch": torch.__version__, "rows": rows}, indent=2))
    else:
        print(f"torch {torch.__version__}, {machine}; {args.clock} clock; ratios to two bare "
              "inference_mode forward passes: min-over-reps / min-over-reps, and the median "
              "of the ratios within each repetition (paired)")


if __name__ == "__main__":
    main()
