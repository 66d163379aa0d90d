"""The layer-health policy, defined once: when a layer (or channel) is dead, and when a
gradient vanishes or explodes."""

from __future__ import annotations

import math

__all__ = ["DEAD", "flag"]

#: A layer or channel whose zero fraction is at least this is dead (a ReLU that never fires).
DEAD = 0.99


def flag(norm: float, nonfinite: int, median: float, vanish: float, explode: float) -> str | None:
    """``nonfinite``, ``vanish`` (``norm`` below ``vanish`` times the ``median`` norm),
    ``explode`` (above ``explode`` times it) or None."""
    if nonfinite:
        return "nonfinite"
    if not (math.isfinite(median) and median > 0 and math.isfinite(norm)):
        return None
    if norm < median * vanish:
        return "vanish"
    if norm > median * explode:
        return "explode"
    return None
