"""Benchmark: `ablate --sweep` against the forward passes it needs.

A sweep over C channels in batches of B should cost about C / B batched forward passes
(plus the one "before" pass), not C single ones. Prints, in one process:

* sweep / (C/B batched forwards): the overhead of the hooks and bookkeeping (goal: ~1);
* (C single forwards) / sweep: what batching saves over one pass per channel.

    .venv/bin/python benchmarks/bench_ablate.py [--model resnet18] [--size 112]

CPU timings on a shared machine are noisy: each figure is the median of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch
from _timing import timed  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from hookscope.probes.ablate import sweep
from hookscope.sources import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--layer", default="layer4.1.conv2")
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--single-sample", type=int, default=64,
                        help="single forwards timed; the total for C channels is extrapolated")
    args = parser.parse_args()

    os.environ.setdefault("HOOKSCOPE_OFFLINE", "1")
    torch.manual_seed(0)
    model = load_model(args.model, weights="none", device="cpu").model
    x = torch.randn(1, 3, args.size, args.size)
    from hookscope.probes.structure import model_structure

    layer = {r.name: r for r in model_structure(model, x).layers}[args.layer]
    channels = layer.calls[0].output_shapes[0][1]
    passes = -(-channels // args.batch)
    big = x.expand(args.batch, -1, -1, -1).contiguous()

    def run_sweep() -> None:
        sweep(model, x, args.layer, batch=args.batch)

    def run_batched() -> None:
        with torch.inference_mode():
            for _ in range(passes):
                model(big)

    def run_single() -> None:
        with torch.inference_mode():
            for _ in range(args.single_sample):
                model(x)

    t = timed({"sweep": run_sweep, "batched": run_batched}, args.repeat)
    single = timed({"single": run_single}, 1)["single"][0] * channels / args.single_sample

    print(f"{args.model} {args.layer}: {channels} channels, batches of {args.batch}, "
          f"input 1x3x{args.size}x{args.size}, {platform.machine()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"min / median of {args.repeat} interleaved runs")
    print(f"sweep                                {t['sweep'][0]:8.3f} / {t['sweep'][1]:8.3f} s")
    print(f"{passes} batched forwards (batch {args.batch})       "
          f"{t['batched'][0]:8.3f} / {t['batched'][1]:8.3f} s")
    print(f"{channels} single forwards (extrapolated from {args.single_sample}) {single:8.3f} s")
    print(f"ratio sweep / {passes} batched forwards        "
          f"{t['sweep'][0] / t['batched'][0]:8.3f} / {t['sweep'][1] / t['batched'][1]:8.3f}"
          "   (goal ~1)")
    print(f"ratio {channels} single forwards / sweep       {single / t['sweep'][0]:8.2f}x"
          "   (speed-up)")

if __name__ == "__main__":
    main()
