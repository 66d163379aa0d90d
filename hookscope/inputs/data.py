"""The user's own data (``--data FILE.py:NAME``): a map-style ``Dataset``, a ``DataLoader``
or any iterable, as input items that batch, shard and decode in workers like files do.

A map-style data set is read item by item when its batch comes. Any other iterable (an
``IterableDataset``, a generator, a DataLoader, whose batches, made by its own sampler,
collate function and workers, are split back into samples) is read once when the inputs are
resolved, at most ``limit`` items of it, and its items held in memory. Items may be a tensor, a tuple
(positional arguments) or a dict (keyword arguments); the label rule is
:func:`hookscope.core.arguments.split_label`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from hookscope.core.arguments import Arity, arity, is_label, map_tensors, rows, split_label
from hookscope.core.errors import HookscopeError, clip, param
from hookscope.inputs.decode import InputItem, to_rgb
from hookscope.inputs.structure import as_sample

__all__ = ["DataSource"]


def _map_style(obj: Any) -> bool:
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and \
        not isinstance(obj, IterableDataset)


def _unbatched(loader: DataLoader[Any], limit: int | None) -> list[Any]:
    """A DataLoader's batches split back into samples (labels too), at most ``limit``."""
    found: list[Any] = []
    for batch in loader:
        found += [map_tensors(batch, lambda t: t[i] if t.dim() else t)  # noqa: B023 (called at once)
                  for i in range(rows(batch))]
        if limit is not None and len(found) >= limit:
            break
    return found[:limit]


def _first_image(x: Any) -> Image.Image | None:
    if isinstance(x, Image.Image):
        return x
    values = x.values() if isinstance(x, dict) else x if isinstance(x, tuple) else ()
    return next((v for v in values if isinstance(v, Image.Image)), None)


class DataSource:
    """A data set's items; :meth:`bind` it to the model before the first sample is read, so
    the label rule sees the forward's signature."""

    def __init__(self, obj: Any, spec: str, *, limit: int | None = None) -> None:
        self.spec = spec
        self.arity_known: Arity | None = None
        if isinstance(obj, DataLoader) and isinstance(obj.sampler, DistributedSampler):
            raise HookscopeError(f"{param('data')} {spec}: the DataLoader's DistributedSampler "
                                 "shards the data set, and hookscope shards its inputs itself; "
                                 "give it another sampler, or give the data set.")
        if _map_style(obj):
            self.dataset: Sequence[Any] = obj
        elif hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes, torch.Tensor)):
            try:
                self.dataset = _unbatched(obj, limit) if isinstance(obj, DataLoader) else \
                    list(islice(obj, limit))
            except HookscopeError:
                raise
            except Exception as exc:
                raise self._raised("reading it", exc) from None
        else:
            raise HookscopeError(
                f"{param('data')} {spec}: is a {type(obj).__name__}, not a Dataset, a "
                "DataLoader or an iterable of items (nor a callable returning one).")
        if len(self.dataset) == 0:
            raise HookscopeError(f"{param('data')} {spec}: the data set is empty.")

    def _raised(self, what: str, exc: BaseException) -> HookscopeError:
        return HookscopeError(f"{param('data')} {self.spec}: {what} raised "
                              f"{type(exc).__name__}: {clip(str(exc), 200)}.")

    def bind(self, model: nn.Module) -> None:
        """Tell labels from inputs by ``model``'s forward from now on."""
        self.arity_known = arity(model)

    def items(self) -> list[InputItem]:
        """One input item per data set item, named ``SPEC[i]``."""
        return [InputItem(f"{self.spec}[{i}]", "data", index=i) for i in range(len(self.dataset))]

    def _get(self, index: int | None) -> Any:
        try:
            return self.dataset[index or 0]
        except HookscopeError:
            raise
        except Exception as exc:  # the user's __getitem__
            raise self._raised(f"item {index}", exc) from None

    def sample(self, item: InputItem, preprocess: Callable[[Any], torch.Tensor],
               keep_images: bool) -> tuple[Any, Image.Image | None]:
        """The item's inputs as a sample (Pillow images through ``preprocess``), and its
        first image when ``keep_images``."""
        inputs, _ = split_label(self._get(item.index), self.arity_known)
        found = _first_image(inputs)
        return (as_sample(inputs, item.name, preprocess),
                to_rgb(found) if keep_images and found is not None else None)

    def labels(self, indices: Sequence[int | None]) -> list[str] | None:
        """Each item's label as a class index (a string, as class folders are), or None
        when an item has none. A data set's ``targets`` (torchvision's) are used when they
        are one integer per item; else each item is read."""
        targets = getattr(self.dataset, "targets", None)
        if isinstance(targets, (list, torch.Tensor)) and len(targets) == len(self.dataset) \
                and all(is_label(t) for t in targets[:1]):
            return [str(int(targets[i or 0])) for i in indices]
        found = []
        for i in indices:
            label = split_label(self._get(i), self.arity_known)[1]
            if label is None:
                return None
            if isinstance(label, torch.Tensor) and label.numel() != 1:
                raise HookscopeError(f"{self.spec}[{i}]: its label has {label.numel()} values; "
                                     "one class index per item is expected.")
            found.append(str(int(label)))
        return found
