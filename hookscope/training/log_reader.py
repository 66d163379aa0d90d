"""A training log as ``hookscope.watch`` writes it (docs/watch.md), read back without torch:
:func:`read_log` gives ``check`` and ``report`` a log directory's :class:`TrainingLog`."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hookscope.core.errors import HookscopeError
from hookscope.numerics.drift import finite

__all__ = ["EVENT_FILE", "LOG_FILE", "TrainingLog", "call_key", "is_log", "listed", "read_log"]

log = logging.getLogger("hookscope")

#: The file that makes a directory a training log.
LOG_FILE = "watch.jsonl"
#: The non-finite event, written when the watch stopped on a NaN or Inf.
EVENT_FILE = "nonfinite.json"
#: Keys of a logging step's line; the other keys of the first line are its envelope.
STEP_KEYS = ("step", "time", "layers", "params")

# The documented fields' JSON types (docs/watch.md), checked where present; any may be null
# except a step's "step" and a row's "name", checked first. Fields added later are not checked.
NUMBER, INTEGER, STRING, LIST, OBJECT, STRINGS = ("a number", "an integer", "a string",
                                                 "a list", "an object", "a list of strings")
ENVELOPE = {"hookscope": STRING, "command": STRING, "model": STRING, "device": STRING,
            "world_size": INTEGER, "selection": OBJECT, "every": INTEGER, "nonfinite": STRING,
            "allow_inf": LIST, "keep": INTEGER, "reference": STRING, "max_drift": NUMBER,
            "drift_measure": STRING, "percentiles": LIST, "started": NUMBER}
STEP = {"time": NUMBER, "loss": NUMBER, "flagged": LIST}
LAYER = {"type": STRING, "call": INTEGER, "input_shapes": LIST, "output_shape": LIST,
         "output_shapes": LIST, "nonfinite": INTEGER, "grad_nonfinite": INTEGER,
         "percentiles": OBJECT, "flags": STRINGS} | dict.fromkeys(
    ("mean", "std", "min", "max", "zero_fraction", "grad_norm", "grad_mean", "grad_std",
     "drift"), NUMBER)
PARAM = dict.fromkeys(("norm", "grad_norm", "update_ratio"), NUMBER)
EVENT = {"step": INTEGER, "rank": INTEGER, "message": STRING, "phase": STRING,
         "module": STRING, "type": STRING, "call": INTEGER, "source": STRING, "inputs": LIST}


#: Deeper values are refused: a log's lines nest four levels (a step, its rows, a row, a
#: shape), and what reads them (JSON output, the page) recurses.
MAX_DEPTH = 32


def _loads(data: str | bytes) -> Any:
    """``json.loads``; RecursionError, as the parser's own, past :data:`MAX_DEPTH` levels."""
    value = json.loads(data)
    level = [value]
    for _ in range(MAX_DEPTH):
        level = [child for item in level if isinstance(item, (list, dict))
                 for child in (item.values() if isinstance(item, dict) else item)]
    if any(isinstance(item, (list, dict)) for item in level):
        raise RecursionError
    return value


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_IS: dict[str, Callable[[Any], bool]] = {
    NUMBER: lambda v: _integer(v) or isinstance(v, float), INTEGER: _integer,
    STRING: lambda v: isinstance(v, str), LIST: lambda v: isinstance(v, list),
    OBJECT: lambda v: isinstance(v, dict),
    STRINGS: lambda v: isinstance(v, list) and all(isinstance(f, str) for f in v)}
_WHAT = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
         list: "a list", dict: "an object"}


def _bad_field(obj: Mapping[str, Any], schema: Mapping[str, str], where: str = "") -> str | None:
    """The first field of ``obj`` whose value is not of its documented type, in words."""
    for key, kind in schema.items():
        value = obj.get(key)
        if value is not None and not _IS[kind](value):
            return f'{where}"{key}" is {_WHAT[type(value)]}, not {kind}'
    return None


