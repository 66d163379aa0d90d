"""Optional compiled CPU kernels, built once into a cache: an activation's moments in one
pass (``stats``), and the sums ``diff`` compares two activations by, in one pass over both.

``fused()`` and ``fused_diff()`` return the compiled ops when a build of this exact source,
these flags and this torch is in the cache, else None (the torch paths). Using them never
compiles: ``python -m hookscope.probes.kernels`` does (``make install`` runs it).
``HOOKSCOPE_KERNELS=0`` disables them; ``HOOKSCOPE_CACHE`` moves the cache.

A loaded library runs its code, so the cache is trusted only when nobody else could have
written it (see :func:`unsafe`); otherwise hookscope says so in one line and uses the torch
path, and ``build`` refuses.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import stat
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["DiffOp", "MomentsOp", "build", "build_dir", "cache_key", "enabled", "fused",
           "fused_diff", "main", "reset", "unsafe"]

log = logging.getLogger("hookscope")

#: The op's result: numel, finite count, mean, M2, min, max, zeros, non-finite count.
MomentsOp = Callable[[torch.Tensor, bool], tuple[int, int, float, float, float, float, int, int]]
#: Two float32 tensors' (all finite, sum (a-b)^2, sum a^2, sum b^2, max |a-b|).
DiffOp = Callable[[torch.Tensor, torch.Tensor], tuple[bool, float, float, float, float]]

SOURCE = r"""
// One pass over a contiguous float32 or float64 tensor: finite count, mean and M2 (float64),
// min, max, zero and non-finite counts.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace {

// Values per block: the unit of float64 accumulation, of the shift, and of the fallback.
constexpr int64_t kBlock = 2048;
// Blocks per parallel task. Fixed, so the result does not depend on the number of threads.
constexpr int64_t kTaskBlocks = 32;
// Float32 values per vector step, and steps per float32 window (then added into float64).
constexpr int64_t kStep = 16, kWindow = 16;
// Values to prefetch ahead (4 KiB): activations mostly come from DRAM, where the hardware
// prefetcher alone kept the kernel at ~80% of a plain sum's bandwidth; ~90-100% with this.
constexpr int64_t kAhead = 1024;

struct Acc {
  int64_t n = 0;  // finite values
  double mean = 0.0, m2 = 0.0;
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  int64_t zeros = 0, nonfinite = 0;
};

// Chan et al.'s parallel combination: exact for the counts, min and max.
inline void merge(Acc& a, const Acc& b) {
  a.zeros += b.zeros;
  a.nonfinite += b.nonfinite;
  if (b.n == 0) return;
  if (a.n == 0) {
    a.n = b.n; a.mean = b.mean; a.m2 = b.m2; a.lo = b.lo; a.hi = b.hi;
    return;
  }
  const int64_t n = a.n + b.n;
  const double delta = b.mean - a.mean;
  a.mean += delta * (static_cast<double>(b.n) / n);
  a.m2 += b.m2 + delta * delta * (static_cast<double>(a.n) * b.n / n);
  a.lo = std::min(a.lo, b.lo);
  a.hi = std::max(a.hi, b.hi);
  a.n = n;
}

// A block's summary from its mean and its sums of d = x - k and d^2, for a shift k. With k
// near the block's mean the squares carry the spread alone, so a mean 1e4 times the std
// does not cancel.
inline Acc from_sums(int64_t n, double mean, double s, double q, double lo, double hi,
                     int64_t zeros, int64_t nonfinite) {
  Acc a;
  a.n = n; a.zeros = zeros; a.nonfinite = nonfinite;
  if (n == 0) return a;
  a.mean = mean;
  a.m2 = std::max(q - s * s / n, 0.0);
  a.lo = lo; a.hi = hi;
  return a;
}

// Beyond this magnitude a block goes to careful_block: float32 squares overflow, and sums
// of values of opposite signs this large need compensation to keep a small mean.
template <typename T> constexpr double kHuge = 1e18;
template <> constexpr double kHuge<double> = 1e150;

