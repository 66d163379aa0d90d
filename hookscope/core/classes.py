"""Class-index resolution, the one place a class label, index, rank (``top1``, ``topK``) or
ImageFolder class folder becomes a class index: for ``target``, ``label``, Grad-CAM, training
and check rules alike.

One spec applies to every input, or a comma list gives exactly one per input (never
truncated or recycled). Errors name the parameter.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import TYPE_CHECKING, Any

from hookscope.core.errors import HookscopeError, param, suggest

if TYPE_CHECKING:
    import torch

__all__ = ["Targets", "as_targets", "label_classes", "parse_targets", "true_classes"]


def label_classes(label: str, categories: Sequence[str] | None) -> tuple[int, ...]:
    """Every class whose label is ``label`` in any case (ImageNet has two "crane"s)."""
    folded = label.casefold()
    return tuple(i for i, c in enumerate(categories or ()) if c.casefold() == folded)


@dataclass(frozen=True)
class Targets:
    """Each entry a class index or a rank such as ``top1``; ``name`` is the parameter they
    were given as, for error messages, unless they come from ``folders`` (each input's class
    folder; ``by_order``: numbered in sorted order)."""

    entries: tuple[int | str, ...]
    name: str = "target"
    folders: tuple[str, ...] = ()
    by_order: bool = False

    @property
    def per_input(self) -> bool:
        return len(self.entries) > 1

    @property
    def ranks(self) -> bool:
        """Whether any entry is a rank (``topK``) rather than a class."""
        return any(isinstance(e, str) for e in self.entries)

    def check_count(self, n_inputs: int) -> None:
        """Raise unless there is one entry for all inputs or exactly one per input."""
        if self.per_input and len(self.entries) != n_inputs:
            raise HookscopeError(
                f"{param(self.name)} lists {len(self.entries)} {self.name}s for {n_inputs} "
                f"input(s); give one {self.name} for all inputs or exactly one per input.")

    def check_batch(self, start: int, rows: int) -> None:
        """Raise if a batch of ``rows`` inputs from input number ``start`` runs past the
        entries (a later batch may still come: the total is checked by :meth:`check_count`)."""
        if self.per_input and start + rows > len(self.entries):
            self.check_count(start + rows)

    def resolve(self, logits: torch.Tensor, start: int = 0,
                ranked: torch.Tensor | None = None) -> list[int]:
        """Class indices for the rows of ``logits``, the first being input number ``start``;
        ``ranked`` (N, classes) orders each row's classes for ``topK`` (default: by logit)."""
        rows, classes = logits.shape[0], logits.shape[1]
        self.check_batch(start, rows)
        ranks = [int(e[3:]) for e in self.entries if isinstance(e, str)]
        if ranks and ranked is None:
            ranked = logits.detach().topk(min(max(ranks), classes), dim=1).indices
        chosen: list[int] = []
        for row in range(rows):
            entry = self.entries[start + row] if self.per_input else self.entries[0]
            if isinstance(entry, int):
                if not 0 <= entry < classes:
                    raise HookscopeError(self._out_of_range(entry, classes, start + row))
                chosen.append(entry)
                continue
            k = int(entry[3:])
            if k > classes or ranked is None:
                raise HookscopeError(
                    f"{param(self.name)} {entry}: the model has only {classes} classes.")
            chosen.append(int(ranked[row, k - 1]))
        return chosen

    def _out_of_range(self, entry: int, classes: int, index: int) -> str:
        has = f"the model has {classes} classes (0 to {classes - 1})"
        if not self.folders:
            return f"{param(self.name)} {entry} is out of range: {has}."
        folder = self.folders[index if self.per_input else 0]
        order = " (the class folders in sorted order)" if self.by_order else ""
        return (f"class folder {folder!r} is class {entry}{order}, out of range: {has}, and each "
                f"input's class comes from its class folder's name; give {param('label')}, or "
                "one class folder per class of the model.")


