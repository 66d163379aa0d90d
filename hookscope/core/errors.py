"""The one exception family the library raises for things a user can fix. Messages mark the
Python API's parameters with :func:`param`, which the command line renders as its flags."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal styles in a library's message
_MARK = "\x1f"  # a control character: repr() escapes it, so user data cannot fake a mark
_MARKED = re.compile(f"{_MARK}([A-Za-z_][A-Za-z0-9_]*){_MARK}")


def param(name: str) -> str:
    """Mark the API parameter ``name`` inside an error message."""
    return f"{_MARK}{name}{_MARK}"


class HookscopeError(Exception):
    """A problem with the user's input: one line saying what, where and what to do; exit 2."""

    exit_code = 2

    def render(self, spell: Callable[[str], str] | None = None) -> str:
        """The message with each marked parameter spelt by ``spell`` (default: its name)."""
        return _MARKED.sub(lambda m: (spell or str)(m.group(1)), super().__str__())

    def __str__(self) -> str:
        return self.render()


class CheckFailed(HookscopeError):
    """A check the user asked for failed (for example ``fail_on_nonfinite``): exit code 1."""

    exit_code = 1


class ForwardError(HookscopeError):
    """The model raised during the forward pass (exit code 1) in ``module``, the innermost
    running module (``""``: the model's own code; None: none had started), with its
    ``type_name``, ``call`` index, ``depth`` and ``input_shapes``; ``cause`` is the model's."""

    exit_code = 1

    def __init__(self, message: str, *, module: str | None = None, type_name: str | None = None,
                 call: int | None = None, depth: int | None = None,
                 input_shapes: list | None = None, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.module = module
        self.type_name = type_name
        self.call = call
        self.depth = depth
        self.input_shapes = input_shapes or []
        self.cause = cause
        #: The class name of the model's exception, and its message on one line.
        self.exception = "Exception" if cause is None else type(cause).__name__
        self.reason = str(self) if cause is None else " ".join(str(cause).split()) or self.exception

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled without the model's exception, which may not pickle (its class name and
        message are kept)."""
        return (ForwardError, (super().__str__(),), self.__dict__ | {"cause": None})


def at_least_one(name: str, value: int | None) -> int | None:
    """``value``, refused in one line when it is given and below 1 (``name``: its parameter)."""
    if value is not None and value < 1:
        raise HookscopeError(f"{param(name)} must be at least 1, not {value}.")
    return value


def suggest(word: str, candidates: Iterable[str], n: int = 3) -> str:
    """Return ``" Did you mean: a, b?"`` for the closest candidates, or an empty string."""
    pool, low = list(candidates), word.lower()
    close = difflib.get_close_matches(word, pool, n=n, cutoff=0.5) or \
        [c for c in pool if low and low in c.lower()][:n]
    return f" Did you mean: {', '.join(close)}?" if close else ""


def clip(text: str, limit: int = 200) -> str:
    """``text`` on one line without terminal styles, cut to at most ``limit`` characters at a
    space outside any brackets, so no word, number or shape is cut in half."""
    text = " ".join(_ANSI.sub("", text).split())
    if len(text) <= limit:
        return text
    depth, cut = 0, 0
    for i, ch in enumerate(text[: limit + 1]):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch == " " and depth == 0:
            cut = i
    return (text[:cut].rstrip(" ,;:") if cut else text[:limit].rsplit(" ", 1)[0]) + " ..."
