"""The class logits inside a model's output: a tensor, a dict (``{"out", "aux"}``), a tuple,
or a dataclass-like object (Hugging Face's ``.logits``). The one named by ``output_key``,
else ``logits``, else ``out``, else the only tensor; when ambiguous, the error lists them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import Any

import torch

from hookscope.core.errors import HookscopeError, param

__all__ = ["class_logits", "entries", "select_logits", "warn_nonfinite_logits"]

_PREFERRED = ("logits", "out")


def entries(output: Any) -> dict[str, Any]:
    """The named parts of an output: dict items, dataclass or ``ModelOutput`` fields,
    namedtuple fields, or tuple/list positions as ``"0"``, ``"1"``..."""
    if isinstance(output, Mapping):
        return {str(k): v for k, v in output.items()}
    if is_dataclass(output) and not isinstance(output, type):
        return {f.name: getattr(output, f.name) for f in fields(output)}
    if isinstance(output, tuple) and hasattr(output, "_fields"):
        return dict(zip(output._fields, output, strict=True))
    if isinstance(output, (tuple, list)):
        return {str(i): v for i, v in enumerate(output)}
    return {}


def _describe(parts: dict[str, Any]) -> str:
    return ", ".join(f"{key} {list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}"
                     for key, v in parts.items()) or "nothing"


def select_logits(output: Any, key: str | None = None, *,
                  required: bool = True) -> torch.Tensor | None:
    """The tensor of class logits in ``output``: its entry ``key`` (a dict key, field name
    or tuple position), or the one chosen automatically. A missing ``key``, or (when
    ``required``, else None) no single choice, is a :class:`HookscopeError` listing them."""
    if isinstance(output, torch.Tensor) and key is None:
        return output
    parts = entries(output)
    if key is not None:
        value = parts.get(key)
        if not isinstance(value, torch.Tensor):
            raise HookscopeError(
                f"{param('output_key')} {key!r} is not a tensor in the model's output; it "
                f"holds: {_describe(parts)}.")
        return value
    for name in _PREFERRED:
        if isinstance(parts.get(name), torch.Tensor):
            return parts[name]
    found = [v for v in parts.values() if isinstance(v, torch.Tensor)]
    if len(found) == 1:
        return found[0]
    if required:
        raise HookscopeError(
            f"The model returns {type(output).__name__} with {_describe(parts)}; choose the "
            f"class logits with {param('output_key')}.")
    return None


def class_logits(output: Any, key: str | None, analysis: str) -> torch.Tensor:
    """The (N, classes) logits ``analysis`` needs, or a :class:`HookscopeError` saying what
    there was."""
    logits = select_logits(output, key)
    if logits is None or logits.dim() != 2:
        what = type(output).__name__ if logits is None else f"shape {list(logits.shape)}"
        raise HookscopeError(
            f"{analysis} needs a classifier whose output is (N, classes) logits; the model "
            f"returned {what}.")
    return logits


def warn_nonfinite_logits(predictions: Sequence[Sequence[Any] | None], what: str) -> None:
    """One warning when some inputs' logits were not finite (their ``what`` is None)."""
    bad = sum(p is None for p in predictions)
    if bad:
        logging.getLogger("hookscope").warning(
            f"{bad} of {len(predictions)} input(s) have non-finite logits (NaN or Inf): no "
            f"{what} for them (null in JSON).")
