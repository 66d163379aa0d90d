"""Which stream is data's: the stdout hookscope started with, whatever runs meanwhile.

While a command runs, ``sys.stdout`` is stderr (:func:`prints_to_stderr`), so a model that
prints cannot break ``--format json | jq``. Imports neither torch nor Rich."""

from __future__ import annotations

import codecs
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

_data: list[TextIO] = []

#: ASCII spellings of the characters hookscope's own output uses.
_ASCII = {"→": "->", "←": "<-", "±": "+/-", "…": "...", "×": "x", "·": ".", "Δ": "d",
          "‖": "||", "≥": ">=", "≤": "<=", "−": "-", "—": "--", "–": "-", "─": "-",
          "│": "|", "‘": "'", "’": "'", "“": '"', "”": '"', "✓": "ok", "✗": "x"}
ERRORS = "hookscope-ascii"


def _fallback(error: UnicodeError) -> tuple[str, int]:
    """A codec error handler: known symbols in ASCII, anything else as ``\\uXXXX``."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start:error.end]
    return "".join(_ASCII.get(c) or c.encode("ascii", "backslashreplace").decode()
                   for c in text), error.end


codecs.register_error(ERRORS, _fallback)


def data() -> TextIO:
    """The stream data goes to: stdout, even while ``sys.stdout`` points at stderr."""
    return _data[-1] if _data else sys.stdout


class DataFile:
    """A file object that is always :func:`data` (for a console made once, used often)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(data(), name)


def tolerate_encoding(stream: Any) -> None:
    """Let ``stream`` write characters its encoding lacks (in ASCII), instead of raising."""
    try:
        "→±…".encode(getattr(stream, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors=ERRORS)


@contextmanager
def prints_to_stderr() -> Iterator[None]:
    """Inside, ``print`` writes to stderr, and :func:`data` is the stdout of before."""
    saved = sys.stdout
    tolerate_encoding(saved)
    _data.append(saved)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = saved
        _data.pop()