// All in float64, shifted by the block's first value: float64 input, the first block of a
// task (no shift known yet) and short tails. False when a value is not finite (the sum is
// then NaN or infinite) or huge.
template <typename T>
__attribute__((always_inline)) inline bool exact_block(const T* x, int64_t len, Acc& out) {
  const T k = x[0];
  double s = 0.0, q = 0.0;
  T lo = k, hi = k;
  int64_t zeros = 0;
#pragma omp simd reduction(+ : s, q, zeros) reduction(min : lo) reduction(max : hi)
  for (int64_t i = 0; i < len; ++i) {
    const T v = x[i];
    const double d = static_cast<double>(v) - static_cast<double>(k);
    s += d;
    q += d * d;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    zeros += v == T(0);
  }
  if (!std::isfinite(s) || !std::isfinite(q) || !(std::max(-lo, hi) <= kHuge<T>)) return false;
  out = from_sums(len, k + s / len, s, q, lo, hi, zeros, 0);
  return true;
}

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef double d4 __attribute__((vector_size(32)));

// Float32 lanes summed into float64 ones: the lanes' low and high halves, converted.
typedef float f4 __attribute__((vector_size(16)));

__attribute__((always_inline)) inline void widen_add(d4& lo, d4& hi, f8 v) {
  f4 half[2];
  std::memcpy(half, &v, sizeof half);
  lo += __builtin_convertvector(half[0], d4);
  hi += __builtin_convertvector(half[1], d4);
}

// Float32, shifted by k, the previous block's mean: (x - k) and its square are summed in
// float32 lanes for a window of 16 values a lane, then in float64, at about twice the speed
// of float64 lanes. A block's M2 is then off by at most ~1e-6 of n (mean - k)^2: a small
// part of the spread between neighbouring blocks, itself part of the total M2.
// False when a value is not finite or huge, or a float32 square overflows. len % kStep == 0.
__attribute__((always_inline)) inline bool float_block(const float* x, int64_t len, float k,
                                                       Acc& out) {
  f8 lo0, lo1, hi0, hi1;
  std::memcpy(&lo0, x, sizeof lo0);
  lo1 = hi0 = hi1 = lo0;
  i8 z0 = {}, z1 = {};
  d4 s0 = {}, s1 = {}, q0 = {}, q1 = {};
  for (int64_t w = 0; w < len; w += kStep * kWindow) {
    f8 a0 = {}, a1 = {}, b0 = {}, b1 = {};
    for (int64_t i = w, end = std::min(len, w + kStep * kWindow); i < end; i += kStep) {
      __builtin_prefetch(x + i + kAhead);  // never faults, even past the end
      f8 u, v;
      std::memcpy(&u, x + i, sizeof u);
      std::memcpy(&v, x + i + 8, sizeof v);
      const f8 du = u - k, dv = v - k;
      a0 += du; a1 += dv;
      b0 += du * du; b1 += dv * dv;
      lo0 = u < lo0 ? u : lo0; lo1 = v < lo1 ? v : lo1;
      hi0 = u > hi0 ? u : hi0; hi1 = v > hi1 ? v : hi1;
      z0 -= u == 0.0f; z1 -= v == 0.0f;  // a true comparison is -1
    }
    widen_add(s0, s1, a0 + a1);
    widen_add(q0, q1, b0 + b1);
  }
  s0 += s1; q0 += q1; z0 += z1;
  const double s = (s0[0] + s0[1]) + (s0[2] + s0[3]), q = (q0[0] + q0[1]) + (q0[2] + q0[3]);
  float mn = lo0[0], mx = hi0[0];
  int64_t z = 0;
  for (int j = 0; j < 8; ++j) {
    mn = std::min({mn, lo0[j], lo1[j]}); mx = std::max({mx, hi0[j], hi1[j]}); z += z0[j];
  }
  if (!std::isfinite(s) || !std::isfinite(q) || !(std::max(-mn, mx) <= kHuge<float>)) return false;
  out = from_sums(len, k + s / len, s, q, mn, mx, z, 0);
  return true;
}

