"""``hookscope check``'s rules: :class:`Rules`, whose fields declare every key (its value, where
it applies, its flag), read by :func:`load_rules` from a TOML file and/or flags. Anything wrong
with them is a HookscopeError naming the file and line. Torch-free.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hookscope.core.errors import HookscopeError, clip, param, suggest
from hookscope.numerics.drift import finite

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

__all__ = ["KEYS", "Expect", "Key", "Rules", "describe", "key_names", "load_rules"]


@dataclass(frozen=True)
class Key:
    """A key: what its value must be and its converter (ValueError: not that), where it applies
    (``run``, ``log`` or ``both``) and its flag's value type, help and metavar."""

    kind: str
    convert: Callable[[Any], Any]
    scope: str = "both"
    flag: Any = None
    help: str = ""
    metavar: str | None = None


def _key(default: Any, kind: str, convert: Callable[[Any], Any], scope: str = "both",
         **flag: Any) -> Any:
    return field(default=default, metadata={"key": Key(kind, convert, scope, **flag)})


def _check(ok: Callable[[Any], bool], cast: Callable[[Any], Any] = lambda v: v
           ) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if not ok(value):
            raise ValueError
        return cast(value)

    return convert


def _integer(low: int) -> Callable[[Any], Any]:
    return _check(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low)


def _number(high: float = math.inf) -> Callable[[Any], Any]:
    return _check(lambda v: finite(v) is not None and 0 <= v <= high, float)


_globs = _check(lambda v: isinstance(v, (list, tuple)) and all(isinstance(g, str) and g.strip() for g in v),
                lambda v: tuple(g.strip() for g in v))
_file = _check(lambda v: isinstance(v, (str, Path)) and bool(str(v).strip()), Path)
_table = _check(lambda v: isinstance(v, dict))


@dataclass(frozen=True)
class Expect:
    """One ``expect`` entry as written: an input (a path, a basename, ``x.pt[3]``), its top-1
    class (a label, in any case, or an index) and where it was written."""

    input: str
    want: str | int
    where: str = field(default="expect", compare=False)


_DRIFT = "a non-negative number (relative drift)"
_ANY = "a non-negative number"


