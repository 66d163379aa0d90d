"""The compiled moments kernel against float64 references, its cache, and the fallback.

The kernel is built once per session, into the default cache (where ``make install`` put
it) or, if that cannot be written, a temporary one, and only when a C++ compiler and ninja
are present. Without them the kernel-on cases check that the torch path is used instead,
and still hold it to the same accuracy bar.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path

import pytest
import torch

import hookscope.probes.stats as stats
from hookscope.probes import kernels
from hookscope.probes.stats import _moments_host, collect_stats
from tests.bounds import U32, diff_chain, sum_bound
from tests.test_stats import CASES, REL, _from, assert_close, reference

pytestmark = pytest.mark.slow  # the first build compiles for tens of seconds


def _toolchain() -> bool:
    from torch.utils.cpp_extension import is_ninja_available

    return shutil.which(os.environ.get("CXX", "c++")) is not None and is_ninja_available()


@pytest.fixture(scope="session")
def kernel_op(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kernels.MomentsOp | None]:
    """The compiled op (built at most once per session), or None without a compiler."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("HOOKSCOPE_KERNELS", raising=False)
        kernels.reset()
        if kernels.fused() is None and _toolchain():
            try:
                kernels.build()
            except OSError:  # an unwritable home: build into a temporary cache instead
                patch.setenv("HOOKSCOPE_CACHE", str(tmp_path_factory.mktemp("hookscope-cache")))
                kernels.build()
            kernels.reset()
        yield kernels.fused()
    kernels.reset()


@pytest.fixture(params=["kernel", "torch"])
def path(request: pytest.FixtureRequest, kernel_op, monkeypatch: pytest.MonkeyPatch):
    """Run a test with the kernel switched on (when built) and with the torch path."""
    monkeypatch.setenv("HOOKSCOPE_KERNELS", "1" if request.param == "kernel" else "0")
    kernels.reset()
    yield request.param
    kernels.reset()


def _uses_kernel(path: str, kernel_op) -> bool:
    return path == "kernel" and kernel_op is not None


