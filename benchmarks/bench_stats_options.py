"""Cost of the opt-in statistics: ``collect_stats`` plain, with ``per_channel``, with
``percentiles``, and with both, against a bare forward pass.

All cases run in one process, interleaved (the minimum of each), on every leaf module of the
model, so a noisy neighbour inflates none of them.

    python benchmarks/bench_stats_options.py [--model resnet18] [--batch 8] [--size 224] [--reps 5]
"""

from __future__ import annotations

import argparse
import json

import torch
from _timing import timed  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from torchvision.models import get_model

from hookscope import collect_stats

PERCENTILES = [0.1, 99.9, 99.99]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = get_model(args.model, weights=None).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)

    def bare() -> None:
        with torch.inference_mode():
            model(x)

    cases = {
        "bare": bare,
        "stats": lambda: collect_stats(model, x),
        "per_channel": lambda: collect_stats(model, x, per_channel=True),
        "percentiles": lambda: collect_stats(model, x, percentiles=PERCENTILES),
        "both": lambda: collect_stats(model, x, per_channel=True, percentiles=PERCENTILES),
    }
    results = timed(cases, args.reps)
    base, plain = results["bare"][0], results["stats"][0]
    print(json.dumps({
        "model": args.model, "batch": args.batch, "size": args.size,
        "threads": torch.get_num_threads(),
        "ms": {k: round(best * 1e3, 1) for k, (best, _) in results.items()},
        "vs_bare": {k: round(best / base, 2) for k, (best, _) in results.items()},
        "vs_stats": {k: round(best / plain, 2) for k, (best, _) in results.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