@dataclass(frozen=True)
class Rules:
    """One check's assertions: each :func:`_key` field is a key, in the order the rules run
    (``nonfinite`` always, the others when given); ``where`` says where each given key was set.
    """

    nonfinite: int = _key(
        0, "a non-negative integer (non-finite values allowed per call)", _integer(0), flag=int,
        help="Most NaN/Inf values allowed in one call's output [default: 0].")
    max_zero_fraction: float | None = _key(
        None, "a number from 0 to 1", _number(1.0), flag=float,
        help="Fail a call whose output is more than this fraction zeros (a dead layer).")
    ignore: tuple[str, ...] = _key(
        (), "an array of module-name globs", _globs, flag=list[str], metavar="GLOB",
        help="Module-name glob left out of the per-call rules, with the modules under it "
        "(repeatable).")
    baseline: Path | None = _key(
        None, "a file name (a `hookscope stats --format json` document)", _file, "run", flag=Path,
        help="A `hookscope stats --format json` document to compare with.")
    max_mean_drift: float | None = _key(
        None, _DRIFT, _number(), "run", flag=float,
        help="Largest relative change of a call's mean from the baseline: "
        "|mean - base| / max(|base mean|, base std).")
    max_std_drift: float | None = _key(
        None, _DRIFT, _number(), "run", flag=float,
        help="Largest relative change of a call's std from the baseline.")
    max_drift: float | None = _key(
        None, "a non-negative number (distribution drift, in baseline stds)", _number(), "run",
        flag=float, help="Largest distribution drift of a call from the baseline: the mean "
        "|difference| of the two quantile functions over the baseline's percentiles, in baseline "
        "stds (the baseline needs --percentiles).")
    expect: tuple[Expect, ...] = _key(
        (), "a table of input = label or class index", _table, "run", flag=list[str],
        metavar="INPUT=LABEL",
        help="INPUT=LABEL or INPUT=INDEX: the expected top-1 class (repeatable).")
    min_prob: float | None = _key(
        None, "a number from 0 to 1", _number(1.0), "run", flag=float,
        help="Smallest top-1 probability allowed for any input.")
    # A training log's rules (`hookscope check LOG_DIR`, see hookscope.checks.log).
    last: int | None = _key(
        None, "a positive integer (the logging steps checked, the last ones)", _integer(1), "log",
        flag=int, help="A training log: check only its last N logging steps [default: all].")
    min_grad_norm: float | None = _key(
        None, _ANY, _number(), "log", flag=float, help="A training log: smallest gradient norm "
        "allowed, of a layer call (at its output) or a parameter.")
    max_grad_norm: float | None = _key(
        None, _ANY, _number(), "log", flag=float, help="A training log: largest gradient norm "
        "allowed, of a layer call (at its output) or a parameter.")
    min_update_ratio: float | None = _key(
        None, _ANY, _number(), "log", flag=float,
        help="A training log: smallest update ratio ||dw|| / ||w|| allowed for a parameter.")
    max_update_ratio: float | None = _key(
        None, _ANY, _number(), "log", flag=float,
        help="A training log: largest update ratio ||dw|| / ||w|| allowed for a parameter.")
    source: str | None = None
    where: Mapping[str, str] = field(default_factory=dict, compare=False)

    def subject(self, key: str) -> str:
        """How an error names ``key``: ``rules.toml:5: baseline``, or the parameter."""
        return self.where.get(key, param(key))

    def only(self, scope: str) -> Rules:
        """These rules, if a ``run`` or a ``log`` can check every key given (else an error)."""
        for name, key in KEYS.items():
            if name in self.where and key.scope not in (scope, "both"):
                raise HookscopeError(f"{self.subject(name)} {_ELSEWHERE[key.scope]}")
        return self


#: Every key a rules file may hold, in the order rules run (the fields of :class:`Rules`).
KEYS: dict[str, Key] = {f.name: f.metadata["key"] for f in fields(Rules) if "key" in f.metadata}


def key_names(scope: str) -> str:
    """The keys a ``run`` or a ``log`` can check, as help lists them (tables last)."""
    names = [name for name, key in KEYS.items() if key.scope in (scope, "both")]
    tables = [f"[{name}]" for name in names if KEYS[name].convert is _table]
    return ", ".join([name for name in names if KEYS[name].convert is not _table] + tables)


#: Why a key of one scope cannot be checked in the other.
_ELSEWHERE = {
    "run": "checks a model run on its inputs; a training log has no predictions or stats "
           f"baseline. Keys for a log: {key_names('log')}.",
    "log": "checks a training log: give the log directory (the one holding watch.jsonl) "
           "instead of MODEL INPUT.",
}


def describe(value: Any) -> str:
    """A value as an error message shows it: its TOML (or JSON) type, and the value when short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return f"the string {clip(repr(value), 60)}"
    if isinstance(value, (list, tuple)):
        kinds = list(dict.fromkeys(_kind(item) + "s" for item in value))
        items = ", ".join(kinds[:-1]) + " and " + kinds[-1] if len(kinds) > 1 else "".join(kinds)
        return f"an array of {items}" if items else "an empty array"
    return f"a {_kind(value)}"


def _kind(value: Any) -> str:
    """A value's TOML type, a blank string apart: ``integer``, ``blank string``, ``table``."""
    if isinstance(value, str):
        return "string" if value.strip() else "blank string"
    names = {bool: "boolean", int: "integer", float: "float", dict: "table", list: "array",
             tuple: "array"}
    return names.get(type(value), type(value).__name__)


def _convert(key: str, value: Any, subject: str) -> Any:
    try:
        return KEYS[key].convert(value)
    except ValueError:
        raise HookscopeError(f"{subject} must be {KEYS[key].kind}, not {describe(value)}.") from None