def is_log(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding :data:`LOG_FILE` (of any kind: reading it
    says what is wrong with one that is not a regular file)."""
    try:
        return Path(path).is_dir() and os.path.lexists(Path(path) / LOG_FILE)
    except (OSError, ValueError):
        return False


def _read(file: Path, shown: str) -> bytes | None:
    """The bytes of the regular file ``file`` (None: there is none; a FIFO would never end)."""
    try:
        if not stat.S_ISREG(file.stat().st_mode):
            raise HookscopeError(f"{shown} is not a regular file.")
        return file.read_bytes()
    except FileNotFoundError:
        if not os.path.lexists(file):
            return None
        raise HookscopeError(f"{shown} cannot be read: it is a broken symbolic link.") from None
    except OSError as exc:
        raise HookscopeError(f"{shown} cannot be read: {exc.strerror or exc}.") from None


@dataclass(frozen=True)
class TrainingLog:
    """One watched run's logging steps, in step order, the first line's envelope, and
    ``nonfinite.json``'s event (None: there was none)."""

    path: str
    envelope: Mapping[str, Any]
    steps: list[Mapping[str, Any]]
    event: Mapping[str, Any] | None = None
    #: The flight recorder of ``nonfinite.json``: its last steps up to the event, oldest first.
    recorder: list[Mapping[str, Any]] = field(default_factory=list)

    def allowed(self, name: str) -> bool:
        """Whether the watch was told that ``name``'s ±inf is intended (``allow_inf``)."""
        patterns = self.envelope.get("allow_inf") or ()
        return any(isinstance(p, str) and fnmatch.fnmatchcase(name, p) for p in patterns)

    def span(self, step: int) -> int:
        """The steps an update ratio logged at ``step`` spans (from the logging step before)."""
        before = [s["step"] for s in self.steps if s["step"] < step]
        return step - before[-1] if before else 1

    def nonfinite_steps(self) -> list[int]:
        """The logging steps with a non-finite value in a row (``allow_inf`` modules left out)."""
        return [s["step"] for s in self.steps if any(
            (r.get("nonfinite") or r.get("grad_nonfinite")) and not self.allowed(r["name"])
            for r in s.get("layers") or ())]

    def outcome(self) -> str | None:
        """What the watch did on its non-finite event: ``stopped on a non-finite value at step
        4``, or ``warned about non-finite values at steps 4, 10; training continued to step 20``."""
        if self.event is None:
            return None
        first = self.event.get("step")
        if self.envelope.get("nonfinite") != "warn":
            return f"stopped on a non-finite value at step {first}"
        steps = sorted({*([first] if isinstance(first, int) else []), *self.nonfinite_steps()})
        last = self.steps[-1]["step"] if self.steps else None
        went = f" to step {last}" if isinstance(first, int) and isinstance(last, int) and last > first else ""
        return f"warned about non-finite values at step{'s' * (len(steps) > 1)} " \
            f"{listed(steps)}; training continued{went}"

    def layer_keys(self) -> list[tuple[str, int]]:
        """Every (name, call) logged, in the order first seen (execution order)."""
        return list(self.series("layers", "name")[1])

    def series(self, kind: str, key: str) -> tuple[list[int], dict[Any, list[float | None]]]:
        """The steps, and ``key``'s value at each (None: missing or not finite) for each layer
        call (``kind="layers"``, by (name, call)) or parameter (by name), as first seen."""
        steps = [s["step"] for s in self.steps]
        values: dict[Any, list[float | None]] = {}
        for i, step in enumerate(self.steps):
            for row in step.get(kind) or ():
                k = call_key(row) if kind == "layers" else row["name"]
                values.setdefault(k, [None] * len(steps))[i] = finite(row.get(key))
        return steps, values

    def flagged(self) -> list[dict[str, Any]]:
        """Each layer call flagged at any logging step: its name, its row in the last step's
        layers (None if absent), the steps flagged, and the last one's flags in words."""
        last = self.steps[-1].get("layers") or [] if self.steps else []
        rows = {call_key(r): i for i, r in enumerate(last)}
        found: dict[tuple[str, int], dict[str, Any]] = {}
        for step in self.steps:
            for row in step.get("layers") or ():
                flags = [f for f in row.get("flags") or ()
                         if not (f == "nonfinite" and self.allowed(row["name"]))]
                if not flags:
                    continue
                key = call_key(row)
                entry = found.setdefault(key, {
                    "name": key[0] + (f" (call {key[1]})" if key[1] else ""), "layer": key[0],
                    "call": key[1], "row": rows.get(key), "at": []})
                entry["at"].append(step.get("step"))
                drift = finite(row.get("drift"))
                entry["flags"] = flags
                entry["detail"] = ", ".join(f"drift {drift:.4g}" if f == "drift" and drift
                                            is not None else f for f in flags)
        for entry in found.values():
            at = entry["at"]
            entry["steps"] = f"step {at[0]}" if len(at) == 1 else \
                f"{len(at)} steps, {at[0]} to {at[-1]}"
        return list(found.values())

    def to_dict(self) -> dict[str, Any]:
        """What a document says about the log it read."""
        return {"log": self.path, "logging_steps": len(self.steps),
                "first_step": self.steps[0].get("step") if self.steps else None,
                "last_step": self.steps[-1].get("step") if self.steps else None,
                "nonfinite_event": dict(self.event) if self.event is not None else None}


def listed(items: Sequence[Any], most: int = 8) -> str:
    """``1, 2, 3 and 4 more``: the first ``most`` items, and how many more."""
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(map(str, items[:most])) + more


def call_key(row: Mapping[str, Any]) -> tuple[str, int]:
    """A layer row's (name, call), of the flight recorder's unchecked rows too."""
    return str(row.get("name")), int(row.get("call") or 0)


def _problem(line: Any) -> str | None:
    """Why a parsed line is not a logging step, or None."""
    if not isinstance(line, dict):
        return f"it holds a {type(line).__name__}, not an object"
    if not isinstance(line.get("step"), int) or isinstance(line.get("step"), bool):
        return "it has no integer \"step\""
    for kind in ("layers", "params"):
        rows = line.get(kind, [])
        if not isinstance(rows, list) or not all(
                isinstance(r, dict) and isinstance(r.get("name"), str) for r in rows):
            return f"its \"{kind}\" is not a list of rows with a \"name\""
    return _bad_field(line, STEP) or next(
        (why for kind, schema in (("layers", LAYER), ("params", PARAM))
         for i, row in enumerate(line.get(kind, []))
         if (why := _bad_field(row, schema, f"{kind}[{i}] ")) is not None), None)


def _read_lines(file: Path) -> list[dict[str, Any]]:
    """The file's step lines; a last line cut short (a run killed mid-write) is skipped."""
    try:
        text = (_read(file, f"training log {str(file)!r}") or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise HookscopeError(f"training log {str(file)!r} is not UTF-8 text.") from None
    lines = [(n, t) for n, t in enumerate(text.splitlines(), 1) if t.strip()]
    found: list[dict[str, Any]] = []
    for i, (number_, line) in enumerate(lines):
        try:
            parsed = _loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1 and not text.endswith("\n"):
                log.warning("%s:%d: the last line is cut short (the run stopped while "
                            "writing it); it is left out", file, number_)
                break
            raise HookscopeError(f"{file}:{number_}: not JSON ({exc.msg}); a training log "
                                 "holds one JSON object per line.") from None
        except RecursionError:
            raise HookscopeError(f"{file}:{number_}: nested too deeply (over {MAX_DEPTH} "
                                 "levels); a training log holds one JSON object per line.") \
                from None
        header = i == 0 and isinstance(parsed, dict) and "step" not in parsed  # envelope only
        why = _bad_field(parsed, ENVELOPE) if header else _problem(parsed)
        if why is not None:
            what = "the envelope" if header else "a logging step"
            raise HookscopeError(f"{file}:{number_}: not {what} of hookscope.watch: {why}.")
        found.append(parsed)
    return found


def _read_event(file: Path) -> tuple[dict[str, Any] | None, list[Mapping[str, Any]]]:
    """The event of ``nonfinite.json`` and its flight recorder's steps (None, []: no file)."""
    data = _read(file, repr(str(file)))
    if data is None:
        return None, []
    try:
        event = _loads(data)
    except RecursionError:
        raise HookscopeError(f"{str(file)!r} is nested too deeply (over {MAX_DEPTH} levels) "
                             "to be the non-finite event.") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise HookscopeError(f"{str(file)!r} is not a JSON document; hookscope.watch writes "
                             "it when a step produced a NaN or Inf.") from None
    if not isinstance(event, dict):
        raise HookscopeError(f"{str(file)!r} holds a {type(event).__name__}, not the "
                             "non-finite event's object.")
    # The event sits under "event", beside the envelope and the flight recorder's "steps".
    steps = event.get("steps") if isinstance(event.get("event"), dict) else None
    event = event["event"] if isinstance(event.get("event"), dict) else event
    why = _bad_field(event, EVENT)
    if why is not None:
        raise HookscopeError(f"{str(file)!r} is not the non-finite event of hookscope.watch: "
                             f"its {why}.")
    return event, [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def read_log(path: str | Path) -> TrainingLog:
    """Read the training log in the directory ``path``; a missing ``watch.jsonl``, a line that
    is not a logging step (named by file and line) or a bad ``nonfinite.json`` is an error."""
    folder = Path(path)
    if not is_log(folder):
        raise HookscopeError(f"{str(path)!r} is not a training log: a directory holding "
                             f"{LOG_FILE}, as hookscope.watch(model, log_dir=...) writes.")
    lines = _read_lines(folder / LOG_FILE)
    envelope = {k: v for k, v in (lines[0] if lines else {}).items() if k not in STEP_KEYS}
    steps: list[Mapping[str, Any]] = [line for line in lines if "step" in line]
    steps.sort(key=lambda s: s["step"])
    event, recorder = _read_event(folder / EVENT_FILE)
    if not steps and event is None:
        raise HookscopeError(f"training log {str(path)!r} has no logging step yet; the "
                             f"watch writes one at step 0 and every `every` steps.")
    return TrainingLog(str(path), envelope, steps, event, recorder)
