"""A batch is the forward's arguments: a tensor, a tuple (positional arguments) or a dict
(keyword arguments; or the one argument of a ``forward(batch)`` that takes none of its keys)
of tensors, each with the sample dimension first. The helpers here map,
slice and describe such batches, call the model with them, and tell a label from an input.

The label rule, for the items of a data set (``--data``) or a DataLoader's batches: an item
``(x, y)`` whose ``y`` is an int (or an integer tensor of at most one dimension) is an input
and its label when the forward takes exactly one required positional argument, or takes no
more positional arguments than the item has without ``y``. A dict item's ``label`` or
``labels`` key is the label when the forward has no parameter of that name (nor ``**kwargs``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from numbers import Integral
from typing import Any

import torch
from torch import nn

from hookscope.core.errors import HookscopeError, param
from hookscope.core.hooks import tensors

__all__ = ["Arity", "Placement", "arity", "call", "describe", "expand", "first_float", "image_size",
           "is_label", "map_tensors", "placement", "rows", "split_label", "take", "takes_nothing"]

LABEL_KEYS = ("label", "labels")


def map_tensors(x: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``x`` with ``fn`` applied to every tensor of a tensor, tuple, list or dict."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(map_tensors(v, fn) for v in x)
    if isinstance(x, Mapping):
        return {k: map_tensors(v, fn) for k, v in x.items()}
    return x


def rows(x: Any) -> int:
    """The number of samples in a batch: its first tensor of one or more dimensions' first
    dimension (1 for none)."""
    first = next((t for t in tensors(x) if t.dim()), None)
    return 1 if first is None else int(first.shape[0])


def take(x: Any, index: slice) -> Any:
    """The same rows ``index`` of every tensor of a batch."""
    return map_tensors(x, lambda t: t[index] if t.dim() else t)


def expand(x: Any, k: int) -> Any:
    """A one-sample batch repeated ``k`` times (one contiguous copy per tensor)."""
    return map_tensors(x, lambda t: t.expand(k, *t.shape[1:]).contiguous() if t.dim() else t)


def first_float(x: Any) -> torch.Tensor | None:
    """The first floating-point tensor of a batch: "the image" where a command needs one."""
    return next((t for t in tensors(x) if t.is_floating_point()), None)


def image_size(x: Any) -> tuple[int, int]:
    """(height, width) of a batch's image (its first floating-point tensor of three or more
    dimensions: its last two), or (0, 0) when it has none."""
    image = first_float(x)
    if image is None or image.dim() < 3:
        return (0, 0)
    return (int(image.shape[-2]), int(image.shape[-1]))


def _drawable(t: Any) -> bool:
    """A tensor a CAM can be drawn on: an image batch (N, C, H, W), or a floating-point
    signal (N, C, L) or volume or clip (N, C, D, H, W) batch."""
    return isinstance(t, torch.Tensor) and (t.dim() == 4 or (t.dim() in (3, 5) and t.is_floating_point()))


class Placement:
    """Where in a batch the input a CAM is drawn on lies (``overlay``), and the batch with
    that input replaced (:meth:`put`); the other inputs are held as they are."""

    def __init__(self, x: Any, key: int | str | None, shown: torch.Tensor) -> None:
        self.x, self.key, self.shown = x, key, shown

    def put(self, t: torch.Tensor, rows: Sequence[int] | None = None) -> Any:
        """The batch with the drawn input ``t``, its row j the sample ``rows[j]`` (None: the
        batch's own rows), the other inputs' rows picked to match."""
        if self.key is None:
            return t
        if rows is not None:
            index = torch.tensor(list(rows), dtype=torch.long)
            others = map_tensors(self.x, lambda v: v[index.to(v.device)] if v.dim() else v)
        else:
            others = self.x
        if isinstance(others, Mapping):
            return {**others, self.key: t}
        found = list(others)
        found[int(self.key)] = t
        return tuple(found)


def placement(x: Any, overlay: int | str | None = None) -> Placement:
    """The input of batch ``x`` a CAM is drawn on: ``overlay`` (a positional argument's
    index, or a keyword argument's name), else the first that :func:`_drawable` accepts
    (HookscopeError: no such input, or one a CAM cannot be drawn on)."""
    what = ("a floating-point image (N, C, H, W), signal (N, C, L) or volume or clip "
            "(N, C, D, H, W) batch")
    if isinstance(x, torch.Tensor):
        if _drawable(x) and overlay in (None, 0, "0"):
            return Placement(x, None, x)
        raise HookscopeError(f"A CAM is drawn on {what}; the input is {describe(x)}.")
    keyed = list(x.items()) if isinstance(x, Mapping) else list(enumerate(x))
    if overlay is None:
        found = next(((k, v) for k, v in keyed if _drawable(v)), None)
        if found is None:
            raise HookscopeError(f"A CAM is drawn on {what}; none of the inputs {describe(x)} "
                                 "is one.")
        return Placement(x, *found)
    key: int | str = int(overlay) if not isinstance(x, Mapping) and str(overlay).isdigit() else overlay
    value = dict(keyed).get(key)
    if not _drawable(value):
        names = ", ".join(map(str, dict(keyed)))
        raise HookscopeError(f"{param('overlay_input')} {overlay}: " + (
            f"the inputs are {names}." if value is None else
            f"is {describe(value)}; a CAM is drawn on {what}."))
    assert isinstance(value, torch.Tensor)  # _drawable
    return Placement(x, key, value)


def call(model: nn.Module, x: Any) -> Any:
    """``model(*x)`` for a tuple, ``model(**x)`` for a dict (but ``model(x)`` where the
    forward takes one required positional argument and none of the dict's keys, a
    ``forward(batch)``), else ``model(x)``."""
    if isinstance(x, tuple):
        return model(*x)
    if isinstance(x, Mapping) and not _one_dict_argument(model, x):
        return model(**x)
    return model(x)


def _one_dict_argument(model: nn.Module, x: Mapping[str, Any]) -> bool:
    """Whether the dict ``x`` is ``model``'s one positional argument, not its keywords."""
    found = arity(model)
    return found is not None and found[0] == 1 and not found[3] and not found[2] & set(x)


def describe(x: Any) -> str:
    """A batch in a few words: ``(2, 3, 8, 8) float32`` or ``(ids: (2, 5) int64, ...)``."""
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}"
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(describe(v) for v in x) + ")"
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k}: {describe(v)}" for k, v in x.items()) + "}"
    return type(x).__name__


