"""The rules file of ``hookscope check``: its keys, the :class:`Rules` they make, and
:func:`load_rules`, which reads them from a TOML file and/or flags.

Anything wrong with the rules themselves is a :class:`~hookscope.core.errors.HookscopeError`
naming the file and line (found by the TOML parser itself). Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hookscope.core.errors import HookscopeError, clip, param, suggest
from hookscope.numerics.drift import finite

__all__ = ["KEYS", "Expect", "Key", "Rules", "describe", "load_rules"]

@dataclass(frozen=True)
class Key:
    """A key of the rules file: what its value must be, and the check that converts it."""

    name: str
    kind: str
    convert: Callable[[Any], Any]


def _integer(low: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError
        return value

    return convert


def _number(high: float | None = None) -> Callable[[Any], float]:
    def convert(value: Any) -> float:
        if finite(value) is None or value < 0 or (high is not None and value > high):
            raise ValueError
        return float(value)

    return convert


def _globs(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError
    return tuple(v.strip() for v in value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError
    return value


def _table(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError
    return value


#: Every key a rules file may hold (the flags mirror them), in the order rules run.
KEYS: dict[str, Key] = {k.name: k for k in [
    Key("nonfinite", "a non-negative integer (non-finite values allowed per call)", _integer(0)),
    Key("max_zero_fraction", "a number from 0 to 1", _number(1.0)),
    Key("ignore", "an array of module-name globs", _globs),
    Key("baseline", "a file name (a `hookscope stats --format json` document)", _text),
    Key("max_mean_drift", "a non-negative number (relative drift)", _number()),
    Key("max_std_drift", "a non-negative number (relative drift)", _number()),
    Key("max_drift", "a non-negative number (distribution drift, in baseline stds)", _number()),
    Key("expect", "a table of input = label or class index", _table),
    Key("min_prob", "a number from 0 to 1", _number(1.0)),
    # A training log's rules (`hookscope check LOG_DIR`, see hookscope.training.rules).
    Key("last", "a positive integer (the logging steps checked, the last ones)", _integer(1)),
    Key("min_grad_norm", "a non-negative number", _number()),
    Key("max_grad_norm", "a non-negative number", _number()),
    Key("min_update_ratio", "a non-negative number", _number()),
    Key("max_update_ratio", "a non-negative number", _number()),
]}


def describe(value: Any) -> str:
    """A value as an error message shows it: its TOML type, and the value when short."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return f"the string {clip(repr(value), 60)}"
    if isinstance(value, (list, tuple)):
        return "an array"
    return "a table" if isinstance(value, dict) else f"a {type(value).__name__}"


def _convert(key: Key, value: Any, subject: str) -> Any:
    try:
        return key.convert(value)
    except ValueError:
        raise HookscopeError(f"{subject} must be {key.kind}, not {describe(value)}.") from None


@dataclass(frozen=True)
class Expect:
    """One ``expect`` entry as written: an input's name (a path, a basename, ``x.pt[3]``), its
    expected top-1 class (a label, matched case-insensitively, or an index) and where it was
    written, for error messages."""

    input: str
    want: str | int
    where: str = field(default="expect", compare=False)


@dataclass(frozen=True)
class Rules:
    """The assertions of one check (the keys of :data:`KEYS`). ``nonfinite`` is always on, the
    others only when given. An ``ignore`` glob also covers the modules under what it matches;
    ``where`` says for each key given where (file and line, or flag) it was set.
    """

    nonfinite: int = 0
    max_zero_fraction: float | None = None
    ignore: tuple[str, ...] = ()
    baseline: Path | None = None
    max_mean_drift: float | None = None
    max_std_drift: float | None = None
    max_drift: float | None = None
    expect: tuple[Expect, ...] = ()
    min_prob: float | None = None
    last: int | None = None
    min_grad_norm: float | None = None
    max_grad_norm: float | None = None
    min_update_ratio: float | None = None
    max_update_ratio: float | None = None
    source: str | None = None
    where: Mapping[str, str] = field(default_factory=dict, compare=False)

    def subject(self, key: str) -> str:
        """How an error names ``key``: ``rules.toml:5: baseline``, or the parameter."""
        return self.where.get(key, param(key))


def _toml() -> ModuleType:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise HookscopeError("Reading a rules file needs Python 3.11 or later, or tomli "
                                 "(pip install tomli).") from None
    return tomllib


_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")
_MISSING = object()


