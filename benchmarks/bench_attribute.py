"""Attribution speed: ``hookscope.attribute`` against captum 0.9, on resnet18 at 224 px.

In one process, random weights, one image, the top class as target; for integrated
gradients (``--steps`` Gauss-Legendre steps, zero baseline) and occlusion (``--window``,
``--stride``, all channels, value 0), each library evaluating the same ``--cap`` derived
inputs per pass (captum's ``internal_batch_size`` and ``perturbations_per_eval``). Runs are
interleaved (:func:`_timing.timed`, CPU time); the ratio hookscope / captum is printed (goal:
<= 1.0), with the largest difference of the attributions, relative to the largest value.

hookscope always scores the input and the baseline too (one extra pass of 2 rows: the target,
the score and the completeness gap of its JSON). For integrated gradients the ratio is given
against captum computing the same (``return_convergence_delta=True``, one extra pass of its
own) and, in parentheses, against captum's attributions alone.

    python benchmarks/bench_attribute.py [--steps 50] [--window 16] [--stride 8] [--cap 32]
        [--repeats 3] [--size 224] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import timed  # noqa: E402

import hookscope  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--stride", type=int, default=8)
    parser.add_argument("--cap", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from captum.attr import IntegratedGradients, Occlusion
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(weights=None).eval()
    x = torch.randn(1, 3, args.size, args.size)
    with torch.no_grad():
        target = int(model(x).argmax())
    window, stride = (args.window, args.window), (args.stride, args.stride)
    cases = {
        "integrated-gradients": (
            lambda: hookscope.attribute(model, x, method="integrated-gradients", target=target,
                                        steps=args.steps, batch_cap=args.cap),
            lambda: IntegratedGradients(model).attribute(
                x, target=target, n_steps=args.steps, internal_batch_size=args.cap,
                return_convergence_delta=True)[0],
            lambda: IntegratedGradients(model).attribute(
                x, target=target, n_steps=args.steps, internal_batch_size=args.cap)),
        "occlusion": (
            lambda: hookscope.attribute(model, x, method="occlusion", target=target,
                                        window=window, stride=stride, batch_cap=args.cap),
            lambda: Occlusion(model).attribute(
                x, target=target, sliding_window_shapes=(3, *window), strides=(1, *stride),
                perturbations_per_eval=args.cap), None),
    }
    print(f"resnet18, {args.size} px, 1 image, {args.cap} rows per pass, "
          f"{torch.get_num_threads()} thread(s), {args.repeats} interleaved repeats")
    print(f"{'method':22} {'hookscope s':>12} {'captum s':>10} {'ratio':>7} {'max diff':>10}")
    for name, (ours, theirs, bare) in cases.items():
        start = time.perf_counter()
        a, b = ours(), theirs().detach().numpy()
        diff = float(abs(a - b).max() / abs(b).max())
        fns = {"hookscope": ours, "captum": theirs} | ({"bare": bare} if bare else {})
        times = timed(fns, args.repeats, clock=time.process_time)
        mine, peer = times["hookscope"][1], times["captum"][1]
        alone = f" (vs attributions alone {mine / times['bare'][1]:.3f})" if bare else ""
        print(f"{name:22} {mine:12.3f} {peer:10.3f} {mine / peer:7.3f} {diff:10.2e}"
              f"   {time.perf_counter() - start:.0f} s{alone}")


if __name__ == "__main__":
    main()