_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")
_PART = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
#: A line that starts a table (``[expect]``) or a key (``"a.jpg" = ...``, dotted ones too).
_DEFINES = re.compile(rf"\s*(\[+\s*)?({_PART}(?:\s*\.\s*{_PART})*)\s*[\]=]")


def _at(file: str, text: str, *path: str) -> str:
    """``rules.toml:7:`` for the first line defining ``path`` (or its table), else ``rules.toml:``."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), 1):
        if (found := _DEFINES.match(line)) is None:
            continue
        parts = tuple(p.strip().strip("\"'") for p in re.findall(_PART, found[2]))
        table, defined = (parts, parts) if found[1] else (table, table + parts)
        for end in range(1, len(defined) + 1):
            lines.setdefault(defined[:end], number)
    at = next((lines[path[:end]] for end in range(len(path), 0, -1) if path[:end] in lines), None)
    return f"{file}:{at}:" if at is not None else f"{file}:"


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
    if tomllib is None:
        raise HookscopeError("Reading a rules file needs Python 3.11 or later, or tomli "
                             "(pip install tomli).")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)  # every version ends it with its position: (at line L, column C)
        found = _AT.search(message)
        line, column = found.groups() if found else (None, None)
        line = line or max(len(text.splitlines()), 1)
        where = f"column {column}" if column else "at the end of the file"
        reason = _AT.sub("", message)
        reason = reason[:1].lower() + reason[1:]
        raise HookscopeError(f"{path}:{line}: not valid TOML ({where}): {reason}.") from None


def _file_expect(value: Any, subject: str, file: str, text: str) -> tuple[Expect, ...]:
    entries = []
    for name, want in _convert("expect", value, subject).items():
        where = f"{_at(file, text, 'expect', name)} expect {name!r}"
        if not (isinstance(want, str) and want.strip()) and \
                (isinstance(want, bool) or not isinstance(want, int) or want < 0):
            hint = ' (quote file names: "cat.jpg" = "tabby")' if isinstance(want, dict) else ""
            raise HookscopeError(f"{where} must be a class label (a string) or a class index "
                                 f"(a non-negative integer), not {describe(want)}{hint}.")
        entries.append(Expect(name, want, where))
    return tuple(entries)


def _read_file(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """A TOML file's rules, checked, and where each was set."""
    text = _read_text(path)
    file = str(path)
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key, value in _parse(path, text).items():
        at = _at(file, text, key)
        if key not in KEYS:
            nested = " Rules sit at the top level of the file, not in a table." \
                if isinstance(value, dict) else ""
            raise HookscopeError(f"{at} unknown key {key!r}.{suggest(key, KEYS)}{nested} "
                                 f"Valid keys: {', '.join(KEYS)}.")
        where[key] = f"{at} {key}"
        values[key] = _file_expect(value, where[key], file, text) if key == "expect" else \
            _convert(key, value, where[key])
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


def load_rules(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
               scope: str | None = None) -> Rules:
    """The rules of a TOML file (:data:`KEYS` at its top level), replaced by ``overrides`` (by
    key, None: not given; ``expect`` as ``INPUT=LABEL``); a key ``scope`` cannot check is refused.
    """
    values, where = _read_file(Path(path)) if path is not None else ({}, {})
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        where[key] = param(key)
        values[key] = _flag_expect(value) if key == "expect" else _convert(key, value, where[key])
    rules = Rules(**values, source=str(path) if path is not None else None, where=where)
    if scope is not None:
        rules.only(scope)
    for key in ("max_mean_drift", "max_std_drift", "max_drift"):
        if values.get(key) is not None and values.get("baseline") is None:
            raise HookscopeError(f"{where[key]} needs a baseline to compare with: baseline = "
                                 f"\"stats.json\" in the rules file, or {param('baseline')}.")
    return rules