def test_kernel_built_or_fallback_said(kernel_op) -> None:
    if _toolchain():
        assert kernel_op is not None, "a compiler is present, so the kernel must build"
    else:
        assert kernel_op is None
        warnings.warn("no C++ compiler or ninja: the kernel is not built; statistics and "
                      "these tests use the torch path", UserWarning, stacklevel=1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_moments_match_float64_reference(case: str, path: str, kernel_op,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if _uses_kernel(path, kernel_op):  # prove the kernel, not the torch path, answered
        monkeypatch.setattr(stats, "moments_matrix", _refuse)
    x = CASES[case](torch.Generator().manual_seed(1))
    values = astuple(_moments_host(x.reshape(-1)))
    assert_close(_from(values), reference(x))
    _assert_exact_parts(values, x)


def _refuse(*args, **kwargs):
    raise AssertionError("the torch path ran although the kernel is built")


def _assert_exact_parts(values, x: torch.Tensor) -> None:
    """Counts, min and max are exact, not merely close."""
    flat = x.reshape(-1).double()
    finite = flat[torch.isfinite(flat)]
    numel, n, _, _, lo, hi, zeros, nonfinite = values
    assert (numel, n, nonfinite) == (flat.numel(), finite.numel(), flat.numel() - finite.numel())
    assert zeros == int((flat == 0).sum())
    if finite.numel():
        assert (lo, hi) == (finite.min().item(), finite.max().item())


ADVERSARIAL = {
    # Channels whose means differ by 30 std: each block's shift comes from its neighbour.
    "channel_offsets": lambda g: torch.randn(2, 64, 40, 40, generator=g)
    + 30 * torch.randn(1, 64, 1, 1, generator=g),
    # Blocks alternate between a mean of 0 and 1e4: the worst shift a block can get.
    "alternating_blocks": lambda g: torch.cat([
        torch.randn(2048, generator=g) + (1e4 if i % 2 else 0.0) for i in range(40)]),
    "outlier_first": lambda g: torch.cat([torch.tensor([1e6]), torch.randn(200_000, generator=g)]),
    "nan_inf_spread": lambda g: torch.randn(300_001, generator=g).index_fill_(
        0, torch.tensor([0, 4096, 70_000, 300_000]), math.nan).index_fill_(
        0, torch.tensor([9, 150_000]), math.inf),
    "huge_in_big": lambda g: torch.randn(100_000, generator=g).index_fill_(
        0, torch.tensor([3000, 3001]), 3e38),
    "float64_mean_1e6": lambda g: 1e6 + torch.randn(300_007, generator=g, dtype=torch.float64),
    "strided": lambda g: torch.randn(50_000, 3, generator=g)[:, 1],
}


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_adversarial_layouts_match_float64_reference(case: str, path: str) -> None:
    x = ADVERSARIAL[case](torch.Generator().manual_seed(3))
    values = astuple(_moments_host(x.reshape(-1)))
    assert_close(_from(values), reference(x), rel=REL)
    _assert_exact_parts(values, x)


def test_result_does_not_depend_on_thread_count(kernel_op) -> None:
    if kernel_op is None:
        pytest.skip("no kernel without a compiler (the torch path is covered above)")
    x = 1e3 + torch.randn(1_000_003, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(kernel_op(x, True))
    finally:
        torch.set_num_threads(before)
    assert results[0] == results[1] == results[2]


DIFF_CASES = {
    "empty": (0, 1.0, 1e-3),
    "tail only": (15, 1.0, 1e-3),
    "one step": (16, 1.0, 1e-3),
    "windows and a tail": (4096 + 7, 3.0, 1e-2),
    "many tasks": (1_000_003, 1.0, 1e-4),
    "mean far from zero": (70_001, 1e4, 1e-3),
    "identical": (5000, 1.0, 0.0),
}


def _chain(path: str, kernel_op) -> int:
    """The diff sums' longest float32 addition chain on this path (see ``diff_chain``)."""
    return diff_chain(_uses_kernel(path, kernel_op))


@pytest.mark.parametrize("case", sorted(DIFF_CASES))
def test_diff_sums_match_float64_reference(case: str, path: str, kernel_op,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import hookscope.probes.diffsums as diffsums

    numel, scale, noise = DIFF_CASES[case]
    g = torch.Generator().manual_seed(6)
    a = scale * (1 + torch.randn(numel, generator=g))
    b = a + noise * torch.randn(numel, generator=g)
    if _uses_kernel(path, kernel_op):  # prove the kernel, not the torch path, answered
        monkeypatch.setattr(diffsums, "_chunk_sums", _refuse)
    got = diffsums._compare_host(a, b)
    x, y = a.double(), b.double()
    d = x - y
    want = (numel, numel, float(d @ d), float(x @ x), float(y @ y),
            float(d.abs().max()) if numel else 0.0, 0, 0)
    # The largest |a - b| is one float32 difference, rounded once.
    assert got[:2] == want[:2] and got[6:] == want[6:] and got[5] == pytest.approx(want[5], rel=U32)
    chain = _chain(path, kernel_op)
    for value, terms in zip(got[2:5], (d * d, x * x, y * y), strict=True):
        assert abs(value - float(terms.sum())) <= sum_bound(terms, chain)


@pytest.mark.parametrize("bad", ["nan", "inf", "overflow"])
def test_diff_sums_not_finite_go_the_masked_way(bad: str, path: str) -> None:
    from hookscope.probes.diffsums import _compare_host

    a = torch.linspace(-1, 1, 1000)
    b = a + 1e-3
    if bad == "overflow":  # finite values whose float32 squares are not
        a[3] = 3e20
        got = _compare_host(a, b)
        assert got[6:] == (0, 0) and got[5] == pytest.approx(3e20, rel=1e-6)
        assert math.isfinite(got[3]) and got[3] == pytest.approx(9e40, rel=1e-5)
        return
    a[10] = float(bad)
    b[20] = -float(bad) if bad == "inf" else float(bad)
    got = _compare_host(a, b)
    assert got[:2] == (1000, 998) and got[6:] == (1, 1)
    assert got[2] == pytest.approx(998 * 1e-6, rel=1e-4) and got[5] == pytest.approx(1e-3, rel=1e-3)


def test_diff_sums_do_not_depend_on_thread_count(kernel_op) -> None:
    if kernel_op is None:
        pytest.skip("no kernel without a compiler (the torch path is covered above)")
    op = kernels.fused_diff()
    assert op is not None
    g = torch.Generator().manual_seed(7)
    a = torch.randn(1_000_003, generator=g)
    b = a + 1e-3 * torch.randn(1_000_003, generator=g)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(op(a, b))
    finally:
        torch.set_num_threads(before)
    assert results[0] == results[1] == results[2] and results[0][0]


def test_collect_stats_agrees_with_and_without_kernel(tiny_net, kernel_op,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(3, 3, 12, 12, generator=torch.Generator().manual_seed(5))
    reports = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("HOOKSCOPE_KERNELS", flag)
        kernels.reset()
        reports[flag] = collect_stats(tiny_net, x, input_stats=True)
    kernels.reset()
    for on, off in zip(reports["1"].layers, reports["0"].layers, strict=True):
        assert (on.name, on.call, on.zero_fraction, on.nonfinite) == \
            (off.name, off.call, off.zero_fraction, off.nonfinite)
        assert (on.min, on.max) == (off.min, off.max)
        # Each path is within REL of the float64 reference (the tests above), so within
        # 2 REL of each other; a mean near zero, within 2 REL of the spread it sums.
        assert on.mean == pytest.approx(off.mean, rel=2 * REL, abs=2 * REL * off.std)
        assert on.std == pytest.approx(off.std, rel=2 * REL)


def test_disabled_by_environment(kernel_op, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKSCOPE_KERNELS", "0")
    kernels.reset()
    assert kernels.fused() is None
    monkeypatch.delenv("HOOKSCOPE_KERNELS")
    kernels.reset()
    assert (kernels.fused() is not None) == (kernel_op is not None)
    kernels.reset()


def test_never_compiles_on_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKSCOPE_CACHE", str(tmp_path))
    monkeypatch.delenv("HOOKSCOPE_KERNELS", raising=False)
    kernels.reset()
    assert kernels.fused() is None
    _moments_host(torch.randn(100))
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing even created
    kernels.reset()


def test_incomplete_or_broken_builds_are_not_used(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKSCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(kernels, "_loaded", {})  # as if nothing were loaded in this process
    folder = kernels.build_dir()
    folder.mkdir(parents=True)
    (folder / f"hookscope_{kernels.cache_key()}.so").write_bytes(b"not a library")
    kernels.reset()
    assert kernels.fused() is None  # no completion mark: maybe still being linked
    (folder / "complete").write_text("0\n")
    kernels.reset()
    with pytest.warns(UserWarning, match="cannot load the compiled kernel"):
        assert kernels.fused() is None
    kernels.reset()


def test_cache_key_covers_flags_dispatch_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    key = kernels.cache_key()
    assert kernels.build_dir(Path("/c")).name == \
        f"kernels-{torch.__version__.replace('+', '_')}-{key}"
    monkeypatch.setattr(kernels, "CFLAGS", ("-O2", "-fopenmp"))
    assert kernels.cache_key() != key
    monkeypatch.undo()
    monkeypatch.setattr(kernels, "_clones", lambda: "")
    assert kernels.cache_key() != key
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert kernels.cache_key() != key
    assert "-march=native" not in kernels.CFLAGS  # one build must suit every CPU


def test_module_reports_build(kernel_op) -> None:
    if kernel_op is None:
        pytest.skip("no compiler: see test_build_failure_is_one_line")
    done = subprocess.run([sys.executable, "-m", "hookscope.probes.kernels"], capture_output=True,
                          text=True, env=os.environ | {"HOOKSCOPE_KERNELS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"kernel ready in {kernels.build_dir()}" in done.stdout


def test_build_failure_is_one_line(tmp_path: Path) -> None:
    env = os.environ | {"HOOKSCOPE_CACHE": str(tmp_path), "CXX": str(tmp_path / "no-such-c++")}
    done = subprocess.run([sys.executable, "-m", "hookscope.probes.kernels"], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("hookscope:")]
    assert len(lines) == 1 and "torch path" in lines[0]
    assert not list(tmp_path.glob("*/complete"))


# ------------------------------------------------------------------ trusting the cache

#: A library that leaves a mark when loaded: its constructor runs as the library is loaded.
PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
  FILE* f = fopen("MARKER", "w");
  if (f) { fputs("loaded\n", f); fclose(f); }
}
"""
#: A hang guard for the subprocesses below, not an expected duration.
HANG_GUARD = 600


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The planted library, and the file its loading would write."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler to build the planted library")
    folder = tmp_path_factory.mktemp("planted")
    marker, source = folder / "loaded", folder / "planted.c"
    source.write_text(PLANTED.replace("MARKER", str(marker)))
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / "planted.so"), str(source)],
                   check=True, timeout=HANG_GUARD)
    return folder / "planted.so", marker


def _plant(root: Path, library: Path) -> Path:
    """A complete-looking build of this very kernel, in the cache ``root``."""
    folder = kernels.build_dir(root)
    folder.mkdir(parents=True, mode=0o755)
    shutil.copy(library, folder / f"hookscope_{kernels.cache_key()}.so")
    (folder / "complete").write_text("0\n")
    return folder


def _another_users(root: Path, folder: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give the planted build to another user")
    for path in (folder, *folder.iterdir()):
        shutil.chown(path, "nobody")


UNSAFE = {
    "group-writable cache": lambda root, folder: root.chmod(0o775),
    "world-writable cache": lambda root, folder: root.chmod(0o777),
    "another user's build": _another_users,
    "private cache (the control: this one is loaded)": lambda root, folder: None,
}


@pytest.mark.parametrize("case", list(UNSAFE))
def test_a_planted_kernel_in_an_unsafe_cache_is_never_loaded(case: str, planted, tmp_path: Path
                                                              ) -> None:
    library, marker = planted
    marker.unlink(missing_ok=True)
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    UNSAFE[case](root, _plant(root, library))
    torch.manual_seed(0)
    x = 3 * torch.randn(2, 3, 32, 32) + 1
    torch.save(x, tmp_path / "x.pt")
    env = os.environ | {"HOOKSCOPE_CACHE": str(root), "HOOKSCOPE_KERNELS": "1",
                        "HOOKSCOPE_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "hookscope", "stats", "resnet18", "x.pt",
                           "--weights", "none", "--input-stats", "--layers", "conv1", "-f", "json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr
    if case.startswith("private"):
        assert marker.exists(), "the planted library must be detectable once loaded"
        return
    assert not marker.exists(), "the planted library was loaded"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "not loading the compiled kernel" in lines[0], done.stderr
    assert ("another user" if "user" in case else "writable by") in lines[0]
    got = json.loads(done.stdout)["layers"][0]["input_stats"]
    assert_close({k: got[k] for k in ("mean", "std", "min", "max")},
                 {k: v for k, v in reference(x).items() if k in ("mean", "std", "min", "max")})


def test_an_unsafe_cache_is_not_built_into(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    with pytest.raises(RuntimeError, match="refusing to build into .* writable by others"):
        kernels.build(root)
    assert not list(root.rglob("*.cpp")), "nothing written into it"
    done = subprocess.run([sys.executable, "-m", "hookscope.probes.kernels"], capture_output=True,
                          text=True, env=os.environ | {"HOOKSCOPE_CACHE": str(root)},
                          timeout=HANG_GUARD)
    assert done.returncode == 1
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        f"hookscope: kernel not built (refusing to build into {kernels.build_dir(root)}: {root} "
        "is writable by others; choose a cache only you can write with HOOKSCOPE_CACHE); "
        "statistics use the torch path."]


def test_a_sticky_folder_like_tmp_is_no_reason_to_distrust(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    mine = shared / "mine"
    mine.mkdir(mode=0o700)
    (mine / "lib.so").write_bytes(b"")
    assert kernels.unsafe(mine / "lib.so") is None
    shared.chmod(0o777)
    assert kernels.unsafe(mine / "lib.so") == f"{shared} is writable by others"
