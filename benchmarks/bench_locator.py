"""What naming a crash costs a run that succeeds: Grad-CAM and ``stats`` at batch 1 vs a bare
forward pass, in one process, runs interleaved, the best of ``--repeats`` (min over min).

Goals (issue 18): Grad-CAM at most 1.05 times a bare ``no_grad`` forward, ``stats`` at most
1.15 times a bare ``inference_mode`` forward, on resnet50 (random weights) at batch 1.
"""

from __future__ import annotations

import argparse
import time

import torch
from _timing import timed
from torchvision.models import get_model

import hookscope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: this process's CPU time, steadier on a machine others load "
                        "(with one thread)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = get_model(args.model, weights=None).eval()
    x = torch.randn(args.batch, 3, args.size, args.size)

    def bare_no_grad() -> None:
        with torch.no_grad():
            model(x)

    def bare_inference() -> None:
        with torch.inference_mode():
            model(x)

    fns = {
        "bare no_grad": bare_no_grad,
        "gradcam": lambda: hookscope.gradcam(model, x, "layer4"),
        "bare inference": bare_inference,
        "stats": lambda: hookscope.collect_stats(model, x),
    }
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    best = timed(fns, args.repeats, clock)
    print(f"{args.model}, batch {args.batch}, {args.size} px, {args.threads} thread(s), "
          f"{args.clock} clock, best of {args.repeats} (median in brackets)")
    for name, base in (("gradcam", "bare no_grad"), ("stats", "bare inference")):
        (low, mid), (blow, bmid) = best[name], best[base]
        print(f"  {name:8s} {low * 1e3:7.1f} ms  vs {base}: {low / blow:.3f}x "
              f"({mid / bmid:.3f}x)")


if __name__ == "__main__":
    main()
