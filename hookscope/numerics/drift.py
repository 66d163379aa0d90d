"""Drift from a baseline: of one number in a scale, and between two saved percentile sets (a
Wasserstein-1 distance).

Each side's quantile function is the piecewise-linear curve through the percentiles both sides
hold (``u = p / 100``); the drift is their mean absolute difference, in A's spread::

    drift = 1 / (u_k - u_1) * ∫_{u_1}^{u_k} |Q_b(u) - Q_a(u)| du / max(std_a, EPS * |mean_a|)

With percentiles 0 and 100 this is the Wasserstein-1 distance in A's standard deviations: a
shift by ``d`` drifts ``d / std_a``. Each linear piece is integrated exactly. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["EPS", "drift", "finite", "quantile_drift", "stat_drift"]

#: The floor of a drift's scale, relative to the mean (a constant layer, std 0, drifts by its
#: change relative to its value), so that rounding does not become an infinite drift.
EPS = 1e-6


def finite(value: Any) -> float | None:
    """A finite number (not a bool) as a float, else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def drift(value: float | None, base: float | None, scale: float) -> float:
    """``|value - base| / max(scale, EPS)``; 0 when both are null, inf when one is."""
    if value is None or base is None:
        return 0.0 if value is None and base is None else math.inf
    return abs(value - base) / max(scale, EPS)


def stat_drift(stat: str, value: Any, base: Mapping[str, Any]) -> float:
    """The drift of a ``mean`` or ``std`` from a baseline row's: a mean's change relative to
    the layer's magnitude, max(|mean|, std), so that a mean near zero does not explode; a
    std's relative to the baseline std itself."""
    mean_b, std_b = finite(base.get("mean")), finite(base.get("std"))
    if stat == "mean":
        return drift(finite(value), mean_b, max(abs(mean_b or 0.0), std_b or 0.0))
    return drift(finite(value), std_b, max(std_b or 0.0, EPS * abs(mean_b or 0.0)))


def _common(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(u, Q_b(u) - Q_a(u)) at each percentile both sides hold a number for, by u."""
    found = []
    for key, value in a.items():
        qa, qb = finite(value), finite(b.get(key))
        try:
            u = float(key) / 100
        except ValueError:
            continue
        if qa is not None and qb is not None:
            found.append((u, qb - qa))
    return sorted(found)


def _piece(d0: float, d1: float) -> float:
    """The mean of |d| over a unit interval where d is linear from d0 to d1."""
    if d0 * d1 >= 0:
        return (abs(d0) + abs(d1)) / 2
    return (d0 * d0 + d1 * d1) / (2 * (abs(d0) + abs(d1)))


def quantile_drift(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None,
                   std: float | None, mean: float | None) -> float | None:
    """The drift of B's percentiles from A's (``{"1": q, "50": q, ...}``), in units of A's
    spread ``max(std, EPS * |mean|)``; None when they share no percentile. A spread of 0 (a
    constant zero layer) gives 0 for no change and inf for any."""
    nodes = _common(a or {}, b or {})
    if not nodes:
        return None
    if len(nodes) == 1 or nodes[-1][0] == nodes[0][0]:
        distance = abs(nodes[0][1])
    else:
        total = sum((u1 - u0) * _piece(d0, d1)
                    for (u0, d0), (u1, d1) in zip(nodes, nodes[1:], strict=False))
        distance = total / (nodes[-1][0] - nodes[0][0])
    scale = max(finite(std) or 0.0, EPS * abs(finite(mean) or 0.0))
    if scale == 0:
        return 0.0 if distance == 0 else math.inf
    return distance / scale