def _entry(item: str, name: str, categories: Sequence[str] | None) -> int | str:
    low = item.lower()
    if low.startswith("top") and low[3:].isdigit():
        if int(low[3:]) < 1:
            raise HookscopeError(f"{param(name)} {item!r}: ranks start at top1 (the top class).")
        return low
    if item.lstrip("-").isdigit():
        index = int(item)
        if index < 0:
            raise HookscopeError(f"{param(name)} {item}: class indices start at 0.")
        return index
    hits = label_classes(item, categories)
    if hits:
        return hits[-1]
    if categories:
        raise HookscopeError(
            f"{param(name)} {item!r} is not a class label of this model."
            f"{suggest(item, categories)}")
    raise HookscopeError(
        f"{param(name)} {item!r}: this model has no class labels; use a class index or topK "
        "(or give labels).")


def parse_targets(spec: str | None, categories: Sequence[str] | None, *,
                  name: str = "target", n_inputs: int | None = None) -> Targets:
    """Parse ``top1`` (the default), ``topK``, an index, a label in ``categories``, or a
    comma list of them, given as the parameter ``name`` (with ``n_inputs``, checked against
    that many inputs); an unknown label (with close matches) or a malformed entry is a
    :class:`HookscopeError`."""
    text = (spec or "top1").strip()
    entries: list[int | str] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise HookscopeError(f"{param(name)} {text!r} has an empty entry.")
        entries.append(_entry(item, name, categories))
    targets = Targets(tuple(entries), name)
    if n_inputs is not None:
        targets.check_count(n_inputs)
    return targets


def as_targets(target: Any, categories: Sequence[str] | None) -> Targets:
    """:class:`Targets` from what the Python API takes: None (top-1), an index, a spec such
    as ``"top2"`` or ``"tabby"``, a list or tensor of indices or labels, or Targets."""
    if isinstance(target, Targets):
        return target
    if target is None or isinstance(target, str):
        return parse_targets(target, categories)
    import torch  # here: check rules read class labels without torch

    if isinstance(target, torch.Tensor):
        target = target.reshape(-1).tolist()
    elif isinstance(target, Integral) and not isinstance(target, bool):
        target = [target]
    return parse_targets(",".join(str(int(t) if not isinstance(t, str) else t) for t in target),
                         categories)


def true_classes(label: str | None, folders: Sequence[str] | None,
                 categories: Sequence[str] | None, *, by_order: bool = False) -> Targets | None:
    """The true class of each input: ``label`` as given, else each input's ImageFolder class
    folder, a class label of the model (in any case) or a class index; None when there is
    neither. With ``by_order``, a model without labels numbers its folders in sorted order,
    as torchvision's ImageFolder. A folder naming no class is a :class:`HookscopeError`."""
    if label is not None:
        return parse_targets(label, categories, name="label")
    if folders is None:
        return None
    if by_order and not categories and not all(f.isdigit() for f in folders):
        order = {name: i for i, name in enumerate(sorted(set(folders)))}
        logging.getLogger("hookscope").info(
            "classes by folder, sorted: %s", ", ".join(f"{k}={v}" for k, v in order.items()))
        return Targets(tuple(order[f] for f in folders), "label", tuple(folders), by_order=True)
    classes: dict[str, int] = {}
    for folder in dict.fromkeys(folders):
        hits = label_classes(folder, categories)
        if not folder.isdigit() and not hits:
            known = "is not a class label of this model." + suggest(folder, categories) \
                if categories else "names no class: this model has no class labels."
            raise HookscopeError(
                f"class folder {folder!r} {known} Name the folders after the model's labels "
                f"or class indices, give labels that match them with {param('labels')}, or "
                f"give {param('label')}.")
        classes[folder] = int(folder) if folder.isdigit() else hits[-1]
    return Targets(tuple(classes[f] for f in folders), "label", tuple(folders))
