"""Grad-CAM speed: hookscope against a bare forward pass and against the peers.

In one process, on resnet50 with random weights (layer4, top-1 target), for each batch size:

* the ratio of ``hookscope.gradcam`` to a bare ``torch.no_grad()`` forward pass (goal <= 1.10);
* the speed-up over pytorch-grad-cam's ``GradCAM`` (goal >= 2.5) and torchcam's ``GradCAM``
  (goal >= 1.2), each on its own copy of the model (their hooks stay attached) and the same
  input, when those packages are installed.

Repetitions are interleaved (every contender once per round, in a rotating order) so drift
on a noisy machine hits all of them alike; the table reports medians, and minimums beside.

    python benchmarks/bench_gradcam.py [--batches 1 8] [--repeats 15] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

import hookscope


def _peers(model: torch.nn.Module) -> dict[str, Callable[[torch.Tensor], object]]:
    peers: dict[str, Callable[[torch.Tensor], object]] = {}
    try:
        from pytorch_grad_cam import GradCAM as PgcGradCAM

        pgc_model = copy.deepcopy(model)
        pgc = PgcGradCAM(pgc_model, [pgc_model.layer4])
        peers["pytorch-grad-cam"] = lambda x: pgc(input_tensor=x, targets=None)
    except ImportError:
        pass
    try:
        from torchcam.methods import GradCAM as TcGradCAM

        tc_model = copy.deepcopy(model)
        tc = TcGradCAM(tc_model, "layer4")

        def torchcam_run(x: torch.Tensor) -> object:
            out = tc_model(x)
            return tc(out.argmax(1).tolist(), out)

        peers["torchcam"] = torchcam_run
    except ImportError:
        pass
    return peers


def bench(batch: int, repeats: int, warmup: int = 2) -> dict[str, list[float]]:
    from torchvision.models import resnet50

    torch.manual_seed(0)
    model = resnet50().eval()
    x = torch.randn(batch, 3, 224, 224)

    def bare(inp: torch.Tensor) -> object:
        with torch.no_grad():
            return model(inp)

    contenders: dict[str, Callable[[torch.Tensor], object]] = {
        "bare forward": bare,
        "hookscope": lambda inp: hookscope.gradcam(model, inp, "layer4"),
        **_peers(model),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(warmup + repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            start = time.perf_counter()
            contenders[name](x)
            elapsed = time.perf_counter() - start
            if rep >= warmup:
                times[name].append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), resnet50 random "
          f"weights, 224x224, layer4, {args.repeats} interleaved repeats")
    print(f"{'batch':>5}  {'contender':<18} {'median ms':>10} {'min ms':>9} "
          f"{'x bare':>7} {'hookscope speed-up':>19}")
    for batch in args.batches:
        times = bench(batch, args.repeats)
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        for name in times:
            ratio = med[name] / med["bare forward"]
            speedup = med[name] / med["hookscope"]
            extra = f"{speedup:>18.2f}x" if name not in ("bare forward", "hookscope") else ""
            print(f"{batch:>5}  {name:<18} {med[name] * 1e3:>10.1f} {low[name] * 1e3:>9.1f} "
                  f"{ratio:>7.3f} {extra}")
        print(f"{'':>5}  hookscope / bare forward, by minimums: "
              f"{low['hookscope'] / low['bare forward']:.3f}")


if __name__ == "__main__":
    main()
