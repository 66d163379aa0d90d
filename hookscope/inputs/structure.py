"""Samples of any structure: what a tensor file or a data set's item may hold (a tensor, a
tuple of tensors: the forward's positional arguments, a dict: its keyword arguments), checked
once, then sliced into samples and stacked into batches.

Every tensor has the sample dimension first; a sample is the same row of every tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from numbers import Number
from typing import Any

import numpy as np
import torch

from hookscope.core.arguments import describe, map_tensors
from hookscope.core.errors import HookscopeError

__all__ = ["as_arguments", "as_sample", "count", "from_named", "row", "signature", "stack"]


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"a string ({value!r:.30})"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def as_arguments(obj: Any, name: str) -> Any:
    """A tensor file's content as a batch: a tensor, a tuple (from a tuple or list) or a
    dict with string keys, of tensors that agree on their first (sample) dimension.

    Raises:
        HookscopeError: an empty tuple or dict, a value that is no tensor (a string, a
            number, a nested tuple or dict), a 0-d or empty tensor, or tensors that disagree
            on the number of samples.
    """
    if isinstance(obj, torch.Tensor):
        _check_tensor(obj, name)
        return obj
    if isinstance(obj, (tuple, list)):
        values: Sequence[Any] = obj
        where = [f"{name}[{i}]" for i in range(len(obj))]
    elif isinstance(obj, Mapping):
        if not all(isinstance(k, str) for k in obj):
            raise HookscopeError(f"{name}: a dict of inputs needs string keys (the forward's "
                                 "keyword arguments).")
        values, where = list(obj.values()), [f"{name}[{k!r}]" for k in obj]
    else:
        raise HookscopeError(f"{name}: holds {_kind(obj)}, not a tensor, a tuple of tensors "
                             "(positional arguments) or a dict of them (keyword arguments).")
    if not values:
        raise HookscopeError(f"{name}: holds an empty {type(obj).__name__}; give at least one "
                             "tensor.")
    for value, at in zip(values, where, strict=True):
        if not isinstance(value, torch.Tensor):
            raise HookscopeError(f"{at}: is {_kind(value)}; every input must be a tensor with "
                                 "the sample dimension first (nested tuples or dicts are not "
                                 "read).")
        _check_tensor(value, at)
    counts = {int(v.shape[0]) for v in values}
    if len(counts) > 1:
        raise HookscopeError(f"{name}: its tensors disagree on the number of samples (first "
                             f"dimension): {describe(obj)}.")
    return tuple(obj) if isinstance(obj, list) else obj if isinstance(obj, tuple) else dict(obj)


def _check_tensor(t: torch.Tensor, name: str) -> None:
    if t.dim() == 0:
        raise HookscopeError(f"{name}: a 0-d tensor has no sample dimension; save it with "
                             "the samples first, shape (N, ...).")
    if 0 in t.shape:
        raise HookscopeError(f"{name}: tensor shape is {list(t.shape)}; it holds no values.")


def from_named(tensors: dict[str, torch.Tensor]) -> Any:
    """A ``.safetensors`` file's named tensors: names ``0``, ``1``, ... (all of them
    integers, from 0 in order) are positional arguments; other names keyword arguments."""
    names = list(tensors)
    if names and all(n.isdigit() for n in names) and sorted(map(int, names)) == list(range(len(names))):
        return tuple(tensors[str(i)] for i in range(len(names)))
    return tensors


def count(x: Any) -> int:
    """Samples in a checked batch (:func:`as_arguments`)."""
    first = x if isinstance(x, torch.Tensor) else next(iter(x.values() if isinstance(x, dict) else x))
    return int(first.shape[0])


def row(x: Any, i: int) -> Any:
    """Sample ``i`` of a batch, copied (floating-point tensors as float32)."""
    return map_tensors(x, lambda t: t[i].to(torch.float32 if t.is_floating_point() else t.dtype).clone())


def signature(x: Any) -> Any:
    """What must agree for samples to stack: the structure, each tensor's shape and dtype."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype)
    if isinstance(x, dict):
        return tuple((k, signature(v)) for k, v in x.items())
    return tuple(signature(v) for v in x)


def stack(samples: Sequence[Any]) -> Any:
    """Samples of one :func:`signature` stacked into a batch."""
    first = samples[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(list(samples))
    if isinstance(first, dict):
        return {k: torch.stack([s[k] for s in samples]) for k in first}
    return tuple(torch.stack([s[i] for s in samples]) for i in range(len(first)))


def as_sample(value: Any, name: str, image: Callable[[Any], torch.Tensor]) -> Any:
    """One data set item's inputs as a sample: tensors as they are, NumPy arrays and numbers
    as tensors, Pillow images through ``image`` (the model's preprocessing); a tuple or list
    is positional arguments, a dict keyword arguments.

    Raises:
        HookscopeError: a value of another type (a string, None, a nested container).
    """
    def leaf(v: Any, at: str) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, np.ndarray) and v.dtype.kind in "biufc":
            return torch.from_numpy(np.ascontiguousarray(v))
        if isinstance(v, Number) and not isinstance(v, complex):
            return torch.tensor(v)
        if type(v).__module__.startswith("PIL."):
            return image(v)
        raise HookscopeError(f"{at}: is {_kind(v)}; data items hold tensors, arrays, numbers "
                             "or images, alone, in a tuple or in a dict.")

    if isinstance(value, (tuple, list)):
        if not value:
            raise HookscopeError(f"{name}: is an empty {type(value).__name__}.")
        return tuple(leaf(v, f"{name}[{i}]") for i, v in enumerate(value))
    if isinstance(value, Mapping):
        if not value:
            raise HookscopeError(f"{name}: is an empty dict.")
        return {str(k): leaf(v, f"{name}[{k!r}]") for k, v in value.items()}
    return leaf(value, name)
