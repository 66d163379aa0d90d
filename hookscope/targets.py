"""Which output class a method explains: ``top1``, ``topK``, a class index or a label.

One spec applies to every input, or a comma list gives one per input; a list whose length
does not match the number of inputs is an error (never truncated or recycled).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hookscope.errors import HookscopeError, suggest


@dataclass(frozen=True)
class Targets:
    """Parsed ``--target``: each entry is a class index (int) or a rank such as ``top1``."""

    entries: tuple[int | str, ...]
    text: str = "top1"

    @property
    def per_input(self) -> bool:
        return len(self.entries) > 1

    def check_count(self, n_inputs: int) -> None:
        """Raise unless there is one entry for all inputs or exactly one per input."""
        if self.per_input and len(self.entries) != n_inputs:
            raise HookscopeError(
                f"--target lists {len(self.entries)} targets for {n_inputs} input(s); give one "
                "target for all inputs or exactly one per input."
            )

    def resolve(self, logits: torch.Tensor, start: int = 0) -> list[int]:
        """Class indices for the rows of ``logits``, the first being input number ``start``."""
        rows = logits.shape[0]
        chosen: list[int] = []
        ranked = None
        for row in range(rows):
            entry = self.entries[start + row] if self.per_input else self.entries[0]
            if isinstance(entry, int):
                if not 0 <= entry < logits.shape[1]:
                    raise HookscopeError(
                        f"--target {entry} is out of range: the model has {logits.shape[1]} "
                        "classes."
                    )
                chosen.append(entry)
            else:
                k = int(entry[3:])
                if k > logits.shape[1]:
                    raise HookscopeError(
                        f"--target {entry}: the model has only {logits.shape[1]} classes."
                    )
                if ranked is None:
                    ranked = logits.detach().topk(min(k_max(self.entries), logits.shape[1]),
                                                  dim=1).indices
                chosen.append(int(ranked[row, k - 1]))
        return chosen


def k_max(entries: Sequence[int | str]) -> int:
    return max((int(e[3:]) for e in entries if isinstance(e, str)), default=1)


def parse_targets(spec: str | None, categories: Sequence[str] | None) -> Targets:
    """Parse ``--target``: ``top1`` (default), ``topK``, an index, a label, or a comma list.

    Raises:
        HookscopeError: an unknown label (with close matches) or a malformed entry.
    """
    text = (spec or "top1").strip()
    lookup = {c.lower(): i for i, c in enumerate(categories or [])}
    entries: list[int | str] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise HookscopeError(f"--target {text!r} has an empty entry.")
        low = item.lower()
        if low.startswith("top") and low[3:].isdigit() and int(low[3:]) >= 1:
            entries.append(low)
        elif item.lstrip("-").isdigit():
            index = int(item)
            if index < 0:
                raise HookscopeError(f"--target {item}: class indices start at 0.")
            entries.append(index)
        elif low in lookup:
            entries.append(lookup[low])
        elif categories:
            raise HookscopeError(
                f"--target {item!r} is not a class label of these weights."
                f"{suggest(item, categories)}"
            )
        else:
            raise HookscopeError(
                f"--target {item!r}: these weights have no class labels; use an index or topK."
            )
    return Targets(tuple(entries), text)