Arity = tuple[int, float, frozenset[str], bool]  # required, most positional, names, **kwargs


def arity(model: nn.Module) -> Arity | None:
    """What ``model.forward`` takes: its required positional parameters, the most positional
    ones (inf with ``*args``), its parameter names, and whether it takes ``**kwargs``; None
    when it has no signature."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None
    kinds = inspect.Parameter
    positional = [p for p in sig.parameters.values()
                  if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is kinds.empty for p in positional)
    most = float("inf") if any(p.kind is kinds.VAR_POSITIONAL for p in sig.parameters.values()) \
        else float(len(positional))
    var_kw = any(p.kind is kinds.VAR_KEYWORD for p in sig.parameters.values())
    return required, most, frozenset(sig.parameters), var_kw


def takes_nothing(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes no positional argument (``forward(self)``)."""
    found = arity(model)
    return found is not None and found[1] == 0


def is_label(v: Any) -> bool:
    """An int (not a bool) or an integer tensor of at most one dimension."""
    if isinstance(v, torch.Tensor):
        return v.dim() <= 1 and not v.is_floating_point() and not v.is_complex() \
            and v.dtype is not torch.bool
    return isinstance(v, Integral) and not isinstance(v, bool)


def split_label(item: Any, model_arity: Arity | None) -> tuple[Any, Any]:
    """``(inputs, label)`` of one data item or batch by the rule in this module's docstring
    (label None when it has none; HookscopeError: the last element could be a label or an
    input)."""
    if isinstance(item, Mapping):
        names, var_kw = (model_arity[2], model_arity[3]) if model_arity else (frozenset(), True)
        key = next((k for k in LABEL_KEYS if k in item and k not in names and not var_kw), None)
        if key is None:
            return item, None
        return {k: v for k, v in item.items() if k != key}, item[key]
    if not isinstance(item, (tuple, list)) or len(item) < 2 or not is_label(item[-1]):
        return (tuple(item) if isinstance(item, list) else item), None
    required, most = (model_arity[0], model_arity[1]) if model_arity else (1, 1.0)
    inputs = tuple(item[:-1])
    if required == 1 and len(item) == 2 or len(item) > most >= len(inputs) >= required:
        return inputs[0] if len(inputs) == 1 else inputs, item[-1]
    if len(item) <= most and len(item) >= required and len(inputs) < required:
        return tuple(item), None
    raise HookscopeError(
        f"Each data item is {len(item)} values whose last is an integer, and the model's "
        f"forward takes {required} required positional argument(s) (at most "
        f"{most:g}), so it could be a label or an input; give items as dicts of keyword "
        "arguments (a 'label' key for the label), or (input, label) pairs.")