// Non-finite or huge values present: mask them, one value at a time (rare, so scalar). The
// mean comes from Neumaier's compensated sum, which keeps 3e38 - 3e38 + 1 exact.
template <typename T>
Acc careful_block(const T* x, int64_t len) {
  double k = 0.0;
  for (int64_t i = 0; i < len; ++i) {
    if (std::isfinite(x[i])) { k = x[i]; break; }
  }
  double sum = 0.0, carry = 0.0, s = 0.0, q = 0.0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  int64_t n = 0, zeros = 0;
  for (int64_t i = 0; i < len; ++i) {
    const double v = x[i];
    if (!std::isfinite(v)) continue;
    const double t = sum + v;
    carry += std::abs(sum) >= std::abs(v) ? (sum - t) + v : (v - t) + sum;
    sum = t;
    const double d = v - k;
    s += d; q += d * d; ++n;
    lo = std::min(lo, v); hi = std::max(hi, v);
    zeros += v == 0.0;
  }
  return from_sums(n, n ? (sum + carry) / n : 0.0, s, q, lo, hi, zeros, len - n);
}

HS_CLONES Acc task_f32(const float* x, int64_t len) {
  Acc acc, block;
  float k = 0.0f;
  bool shifted = false;  // the first block has no previous mean to shift by
  for (int64_t b = 0; b < len; b += kBlock) {
    const float* p = x + b;
    const int64_t m = std::min(kBlock, len - b);
    const bool ok = shifted && m % kStep == 0 ? float_block(p, m, k, block)
                                              : exact_block(p, m, block);
    if (!ok) block = careful_block(p, m);
    merge(acc, block);
    k = static_cast<float>(block.mean);
    shifted = block.n > 0 && std::isfinite(k);
  }
  return acc;
}

HS_CLONES Acc task_f64(const double* x, int64_t len) {
  Acc acc, block;
  for (int64_t b = 0; b < len; b += kBlock) {
    const int64_t m = std::min(kBlock, len - b);
    merge(acc, exact_block(x + b, m, block) ? block : careful_block(x + b, m));
  }
  return acc;
}

template <typename T>
Acc run(const T* x, int64_t numel, Acc (*task)(const T*, int64_t)) {
  const int64_t span = kBlock * kTaskBlocks;
  const int64_t tasks = (numel + span - 1) / span;
  std::vector<Acc> parts(tasks);
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      parts[t] = task(x + t * span, std::min(span, numel - t * span));
    }
  });
  Acc total;
  for (const Acc& p : parts) merge(total, p);  // in order: the same result for any threads
  return total;
}

std::tuple<int64_t, int64_t, double, double, double, double, int64_t, int64_t>
moments(const at::Tensor& input, bool zeros) {
  TORCH_CHECK(input.device().is_cpu(), "hookscope moments: a CPU tensor is needed");
  const at::Tensor x = input.contiguous();
  const int64_t numel = x.numel();
  Acc a;
  if (x.scalar_type() == at::kFloat) {
    a = run<float>(x.const_data_ptr<float>(), numel, task_f32);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kDouble, "hookscope moments: float32 or float64 only");
    a = run<double>(x.const_data_ptr<double>(), numel, task_f64);
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (a.n == 0) return {numel, 0, nan, nan, nan, nan, 0, a.nonfinite};
  return {numel, a.n, a.mean, a.m2, a.lo, a.hi, zeros ? a.zeros : 0, a.nonfinite};
}

// ---------------------------------------------------------------- diff: two tensors at once

// Sums of (a - b)^2, a^2 and b^2 (float64) and max |a - b| over a run of two float32 tensors:
// one read of each value, the squares summed in float32 lanes for a window of 16 values a
// lane, then in float64 (like float_block: within ~1e-6 relative). A sum that is not finite
// (a value that is not, or a float32 square that overflowed) sends the caller to its masked
// float64 path.
struct DiffAcc {
  double sd = 0.0, sa = 0.0, sb = 0.0;
  float mx = 0.0f;
};

