"""Benchmark: `hookscope grads` against one forward and one backward pass.

Prints, in one process, the ratio of ``collect_grads`` (all leaf modules hooked, per-call
gradient statistics, per-parameter norms) to a bare forward + ``torch.autograd.grad`` with
respect to every parameter, and to a bare ``torch.no_grad()`` forward.

    .venv/bin/python benchmarks/bench_grads.py [--model resnet18] [--size 224] [--batch 1]

CPU timings on a shared machine are noisy: each figure is the median of --repeat runs.
"""

from __future__ import annotations

import argparse
import os

import torch
from _timing import timed  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from hookscope.probes.grads import collect_grads
from hookscope.sources import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("HOOKSCOPE_OFFLINE", "1")
    torch.manual_seed(0)
    model = load_model(args.model, weights="none", device="cpu").model
    x = torch.randn(args.batch, 3, args.size, args.size)
    params = [p for p in model.parameters() if p.requires_grad]

    def bare_forward() -> None:
        with torch.no_grad():
            model(x)

    def forward_backward() -> None:
        out = model(x)
        target = out.argmax(1)
        torch.autograd.grad(out[torch.arange(len(target)), target].sum(), params)

    def hookscope_grads() -> None:
        collect_grads(model, x)

    t = timed({"forward": bare_forward, "fb": forward_backward, "grads": hookscope_grads},
              args.repeat)
    print(f"{args.model} batch {args.batch} at {args.size}px, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; min / median of {args.repeat} interleaved runs")
    for key, name in (("forward", "bare forward (no_grad)"), ("fb", "forward + backward (params)"),
                      ("grads", "hookscope grads (all leaves)")):
        print(f"{name:32s} {t[key][0] * 1e3:8.1f} / {t[key][1] * 1e3:8.1f} ms")
    for key, name in (("fb", "forward+backward"), ("forward", "bare forward")):
        print(f"ratio grads / {name:18s} {t['grads'][0] / t[key][0]:6.3f} / "
              f"{t['grads'][1] / t[key][1]:6.3f}")

if __name__ == "__main__":
    main()
