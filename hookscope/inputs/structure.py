"""Samples of any structure: what a tensor file or a data set's item may hold (a tensor, a
tuple of tensors: the forward's positional arguments, a dict: its keyword arguments), checked
once, then sliced into samples and stacked into batches. A tuple, list or dict may hold
further tuples, lists and dicts of tensors (a model's nested arguments).

Every tensor has the sample dimension first; a sample is the same row of every tensor, and a
0-d tensor, a number, a bool or None (a ``scale=0.5``, a ``mask=None``) is in every sample as
it is. A file read ``--as-is`` is one forward's arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Number
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from hookscope.core.arguments import describe
from hookscope.core.errors import HookscopeError, param

__all__ = ["Fixed", "as_arguments", "as_sample", "count", "from_named", "row", "signature", "stack", "whole"]


#: What a tensor file may hold beside its tensors, given to every batch as it is.
_CONSTANT = (Number, type(None))


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"a string ({value!r:.30})"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


@dataclass(frozen=True)
class Fixed:
    """A value every batch takes as it is, not sliced nor stacked: a tensor file's 0-d
    tensor or constant (the same for every sample), or any value of a file read whole
    (``--as-is``); ``source`` its file. A whole file's batches never group with others."""

    value: Any
    source: str
    whole: bool = False


def as_arguments(obj: Any, name: str, *, whole: bool = False) -> Any:
    """A tensor file's content as a batch: a tensor, a tuple (from a tuple or list) or a
    dict with string keys, of tensors or of tuples, lists and dicts of them, nested to any
    depth. Tensors of one or more dimensions agree on their first (sample) dimension; 0-d
    tensors and constants (numbers, bools, None) are in every sample as they are.
    ``whole``: the content is one forward's arguments as they are (``--as-is``), so no
    sample dimension is checked."""
    if not isinstance(obj, (torch.Tensor, tuple, list, Mapping)):
        raise HookscopeError(f"{name}: holds {_kind(obj)}, not a tensor, a tuple of tensors "
                             "(positional arguments) or a dict of them (keyword arguments).")
    if isinstance(obj, Mapping) and not all(isinstance(k, str) for k in obj):
        raise HookscopeError(f"{name}: a dict of inputs needs string keys (the forward's "
                             "keyword arguments).")
    leaves, _ = pytree.tree_flatten_with_path(obj)
    for path, value in leaves:
        at = name + pytree.keystr(path)
        if not isinstance(value, (torch.Tensor, *_CONSTANT)) or isinstance(value, complex):
            raise HookscopeError(f"{at}: is {_kind(value)}; every input must be a tensor, a "
                                 "number or None (in tuples, lists and dicts of any depth).")
        if isinstance(value, torch.Tensor) and 0 in value.shape:
            raise HookscopeError(f"{at}: tensor shape is {list(value.shape)}; it holds no values.")
    found = [(path, v) for path, v in leaves if isinstance(v, torch.Tensor)]
    if not found:
        raise HookscopeError(f"{name}: holds no tensor ({describe(obj)}); give at least one.")
    counts = {int(t.shape[0]) for _, t in found if t.dim()}
    if not whole and not counts:
        raise HookscopeError(f"{name}: holds only 0-d tensors, which have no sample dimension; "
                             f"save the samples first, shape (N, ...), or pass {param('as_is')}.")
    if not whole and len(counts) > 1:
        raise HookscopeError(f"{name}: its tensors disagree on the number of samples (first "
                             f"dimension): {describe(obj)}; for tensors whose samples are not "
                             f"first, pass {param('as_is')}.")
    return tuple(obj) if isinstance(obj, list) else dict(obj) if isinstance(obj, Mapping) else obj


def from_named(tensors: dict[str, torch.Tensor]) -> Any:
    """A ``.safetensors`` file's named tensors: names ``0``, ``1``, ... (all of them
    integers, from 0 in order) are positional arguments; other names keyword arguments."""
    names = list(tensors)
    if names and all(n.isdigit() for n in names) and sorted(map(int, names)) == list(range(len(names))):
        return tuple(tensors[str(i)] for i in range(len(names)))
    return tensors


def count(x: Any) -> int:
    """Samples in a checked batch (:func:`as_arguments`): its first tensor of one or more
    dimensions' first dimension."""
    return int(next(t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor) and t.dim()).shape[0])


def row(x: Any, i: int, source: str) -> Any:
    """Sample ``i`` of a batch from file ``source``, copied (floating-point tensors as
    float32); its 0-d tensors and constants :class:`Fixed`."""
    return pytree.tree_map(lambda t: Fixed(t, source) if not isinstance(t, torch.Tensor) or not t.dim()
                           else t[i].to(torch.float32 if t.is_floating_point() else t.dtype).clone(), x)


def whole(x: Any, source: str) -> Any:
    """A file read whole (``--as-is``) as one sample: every value :class:`Fixed`."""
    return pytree.tree_map(lambda t: Fixed(t, source, whole=True), x)


def signature(x: Any) -> Any:
    """What must agree for samples to stack: the structure, each tensor's shape and dtype,
    and a :class:`Fixed` value's file (a whole file's agrees with nothing)."""
    leaves, spec = pytree.tree_flatten(x)
    return spec, [object() if isinstance(v, Fixed) and v.whole else
                  (v.source, _described(v.value)) if isinstance(v, Fixed) else
                  (tuple(v.shape), v.dtype) for v in leaves]


def _described(value: Any) -> Any:
    """A fixed value's part of a signature: a tensor's shape and dtype, a constant itself."""
    return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else value


def stack(samples: Sequence[Any]) -> Any:
    """Samples of one :func:`signature` stacked into a batch (a :class:`Fixed` tensor as it
    is)."""
    columns = zip(*(pytree.tree_leaves(s) for s in samples), strict=True)
    return pytree.tree_unflatten([c[0].value if isinstance(c[0], Fixed) else torch.stack(list(c))
                                  for c in columns], pytree.tree_structure(samples[0]))


def as_sample(value: Any, name: str, image: Callable[[Any], torch.Tensor]) -> Any:
    """One data set item's inputs as a sample: tensors as they are, NumPy arrays and numbers
    as tensors, Pillow images through ``image`` (the model's preprocessing); a tuple or list
    is positional arguments, a dict keyword arguments, and either may hold further tuples,
    lists and dicts of them, to any depth (a model's nested arguments)."""
    def leaf(path: Any, v: Any) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, np.ndarray) and v.dtype.kind in "biufc":
            return torch.from_numpy(np.ascontiguousarray(v))
        if isinstance(v, Number) and not isinstance(v, complex):
            return torch.tensor(v)
        if type(v).__module__.startswith("PIL."):
            return image(v)
        raise HookscopeError(f"{name}{pytree.keystr(path)}: is {_kind(v)}; data items hold "
                             "tensors, arrays, numbers or images, alone or in tuples, lists "
                             "and dicts.")

    if isinstance(value, (tuple, list, Mapping)) and not value:
        kind = "dict" if isinstance(value, Mapping) else type(value).__name__
        raise HookscopeError(f"{name}: is an empty {kind}.")
    if isinstance(value, Mapping):
        value = {str(k): v for k, v in value.items()}
    elif isinstance(value, list):
        value = tuple(value)
    return pytree.tree_map_with_path(leaf, value)
