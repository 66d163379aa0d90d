"""Which output class a method explains: ``top1``, ``topK``, a class index or a label.

One spec applies to every input, or a comma list gives exactly one per input (never
truncated or recycled). Parses ``target`` and ``label``, errors naming which."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import torch

from hookscope.core.errors import HookscopeError, param, suggest

__all__ = ["Targets", "folder_targets", "parse_targets"]


@dataclass(frozen=True)
class Targets:
    """Each entry a class index or a rank such as ``top1``; ``name`` is the parameter they
    were given as, for error messages."""

    entries: tuple[int | str, ...]
    name: str = "target"

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

    def resolve(self, logits: torch.Tensor, start: int = 0) -> list[int]:
        """Class indices for the rows of ``logits``, the first being input number ``start``."""
        rows, classes = logits.shape[0], logits.shape[1]
        self.check_batch(start, rows)
        ranks = [int(e[3:]) for e in self.entries if isinstance(e, str)]
        ranked = logits.detach().topk(min(max(ranks), classes), dim=1).indices if ranks else None
        chosen: list[int] = []
        for row in range(rows):
            entry = self.entries[start + row] if self.per_input else self.entries[0]
            if isinstance(entry, int):
                if not 0 <= entry < classes:
                    raise HookscopeError(
                        f"{param(self.name)} {entry} is out of range: the model has {classes} "
                        f"classes (0 to {classes - 1}).")
                chosen.append(entry)
                continue
            k = int(entry[3:])
            if k > classes or ranked is None:
                raise HookscopeError(
                    f"{param(self.name)} {entry}: the model has only {classes} classes.")
            chosen.append(int(ranked[row, k - 1]))
        return chosen


def _entry(item: str, name: str, lookup: dict[str, int],
           categories: Sequence[str] | None) -> int | str:
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
    if low in lookup:
        return lookup[low]
    if categories:
        raise HookscopeError(
            f"{param(name)} {item!r} is not a class label of this model."
            f"{suggest(item, categories)}")
    raise HookscopeError(
        f"{param(name)} {item!r}: this model has no class labels; use a class index or topK "
        "(or give labels).")


def parse_targets(spec: str | None, categories: Sequence[str] | None, *,
                  name: str = "target") -> Targets:
    """Parse ``top1`` (the default), ``topK``, an index, a label in ``categories``, or a
    comma list of them, given as the parameter ``name``; an unknown label (with close
    matches) or a malformed entry is a :class:`HookscopeError`."""
    text = (spec or "top1").strip()
    lookup = {c.lower(): i for i, c in enumerate(categories or [])}
    entries: list[int | str] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise HookscopeError(f"{param(name)} {text!r} has an empty entry.")
        entries.append(_entry(item, name, lookup, categories))
    return Targets(tuple(entries), name)


def folder_targets(folders: Sequence[str], categories: Sequence[str] | None, *,
                   name: str = "label") -> Targets:
    """One class per input from its ImageFolder class folder: a class label of the model (in
    any case) or a class index; a folder naming no class is a :class:`HookscopeError`."""
    lookup = {c.lower(): i for i, c in enumerate(categories or [])}
    classes: dict[str, int] = {}
    for folder in dict.fromkeys(folders):
        if folder.isdigit():
            classes[folder] = int(folder)
        elif folder.lower() in lookup:
            classes[folder] = lookup[folder.lower()]
        else:
            known = "is not a class label of this model." + suggest(folder, categories) \
                if categories else "names no class: this model has no class labels."
            raise HookscopeError(
                f"class folder {folder!r} {known} Name the folders after the model's labels "
                f"or class indices, give labels that match them with {param('labels')}, or "
                f"give {param(name)}.")
    return Targets(tuple(classes[f] for f in folders), name)


def as_targets(target: Any, categories: Sequence[str] | None) -> Targets:
    """:class:`Targets` from what the Python API takes: None (top-1), an index, a spec such
    as ``"top2"`` or ``"tabby"``, a list or tensor of indices or labels, or Targets."""
    if isinstance(target, Targets):
        return target
    if target is None or isinstance(target, str):
        return parse_targets(target, categories)
    if isinstance(target, torch.Tensor):
        target = target.reshape(-1).tolist()
    elif isinstance(target, Integral) and not isinstance(target, bool):
        target = [target]
    return parse_targets(",".join(str(int(t) if not isinstance(t, str) else t) for t in target),
                         categories)
