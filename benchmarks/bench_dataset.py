"""Throughput of `hookscope stats` over a folder of JPEGs: decoding in process, in DataLoader
workers, and split over ranks under torchrun.

Writes ``--images`` synthetic 320x240 JPEGs (seeded gradients plus noise) to a temporary
folder (removed afterwards), then runs the command line as subprocesses, one after another:

    hookscope stats MODEL DIR -w none -b BATCH -f json -o FILE --force -q --workers 0
    hookscope stats ... --workers N                                    (--workers, default 2)
    torchrun --nproc-per-node K --standalone -m hookscope stats ... --workers 0   (--nproc, default 2)

Each is timed end to end (interpreter start, model load, every image, the output written),
and once more with ``--limit 1`` (the same command on one image: its start-up cost), so that
besides end-to-end images/s it reports steady-state images/s, (images - 1) / (full - start-up),
and both speed-ups over ``--workers 0``. With ``--reps`` above 1 the fastest of each is kept.
The ranks decode in process (``--workers 0``) and run with torchrun's OMP_NUM_THREADS (1 unless
set in the environment); the single processes use torch's default thread count.

Peak memory: a sampler thread walks the run's process tree in /proc every 0.1 s and keeps each
process's ``VmHWM`` (its peak RSS); reported per role (the main process, or torchrun's launcher
and its ranks, and the DataLoader workers), the largest of each role, and the largest sum of
the tree's ``VmRSS`` at one instant. Forked workers share the parent's pages copy-on-write, and
RSS counts shared pages in every process, so the sum overstates the memory used.

Last, the JSON of each run is compared with the ``--workers 0`` one: ``same_as_single`` is
true when every ``layers`` field is equal (name, shapes, min, max, zero fraction, non-finite
count, percentiles, ...) except means and standard deviations, which may differ by rounding
(within 1e-6 relative; the largest difference is ``max_rel_diff_moments``).
Linux only (``/proc``). With the defaults it takes about 5 minutes on 2 cores.

    python benchmarks/bench_dataset.py [--images 512] [--batch 16] [--model resnet18]
        [--workers 2] [--nproc 2] [--reps 1] [--stats-args '--per-channel --percentiles 99.9']
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

WIDTH, HEIGHT = 320, 240
#: Relative difference allowed between the means and standard deviations of two runs.
MOMENT_TOLERANCE = 1e-6
MOMENTS = {"mean", "std"}


def make_images(folder: Path, count: int, seed: int = 0) -> None:
    """``count`` JPEGs: a random colour gradient with noise on top, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    for i in range(count):
        a, b = rng.uniform(0, 255, size=(2, 3)).astype(np.float32)
        angle = rng.uniform(0, 2 * np.pi)
        t = (np.cos(angle) * xs / WIDTH + np.sin(angle) * ys / HEIGHT + 1) / 2
        pixels = a + (b - a) * t[..., None] + rng.normal(0, 24, size=(HEIGHT, WIDTH, 3))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        image.save(folder / f"img_{i:05d}.jpg", quality=90)


# ---- peak memory of a process tree, from /proc ----

def _children() -> dict[int, list[int]]:
    """Every process's children, from each ``/proc/PID/stat``'s parent field."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _status_kib(pid: int) -> dict[str, int]:
    """``VmHWM`` and ``VmRSS`` (KiB) of ``pid``; empty for a zombie or a process gone."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    found[line[:5]] = int(line.split()[1])
    except OSError:
        pass
    return found