HS_CLONES DiffAcc diff_task(const float* a, const float* b, int64_t len) {
  DiffAcc acc;
  d4 sd0 = {}, sd1 = {}, sa0 = {}, sa1 = {}, sb0 = {}, sb1 = {};
  f8 m0 = {}, m1 = {};
  const int64_t whole = len - len % kStep;
  for (int64_t w = 0; w < whole; w += kStep * kWindow) {
    f8 d0 = {}, d1 = {}, a0 = {}, a1 = {}, b0 = {}, b1 = {};
    for (int64_t i = w, end = std::min(whole, w + kStep * kWindow); i < end; i += kStep) {
      __builtin_prefetch(a + i + kAhead);
      __builtin_prefetch(b + i + kAhead);
      f8 u0, u1, v0, v1;
      std::memcpy(&u0, a + i, sizeof u0);
      std::memcpy(&u1, a + i + 8, sizeof u1);
      std::memcpy(&v0, b + i, sizeof v0);
      std::memcpy(&v1, b + i + 8, sizeof v1);
      const f8 e0 = u0 - v0, e1 = u1 - v1;
      d0 += e0 * e0; d1 += e1 * e1;
      a0 += u0 * u0; a1 += u1 * u1;
      b0 += v0 * v0; b1 += v1 * v1;
      const f8 g0 = e0 < 0.0f ? -e0 : e0, g1 = e1 < 0.0f ? -e1 : e1;
      m0 = g0 > m0 ? g0 : m0; m1 = g1 > m1 ? g1 : m1;
    }
    widen_add(sd0, sd1, d0 + d1);
    widen_add(sa0, sa1, a0 + a1);
    widen_add(sb0, sb1, b0 + b1);
  }
  sd0 += sd1; sa0 += sa1; sb0 += sb1;
  acc.sd = (sd0[0] + sd0[1]) + (sd0[2] + sd0[3]);
  acc.sa = (sa0[0] + sa0[1]) + (sa0[2] + sa0[3]);
  acc.sb = (sb0[0] + sb0[1]) + (sb0[2] + sb0[3]);
  for (int j = 0; j < 8; ++j) acc.mx = std::max({acc.mx, m0[j], m1[j]});
  for (int64_t i = whole; i < len; ++i) {
    const double x = a[i], y = b[i], e = x - y;
    acc.sd += e * e; acc.sa += x * x; acc.sb += y * y;
    acc.mx = std::max(acc.mx, static_cast<float>(std::abs(e)));
  }
  return acc;
}

// (finite, sum (a-b)^2, sum a^2, sum b^2, max |a-b|) of two float32 tensors of one size.
std::tuple<bool, double, double, double, double> diff_sums(const at::Tensor& a_in,
                                                           const at::Tensor& b_in) {
  TORCH_CHECK(a_in.device().is_cpu() && b_in.device().is_cpu(),
              "hookscope diff_sums: CPU tensors are needed");
  TORCH_CHECK(a_in.scalar_type() == at::kFloat && b_in.scalar_type() == at::kFloat,
              "hookscope diff_sums: float32 only");
  TORCH_CHECK(a_in.numel() == b_in.numel(), "hookscope diff_sums: sizes differ");
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const float* pa = a.const_data_ptr<float>();
  const float* pb = b.const_data_ptr<float>();
  const int64_t numel = a.numel(), span = kBlock * kTaskBlocks;
  const int64_t tasks = (numel + span - 1) / span;
  std::vector<DiffAcc> parts(tasks);
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      parts[t] = diff_task(pa + t * span, pb + t * span, std::min(span, numel - t * span));
    }
  });
  DiffAcc total;
  for (const DiffAcc& p : parts) {  // in order: the same result for any number of threads
    total.sd += p.sd; total.sa += p.sa; total.sb += p.sb;
    total.mx = std::max(total.mx, p.mx);
  }
  const bool finite = std::isfinite(total.sd) && std::isfinite(total.sa) &&
                      std::isfinite(total.sb) && std::isfinite(total.mx);
  return {finite, total.sd, total.sa, total.sb, total.mx};
}

}  // namespace

