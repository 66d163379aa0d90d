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

``--oom MB``: integrated gradients under a memory cap instead. Each library runs in a
subprocess (one thread) that builds the model, runs it once, then caps its data size
(``RLIMIT_DATA``: heap and anonymous mappings, where tensors live) at what it holds then plus
MB; captum with its default ``internal_batch_size=None`` (all ``--steps`` inputs in one pass),
hookscope with ``--cap`` rows per pass. Then both run again without the cap, and the
attributions are compared: captum's uncapped against hookscope's capped and uncapped.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import timed  # noqa: E402

import hookscope  # noqa: E402


def _status_kb(key: str) -> int:
    """A size from /proc/self/status in kB (VmData: heap and private anonymous mappings)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(key)))


def _child(library: str, size: int, steps: int, cap: int, limit_mb: int | None,
           save: str) -> None:
    """One library's integrated gradients of resnet18 (random weights, seed 0) on one image,
    with the data size capped at its set-up's plus ``limit_mb``; prints one JSON line."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from captum.attr import IntegratedGradients
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(weights=None).eval()
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        target = int(model(x).argmax())
    base, rss = _status_kb("VmData"), _status_kb("VmRSS")
    if limit_mb is not None:
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        resource.setrlimit(resource.RLIMIT_DATA, ((base + limit_mb * 1024) * 1024, hard))
    try:
        if library == "captum":
            found = IntegratedGradients(model).attribute(x, target=target, n_steps=steps)
            found = found.detach().numpy()
        else:
            found = hookscope.attribute(model, x, method="integrated-gradients", target=target,
                                        steps=steps, batch_cap=cap)
        np.save(save, found)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
        print(json.dumps({"ok": True, "base_mb": base / 1024, "grown_mb": grown / 1024}))
    except (MemoryError, RuntimeError) as exc:  # torch's allocator: RuntimeError
        print(json.dumps({"ok": False, "base_mb": base / 1024, "error":
                          f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}))


def oom_runs(size: int, steps: int, cap: int, limit_mb: int) -> dict[str, dict[str, Any]]:
    """Both libraries under ``limit_mb`` and uncapped (``captum``, ``hookscope``,
    ``captum-free``, ``hookscope-free``): each outcome (``ok``, ``error``, ``base_mb``), with
    ``diff`` (the largest difference from captum's uncapped attributions, relative to their
    largest value) where it finished."""
    found: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("captum", "hookscope", "captum-free", "hookscope-free"):
            library, free = name.split("-")[0], name.endswith("-free")
            save = os.path.join(tmp, f"{name}.npy")
            cmd = [sys.executable, __file__, "--child", library, "--size", str(size), "--steps",
                   str(steps), "--cap", str(cap), "--save", save]
            cmd += [] if free else ["--oom", str(limit_mb)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = done.stdout.strip().splitlines()
            found[name] = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {
                "ok": False, "error": f"exit {done.returncode}: {done.stderr.strip()[-200:]}"}
            if found[name]["ok"]:
                found[name]["attr"] = np.load(save)
    ref = found["captum-free"].get("attr")
    for outcome in found.values():
        attr = outcome.pop("attr", None)
        if attr is not None and ref is not None:
            outcome["diff"] = float(np.abs(attr - ref).max() / np.abs(ref).max())
    return found


def _oom(args: argparse.Namespace) -> None:
    print(f"resnet18, {args.size} px, 1 image, integrated gradients with {args.steps} steps; "
          f"cap: the data size after set-up + {args.oom} MB (RLIMIT_DATA); hookscope "
          f"--batch-cap {args.cap}, captum internal_batch_size=None")
    for name, outcome in oom_runs(args.size, args.steps, args.cap, args.oom).items():
        what = f"finished (peak resident +{outcome['grown_mb']:.0f} MB)" if outcome["ok"] \
            else f"failed ({outcome['error']})"
        diff = f", max diff {outcome['diff']:.2e} of captum's largest" if "diff" in outcome else ""
        print(f"{name:15} {what}{diff}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--stride", type=int, default=8)
    parser.add_argument("--cap", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--oom", type=int, default=None, metavar="MB")
    parser.add_argument("--child", choices=("captum", "hookscope"), help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.child, args.size, args.steps, args.cap, args.oom, args.save)
    if args.oom is not None:
        return _oom(args)
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