def _find_line(text: str, path: tuple[str, ...]) -> int | None:
    """The line that defines ``path`` (a table header or a key under it), found by the TOML
    parser itself: the first line after the longest start of the file that parses without
    ``path``, once a longer start parses with it (a multi-line value names its first line)."""
    lines = text.splitlines()
    toml, read = _toml(), 0
    for number in range(1, len(lines) + 1):
        try:
            node: Any = toml.loads("\n".join(lines[:number]))
        except toml.TOMLDecodeError:  # this start ends inside a multi-line value
            continue
        for key in path:
            node = node.get(key, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING:
            return read + 1
        read = number
    return None


def _at(file: str, text: str, *path: str) -> str:
    """``rules.toml:7:`` for the line defining ``path`` (or its table), else ``rules.toml:``."""
    for end in range(len(path), 0, -1):
        line = _find_line(text, path[:end])
        if line is not None:
            return f"{file}:{line}:"
    return f"{file}:"


def _read_text(path: Path) -> str:
    shown = f"rules file {str(path)!r}"
    try:
        return path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise HookscopeError(f"{shown} not found.") from None
    except IsADirectoryError:
        raise HookscopeError(f"{shown} is a directory; give a TOML file.") from None
    except OSError as exc:
        raise HookscopeError(f"{shown} cannot be read: {exc.strerror or exc}.") from None
    except UnicodeDecodeError:
        raise HookscopeError(f"{shown} is not UTF-8 text (TOML files are UTF-8).") from None


def _parse(path: Path, text: str) -> dict[str, Any]:
    toml = _toml()
    try:
        return toml.loads(text)
    except toml.TOMLDecodeError as exc:
        message = str(exc)  # every version ends it with its position: (at line L, column C)
        found = _AT.search(message)
        line, column = found.groups() if found else (None, None)
        line = line or max(len(text.splitlines()), 1)
        where = f"column {column}" if column else "at the end of the file"
        reason = _AT.sub("", message)
        reason = reason[:1].lower() + reason[1:]
        raise HookscopeError(f"{path}:{line}: not valid TOML ({where}): {reason}.") from None


def _file_expect(value: Any, subject: str, file: str, text: str) -> tuple[Expect, ...]:
    table = _convert(KEYS["expect"], value, subject)
    entries = []
    for name, want in table.items():
        where = f"{_at(file, text, 'expect', name)} expect {name!r}"
        if not (isinstance(want, str) and want.strip()) and \
                (isinstance(want, bool) or not isinstance(want, int) or want < 0):
            hint = ' (quote file names: "cat.jpg" = "tabby")' if isinstance(want, dict) else ""
            raise HookscopeError(f"{where} must be a class label (a string) or a class index "
                                 f"(a non-negative integer), not {describe(want)}{hint}.")
        entries.append(Expect(name, want, where))
    return tuple(entries)


def _read_file(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The rules in a TOML file, checked, and where each was set."""
    text = _read_text(path)
    data = _parse(path, text)
    file = str(path)
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key, value in data.items():
        at = _at(file, text, key)
        if key not in KEYS:
            nested = " Rules sit at the top level of the file, not in a table." \
                if isinstance(value, dict) else ""
            raise HookscopeError(f"{at} unknown key {key!r}.{suggest(key, KEYS)}{nested} "
                                 f"Valid keys: {', '.join(KEYS)}.")
        where[key] = f"{at} {key}"
        if key == "expect":
            values[key] = _file_expect(value, where[key], file, text)
        else:
            values[key] = _convert(KEYS[key], value, where[key])
    if "baseline" in values:  # relative to the rules file, wherever hookscope runs
        values["baseline"] = path.parent / values["baseline"]
    return values, where


def _flag_expect(values: Iterable[str]) -> tuple[Expect, ...]:
    entries = []
    for given in values:
        name, sep, want = given.rpartition("=")
        where = f"{param('expect')} {given!r}"
        if not sep or not name.strip() or not want.strip():
            raise HookscopeError(f"{where}: give INPUT=LABEL or INPUT=INDEX, e.g. cat.jpg=tabby.")
        entries.append(Expect(name.strip(), want.strip(), where))
    return tuple(entries)


def load_rules(path: str | Path | None = None,
               overrides: Mapping[str, Any] | None = None) -> Rules:
    """Read the rules from a TOML file (the keys of :data:`KEYS` at its top level) and/or
    ``overrides`` (by key, None: not given; ``expect`` as ``INPUT=LABEL`` strings), which replace
    the file's values. Any error is a HookscopeError; a file's names its line.
    """
    values, where = _read_file(Path(path)) if path is not None else ({}, {})
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        where[key] = param(key)
        if key == "expect":
            values[key] = _flag_expect(value)
        elif key == "baseline":
            values[key] = Path(_convert(KEYS[key], str(value), where[key]))
        else:
            values[key] = _convert(KEYS[key], value, where[key])
    for key in ("max_mean_drift", "max_std_drift", "max_drift"):
        if values.get(key) is not None and values.get("baseline") is None:
            raise HookscopeError(f"{where[key]} needs a baseline to compare with: baseline = "
                                 f"\"stats.json\" in the rules file, or {param('baseline')}.")
    return Rules(**values, source=str(path) if path is not None else None, where=where)
