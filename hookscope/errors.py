"""The one exception family the library raises for things a user can fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class HookscopeError(Exception):
    """A problem with the user's input, printed as one line and exit code 2.

    The message says what went wrong, which file or name, and what to do.
    """

    exit_code = 2


class CheckFailed(HookscopeError):
    """A check the user asked for failed (for example ``--fail-on-nonfinite``): exit code 1."""

    exit_code = 1


class ForwardError(HookscopeError):
    """The model raised inside a module during the forward pass."""

    def __init__(self, message: str, *, module: str | None = None, type_name: str | None = None,
                 input_shapes: list | None = None, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.module = module
        self.type_name = type_name
        self.input_shapes = input_shapes
        self.cause = cause


def suggest(word: str, candidates: Iterable[str], n: int = 3) -> str:
    """Return ``" Did you mean: a, b?"`` for the closest candidates, or an empty string."""
    pool = list(candidates)
    close = difflib.get_close_matches(word, pool, n=n, cutoff=0.5)
    if not close:
        low = word.lower()
        close = [c for c in pool if low and low in c.lower()][:n]
    return f" Did you mean: {', '.join(close)}?" if close else ""