class Sampler(threading.Thread):
    """Every ``interval`` seconds, each descendant's peak RSS and depth below ``root``."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak_kib: dict[int, int] = {}
        self.depth: dict[int, int] = {}
        self.sum_rss_kib = 0
        self.stop = threading.Event()

    def sample(self) -> None:
        tree = _children()
        level, depth = [self.root], 0
        total = 0
        while level:
            for pid in level:
                status = _status_kib(pid)
                if "VmHWM" in status:
                    self.peak_kib[pid] = max(self.peak_kib.get(pid, 0), status["VmHWM"])
                    self.depth.setdefault(pid, depth)
                    total += status.get("VmRSS", 0)
            level, depth = [c for pid in level for c in tree.get(pid, [])], depth + 1
        self.sum_rss_kib = max(self.sum_rss_kib, total)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)


def run_once(cmd: list[str], roles: tuple[str, ...], env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd``: its wall-clock seconds and the peak RSS of each role in its process tree
    (``roles[d]`` names the processes ``d`` levels below it; deeper ones take the last)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    sampler = Sampler(proc.pid)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - start
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        tail = (err or out).decode(errors="replace").strip().splitlines()[-5:]
        sys.exit(f"bench_dataset: exit code {proc.returncode}: {shlex.join(cmd)}\n"
                 + "\n".join(tail))
    peak: dict[str, float] = {}
    count: dict[str, int] = {}
    for pid, kib in sampler.peak_kib.items():
        role = roles[min(sampler.depth[pid], len(roles) - 1)]
        peak[role] = max(peak.get(role, 0.0), kib / 1024)
        count[role] = count.get(role, 0) + 1
    return {"seconds": seconds,
            "peak_rss_mib": {role: round(peak[role], 1) if role in peak else None
                             for role in roles},
            "processes": {role: count.get(role, 0) for role in roles},
            "peak_rss_sum_mib": round(sampler.sum_rss_kib / 1024, 1)}


def fastest(cmd: list[str], roles: tuple[str, ...], env: dict[str, str], reps: int
            ) -> dict[str, Any]:
    """The fastest of ``reps`` runs (its memory figures with it)."""
    return min((run_once(cmd, roles, env) for _ in range(reps)), key=lambda r: r["seconds"])


# ---- comparing two `stats` documents ----

def compare(a: Any, b: Any, key: str = "") -> tuple[bool, float]:
    """Whether ``a`` and ``b`` are equal, means and stds within :data:`MOMENT_TOLERANCE`
    relative; and the largest relative difference of any mean or std."""
    if isinstance(a, dict) and isinstance(b, dict):
        results = [compare(a[k], b[k], k) for k in a if k in b]
        same = a.keys() == b.keys() and all(s for s, _ in results)
        return same, max((d for _, d in results), default=0.0)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False, 0.0
        results = [compare(x, y, key) for x, y in zip(a, b, strict=True)]
        return all(s for s, _ in results), max((d for _, d in results), default=0.0)
    if key in MOMENTS and isinstance(a, float) and isinstance(b, float):
        diff = abs(a - b) / max(abs(a), abs(b)) if a != b else 0.0
        return diff <= MOMENT_TOLERANCE, diff
    return a == b, 0.0


def same_layers(single: Path, other: Path) -> dict[str, Any]:
    a, b = (json.loads(p.read_text()) for p in (single, other))
    same, diff = compare(a["layers"], b["layers"])
    top = [[[p["index"] for p in preds] for preds in doc["predictions"]] for doc in (a, b)]
    return {"same_as_single": same, "max_rel_diff_moments": diff,
            "same_predictions": top[0] == top[1] and a["inputs"] == b["inputs"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--workers", type=int, default=2,
                        help="DataLoader workers of the second run")
    parser.add_argument("--nproc", type=int, default=2, help="torchrun processes")
    parser.add_argument("--reps", type=int, default=1, help="runs of each (the fastest counts)")
    parser.add_argument("--stats-args", default="",
                        help="more options for every `stats` run, e.g. '--per-channel'")
    args = parser.parse_args()
    if args.images < 2:
        parser.error("--images must be at least 2")
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = [str(torchrun)] if torchrun.exists() else \
        [sys.executable, "-m", "torch.distributed.run"]
    env = os.environ | {"HOOKSCOPE_OFFLINE": "1"}
    rank_threads = os.environ.get("OMP_NUM_THREADS", "1")

    with tempfile.TemporaryDirectory(prefix="hookscope-bench-") as tmp:
        folder = Path(tmp, "images")
        folder.mkdir()
        make_images(folder, args.images)
        stats = ["stats", args.model, str(folder), "-w", "none", "-b", str(args.batch),
                 "-f", "json", "--force", "-q", *shlex.split(args.stats_args)]
        single = [sys.executable, "-m", "hookscope", *stats]
        ranks = [*launcher, "--nproc-per-node", str(args.nproc), "--standalone",
                 "-m", "hookscope", *stats]
        cases: dict[str, tuple[list[str], tuple[str, ...]]] = {
            "workers_0": ([*single, "--workers", "0"], ("main", "workers")),
            f"workers_{args.workers}": ([*single, "--workers", str(args.workers)],
                                        ("main", "workers")),
            f"torchrun_{args.nproc}": ([*ranks, "--workers", "0"],
                                       ("launcher", "ranks", "workers")),
        }
        runs: dict[str, dict[str, Any]] = {}
        for name, (cmd, roles) in cases.items():
            output = Path(tmp, f"{name}.json")
            startup = fastest([*cmd, "-o", str(Path(tmp, "startup.json")), "--limit", "1"],
                              roles, env, args.reps)
            full = fastest([*cmd, "-o", str(output)], roles, env, args.reps)
            steady = full["seconds"] - startup["seconds"]
            runs[name] = {
                "seconds": round(full["seconds"], 2),
                "startup_seconds": round(startup["seconds"], 2),
                "images_per_s": round(args.images / full["seconds"], 1),
                "steady_images_per_s": round((args.images - 1) / steady, 1) if steady > 0
                else None,
                **{k: full[k] for k in ("peak_rss_mib", "processes", "peak_rss_sum_mib")},
            }
            if name != "workers_0":
                runs[name] |= same_layers(Path(tmp, "workers_0.json"), output)
        base = runs["workers_0"]
        for run in runs.values():
            run["speedup"] = round(base["seconds"] / run["seconds"], 2)
            run["steady_speedup"] = round(run["steady_images_per_s"]
                                          / base["steady_images_per_s"], 2) \
                if run["steady_images_per_s"] and base["steady_images_per_s"] else None

    print(json.dumps({
        "model": args.model, "images": args.images, "image_size": [WIDTH, HEIGHT],
        "batch": args.batch, "cpus": len(os.sched_getaffinity(0)),
        "stats_args": args.stats_args, "rank_workers": 0, "rank_threads": rank_threads,
        "runs": runs,
    }, indent=1))


if __name__ == "__main__":
    main()
