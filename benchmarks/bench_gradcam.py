"""Grad-CAM speed: hookscope against a bare forward pass and against the peers.

In one process, on resnet50 with random weights (layer4, top-1 target), for each batch size:

* the ratio of ``hookscope.gradcam`` to a bare ``torch.no_grad()`` forward pass (goal <= 1.10);
* the speed-up over pytorch-grad-cam's ``GradCAM`` (goal >= 2.5) and torchcam's ``GradCAM``
  (goal >= 1.2), each on its own copy of the model (their hooks stay attached) and the same
  input, when those packages are installed.

Repetitions are interleaved (every contender once per round) so drift on a noisy machine
hits all of them alike; the table reports medians, and minimums beside. ``--clock cpu``
times this process's CPU time instead of the wall clock (steadier on a loaded machine).

``--extra`` then times the methods that need many forward passes against pytorch-grad-cam
(goal: at least 2x faster each), on resnet50 at batch 8 by default, on its own model copy:

* ScoreCAM (one pass per channel and input; both run 32 masked inputs per pass);
* AblationCAM (one pass per channel and input, 32 per pass; hookscope starts each pass at
  the layer's input once and ablates a batch from the layer on);
* the ROAD metric (``ROADCombined``, 9 percentiles; hookscope builds each imputation's sparse
  system with numpy, scores the clean inputs once and all perturbed inputs 32 at a time).

A ScoreCAM of resnet50's layer4 is 2048 forward passes per input: on a CPU, use ``--size``
and ``--extra-batch`` to scale it down.

    python benchmarks/bench_gradcam.py [--batches 1 8] [--repeats 15] [--threads N] [--clock cpu]
    python benchmarks/bench_gradcam.py --extra [--extra-batch 8] [--size 224] [--layer layer4]
        [--extra-repeats 3] [--only scorecam ablationcam road]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

os.environ.setdefault("TQDM_DISABLE", "1")  # pytorch-grad-cam's progress bars, before tqdm loads

import torch  # noqa: E402
from _timing import CLOCKS, add_clock, timed  # noqa: E402  (benchmarks/ is on sys.path)

import hookscope  # noqa: E402


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


def bench(batch: int, repeats: int, clock: Callable[[], float]) -> dict[str, tuple[float, float]]:
    """(min, median) seconds of each contender, interleaved (:func:`_timing.timed`)."""
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
    return timed({name: partial(fn, x) for name, fn in contenders.items()}, repeats, clock)


def _extra_contenders(model: torch.nn.Module, x: torch.Tensor, layer: str,
                      only: list[str]) -> dict[str, dict[str, Callable[[], object]]]:
    """Per method, hookscope's run and pytorch-grad-cam's, each on its own model copy."""
    import numpy as np
    from pytorch_grad_cam import AblationCAM, ScoreCAM
    from pytorch_grad_cam.metrics.road import ROADCombined
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    def module(m: torch.nn.Module) -> torch.nn.Module:
        return dict(m.named_modules())[layer]

    peer = copy.deepcopy(model)
    found: dict[str, dict[str, Callable[[], object]]] = {}
    if "scorecam" in only:
        score = ScoreCAM(peer, [module(peer)])
        score.batch_size = 32
        found["scorecam"] = {
            "hookscope": lambda: hookscope.gradcam(model, x, layer, method="scorecam"),
            "pytorch-grad-cam": lambda: score(x, None)}
    if "ablationcam" in only:
        ablation = AblationCAM(peer, [module(peer)], batch_size=32)
        found["ablationcam"] = {
            "hookscope": lambda: hookscope.gradcam(model, x, layer, method="ablationcam"),
            "pytorch-grad-cam": lambda: ablation(x, None)}
    if "road" in only:
        cams = hookscope.gradcam(model, x, layer).maps
        with torch.no_grad():
            classes = model(x).argmax(1).tolist()
        targets = [ClassifierOutputSoftmaxTarget(c) for c in classes]
        road = ROADCombined()
        found["road"] = {
            "hookscope": lambda: hookscope.cam_metrics(model, x, cams, classes, metrics="road"),
            "pytorch-grad-cam": lambda: road(x, np.asarray(cams), targets, peer)}
    return found


def bench_extra(batch: int, size: int, layer: str, repeats: int, only: list[str],
                clock: Callable[[], float] = time.perf_counter) -> None:
    """Time each many-pass method against pytorch-grad-cam, interleaved."""
    from torchvision.models import resnet50

    torch.manual_seed(0)
    model = resnet50().eval()
    x = torch.randn(batch, 3, size, size)
    print(f"\nmany-pass methods: resnet50 random weights, batch {batch}, {size}x{size}, "
          f"{layer}, {repeats} interleaved repeat(s)")
    print(f"{'method':<12} {'contender':<18} {'median s':>9} {'min s':>8} {'speed-up':>9}")
    for name, fns in _extra_contenders(model, x, layer, only).items():
        times: dict[str, list[float]] = {k: [] for k in fns}
        for rep in range(repeats):
            for key in (list(fns) if rep % 2 == 0 else list(fns)[::-1]):
                start = clock()
                fns[key]()
                times[key].append(clock() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        for key, values in times.items():
            ratio = med["pytorch-grad-cam"] / med["hookscope"] if key == "hookscope" else None
            extra = f"{ratio:>8.2f}x" if ratio else ""
            print(f"{name:<12} {key:<18} {med[key]:>9.2f} {min(values):>8.2f} {extra}",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--extra", action="store_true",
                        help="time ScoreCAM, AblationCAM and ROAD against pytorch-grad-cam "
                        "instead of Grad-CAM")
    parser.add_argument("--extra-batch", type=int, default=8)
    parser.add_argument("--extra-repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=224, help="input side (--extra)")
    parser.add_argument("--layer", default="layer4", help="target layer (--extra)")
    parser.add_argument("--only", nargs="+", default=["scorecam", "ablationcam", "road"],
                        choices=["scorecam", "ablationcam", "road"])
    add_clock(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.extra:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
        bench_extra(args.extra_batch, args.size, args.layer, args.extra_repeats, args.only,
                    CLOCKS[args.clock])
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), resnet50 random "
          f"weights, 224x224, layer4, {args.repeats} interleaved repeats, {args.clock} clock")
    print(f"{'batch':>5}  {'contender':<18} {'median ms':>10} {'min ms':>9} "
          f"{'x bare':>7} {'hookscope speed-up':>19}")
    for batch in args.batches:
        times = bench(batch, args.repeats, CLOCKS[args.clock])
        med = {k: v[1] for k, v in times.items()}
        for name, (low, median) in times.items():
            ratio = median / med["bare forward"]
            speedup = median / med["hookscope"]
            extra = f"{speedup:>18.2f}x" if name not in ("bare forward", "hookscope") else ""
            print(f"{batch:>5}  {name:<18} {median * 1e3:>10.1f} {low * 1e3:>9.1f} "
                  f"{ratio:>7.3f} {extra}")
        print(f"{'':>5}  hookscope / bare forward, by minimums: "
              f"{times['hookscope'][0] / times['bare forward'][0]:.3f}")


if __name__ == "__main__":
    main()
