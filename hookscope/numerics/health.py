"""The layer-health policy, defined once: when a layer (or channel) is dead, and when a
gradient vanishes or explodes (docs/watch.md, "Layer flags")."""

from __future__ import annotations

import math

__all__ = ["CHANGE", "DEAD", "EXPLODE", "SUSTAINED", "VANISH", "flag", "grad_flags", "sensitivity"]

#: A layer or channel whose zero fraction is at least this is dead (a ReLU that never fires).
DEAD = 0.99
#: A training gradient vanished when its sensitivity (:func:`sensitivity`) is below this...
VANISH = 1e-4
#: ...and exploded when it is above this,
EXPLODE = 1e6
#: or when it fell or rose by more than this factor from the call's first logged value.
CHANGE = 1e3
#: A drift is a finding when the call was flagged at each of this many last logging steps.
SUSTAINED = 3


def flag(norm: float, nonfinite: int, median: float, vanish: float, explode: float) -> str | None:
    """``nonfinite``, ``vanish`` (``norm`` below ``vanish`` times the ``median`` norm),
    ``explode`` (above ``explode`` times it) or None: ``grads``' flag of one backward pass."""
    if nonfinite:
        return "nonfinite"
    if not (math.isfinite(median) and median > 0 and math.isfinite(norm)):
        return None
    if norm < median * vanish:
        return "vanish"
    if norm > median * explode:
        return "explode"
    return None


def sensitivity(grad_norm: float, output_norm: float, loss: float | None) -> float:
    """‖∂L/∂y‖·‖y‖ / |L|: the most the loss changes, relative to itself, when the call's
    output ``y`` changes by 100% (to first order; in loss units when the loss is unknown or
    0). It is the same at every depth of a network of ReLUs and linear layers, and does not
    depend on the batch size, the width or a loss averaged or summed over the batch."""
    scale = abs(loss) if loss is not None and math.isfinite(loss) and loss != 0 else 1.0
    return grad_norm * output_norm / scale


def grad_flags(norm: float | None, sens: float | None, first: float | None) -> list[str]:
    """A training gradient's flags: ``zero_grad`` (a gradient arrived, all zeros), ``vanish``
    or ``explode``, by :data:`VANISH` and :data:`EXPLODE` or by a change of more than
    :data:`CHANGE` from the call's ``first`` logged sensitivity."""
    if norm == 0:
        return ["zero_grad"]
    if sens is None or not math.isfinite(sens):
        return []
    low, high = VANISH, EXPLODE
    if first is not None and math.isfinite(first) and first > 0:
        low, high = max(low, first / CHANGE), min(high, first * CHANGE)
    return ["vanish"] if sens < low else ["explode"] if sens > high else []