TORCH_LIBRARY(HS_NAMESPACE, m) {
  m.def("moments(Tensor x, bool zeros=True) -> (int, int, float, float, float, float, int, int)");
  m.def("diff_sums(Tensor a, Tensor b) -> (bool, float, float, float, float)");
}

TORCH_LIBRARY_IMPL(HS_NAMESPACE, CPU, m) {
  m.impl("moments", &moments);
  m.impl("diff_sums", &diff_sums);
}
"""

#: Runtime dispatch (GCC/Clang function multiversioning, x86-64 ELF): an AVX2+FMA clone (~4x
#: the SSE2 baseline's speed) and a baseline one, so one build serves every CPU a home folder
#: is used from. Not "arch=haswell": GCC dispatches that on the CPU model, not its features.
CLONES = '__attribute__((target_clones("arch=x86-64-v3", "default")))'
#: No -march=native: one user's cache may serve machines with different CPUs (a home on NFS).
CFLAGS: tuple[str, ...] = ("-O3", "-fopenmp")
LDFLAGS: tuple[str, ...] = ("-fopenmp",)


def _clones() -> str:
    """The multiversioning attribute where the toolchain offers it (x86-64 Linux), else none."""
    x86_elf = platform.machine().lower() in ("x86_64", "amd64") and sys.platform == "linux"
    return CLONES if x86_elf else ""


def cache_key() -> str:
    """Hash of everything the binary depends on: source, flags, CPU dispatch, torch, ABI."""
    parts = [SOURCE, _clones(), *CFLAGS, "|", *LDFLAGS, torch.__version__, platform.machine(),
             sys.platform, str(torch.compiled_with_cxx11_abi())]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def build_dir(root: Path | None = None) -> Path:
    """Where this source, these flags and this torch are built: under ``root``, else
    ``$HOOKSCOPE_CACHE``, else ``$XDG_CACHE_HOME/hookscope``, else ``~/.cache/hookscope``."""
    if root is None and (env := os.environ.get("HOOKSCOPE_CACHE")):
        root = Path(env).expanduser()
    if root is None:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "hookscope"
    return root / f"kernels-{torch.__version__.replace('+', '_')}-{cache_key()}"


def enabled() -> bool:
    """False when ``HOOKSCOPE_KERNELS=0`` asks for the torch path."""
    return os.environ.get("HOOKSCOPE_KERNELS", "1").strip() != "0"


_DONE = "complete"  # written after a successful build, so a half-linked library is never loaded
#: The ops loaded in this process, by cache key: a second copy of a library would register
#: its namespace twice.
_loaded: dict[str, Any] = {}


def _namespace() -> str:
    """The op's namespace and the library's name: one per build, so two never collide."""
    return f"hookscope_{cache_key()}"


def unsafe(path: Path) -> str | None:
    """Why code at ``path`` cannot be trusted, or None: it, or a folder above it, belongs to
    a user other than this one and root, or is writable by its group or by others.

    A sticky folder (``/tmp``) passes: there each user can replace only their own entries.
    Without POSIX owners (Windows) nothing is checked.
    """
    if not hasattr(os, "getuid"):
        return None
    real = path.resolve()
    for part in (real, *real.parents):
        try:
            info = part.stat()
        except OSError as exc:
            return f"{part} cannot be checked ({exc.strerror})"
        if info.st_uid not in (os.getuid(), 0):
            return f"{part} belongs to another user (uid {info.st_uid})"
        sticky = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        if info.st_mode & 0o022 and not sticky:
            return f"{part} is writable by {'others' if info.st_mode & 0o002 else 'its group'}"
    return None


def _load(directory: Path) -> Any:
    """The ops from the complete build in ``directory``, loaded once per process; else None
    (saying why in one line when the build is there but untrusted)."""
    key = cache_key()
    library = directory / f"{_namespace()}.so"
    if not (directory / _DONE).is_file() or not library.is_file():
        return None
    if (why := unsafe(library)) is not None:
        log.warning("not loading the compiled kernel %s: %s; statistics use the torch path. "
                    "Build it in a cache only you can write (python -m hookscope.probes.kernels).",
                    library, why)
        return None
    library = library.resolve()  # the path just checked, whatever links may change later
    if key in _loaded:  # the same build, already loaded from this or another folder
        return _loaded[key]
    try:
        torch.ops.load_library(str(library))
        ops = getattr(torch.ops, _namespace())
        _ = (ops.moments.default, ops.diff_sums.default)  # both ops are in the library
    except (OSError, RuntimeError, AttributeError) as exc:
        warnings.warn(f"hookscope: cannot load the compiled kernel {library} ({exc}); using "
                      "the torch path. Rebuild it with `python -m hookscope.probes.kernels`.",
                      stacklevel=3)
        return None
    _loaded[key] = ops
    return ops


@functools.cache  # asked once per layer call: reading the environment would cost more
def _ops() -> Any:
    return _load(build_dir()) if enabled() else None


def fused() -> MomentsOp | None:
    """The compiled moments op if it is built in the cache and enabled, else None (looked
    up once per process: see :func:`reset`)."""
    ops = _ops()
    # The overload itself: calling it skips the packet's overload resolution (~3 us).
    return None if ops is None else ops.moments.default  # type: ignore[no-any-return]


def fused_diff() -> DiffOp | None:
    """The compiled diff op, like :func:`fused`."""
    ops = _ops()
    return None if ops is None else ops.diff_sums.default  # type: ignore[no-any-return]


def reset() -> None:
    """Forget ``fused()``'s answer, so it reads ``HOOKSCOPE_KERNELS`` and the cache again."""
    _ops.cache_clear()


def build(root: Path | None = None, *, verbose: bool = False) -> Path:
    """Compile the kernel into the cache (a no-op when it is there) and return its folder.

    Raises:
        RuntimeError, OSError: no compiler or ninja, or the compilation failed.
    """
    # Only this logger's import-time note that a CPU-only machine has no CUDA runtime is muted.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils.cpp_extension import load

    directory = build_dir(root)
    for part in reversed([p for p in (directory, *directory.parents) if not p.exists()]):
        part.mkdir(mode=0o700, exist_ok=True)  # writable by this user alone
    if (why := unsafe(directory)) is not None:
        raise RuntimeError(f"refusing to build into {directory}: {why}; choose a cache only "
                           "you can write with HOOKSCOPE_CACHE")
    if _load(directory) is not None:
        return directory
    if cache_key() in _loaded:
        # load() would load a second copy, registering the op's namespace twice.
        raise RuntimeError(f"this kernel is already loaded from another folder; build into "
                           f"{directory} from a fresh process (python -m hookscope.probes.kernels)")
    name = _namespace()
    source = directory / f"{name}.cpp"
    source.write_text(SOURCE.replace("HS_NAMESPACE", name).replace("HS_CLONES", _clones()))
    # load() also loads the library, once, into this process.
    load(name=name, sources=[str(source)], extra_cflags=list(CFLAGS),
         extra_ldflags=list(LDFLAGS), build_directory=str(directory), is_python_module=False,
         verbose=verbose)
    for built in directory.iterdir():  # a umask of 002 must not make the library untrusted
        built.chmod(built.stat().st_mode & ~0o022)
    (directory / _DONE).write_text(f"{time.time():.0f}\n")
    _loaded[cache_key()] = getattr(torch.ops, name)
    reset()
    return directory


def _reason(exc: Exception) -> str:
    """The telling line of a failed build: the first compiler error, else the last line
    that is not ninja's own summary."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and "Error building" not in line]
    others = [line for line in lines if not line.startswith("ninja:")]
    return (errors or others or lines or [type(exc).__name__])[0 if errors else -1]


def main() -> None:
    """``python -m hookscope.probes.kernels``: build the kernel, say where and how long it took."""
    start = time.perf_counter()
    try:
        directory = build(verbose="-v" in sys.argv[1:])
    except Exception as exc:  # any failure leaves the torch path; say why in one line
        print(f"hookscope: kernel not built ({_reason(exc)}); statistics use the torch path.",
              file=sys.stderr)
        raise SystemExit(1) from None
    print(f"hookscope: kernel ready in {directory} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
