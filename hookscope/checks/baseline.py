"""A ``hookscope stats --format json`` document read back by :func:`read_stats`, the one reader
(``check``'s baseline, ``diff a.json b.json``, ``watch``'s reference), before any model runs.
Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from hookscope.checks.rulefile import Rules, describe
from hookscope.core.errors import HookscopeError

__all__ = ["StatsDocument", "drift_percentiles", "load_baseline", "read_stats"]

_DOC = "`hookscope stats --format json` document"
Rows = dict[tuple[str, int], Mapping[str, Any]]


class StatsDocument(NamedTuple):
    """The rows by (name, call), their percentiles' JSON keys (empty: none), the document and,
    as ``check``'s baseline, its path."""

    rows: Rows
    percentiles: tuple[str, ...]
    doc: dict[str, Any]
    path: str = ""


def _rows(doc: Any) -> Rows | tuple[str, str]:
    """The rows by call, or why ``doc`` is not a stats document, in a check's words and a diff's."""
    if not isinstance(doc, dict):
        return (f"it holds {describe(doc)}",) * 2
    if (command := doc.get("command")) != "stats":
        offline = f"it is a {command!r} document" if isinstance(command, str) and command \
            else "it is not a hookscope document (no command)"
        return f"its command is {command!r}", offline
    if not isinstance(layers := doc.get("layers"), list):
        return ("it has no layers list",) * 2
    rows: Rows = {}
    for i, row in enumerate(layers):
        if not (isinstance(row, dict) and isinstance(row.get("name"), str)
                and isinstance(row.get("call"), int) and "mean" in row and "std" in row):
            return (f"its layer {i} lacks name, call, mean or std",) * 2
        rows[(row["name"], row["call"])] = row
    return rows


def read_stats(path: Path, subject: str | None = None) -> StatsDocument:
    """Read a stats document; an error names it as ``subject`` (``--baseline``,
    ``rules.toml:2: baseline``), or without one in an offline diff's words."""
    named = repr(str(path))
    shown = f"{subject} {named}" if subject else named

    def error(why: str, offline: str) -> HookscopeError:
        return HookscopeError(f"{shown} {why}" if subject else offline)

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        reason = exc.strerror or exc
        why = f"not found; write one with `hookscope stats MODEL INPUT... --format json -o " \
            f"{path.name}`." if isinstance(exc, FileNotFoundError) else f"cannot be read: {reason}."
        raise error(why, f"Cannot read {named}: {reason}.") from None
    except UnicodeDecodeError as exc:
        raise error("cannot be read: not UTF-8 text.", f"{named} is not a JSON document ({exc}).") from None
    except json.JSONDecodeError as exc:
        raise error(f"is not JSON (line {exc.lineno}: {exc.msg}); give a {_DOC}.",
                    f"{named} is not a JSON document ({exc}).") from None
    rows = _rows(doc)
    if isinstance(rows, tuple):
        raise error(f"is not a {_DOC}: {rows[0]}.",
                    f"{named}: {rows[1]}; an offline diff compares two {_DOC}s.")
    found: Mapping[str, Any] = next((row["percentiles"] for row in rows.values()
                                     if isinstance(row.get("percentiles"), dict)
                                     and row["percentiles"]), {})
    return StatsDocument(rows, tuple(found), doc)


def drift_percentiles(rules: Rules, baseline: StatsDocument | None) -> tuple[float, ...] | None:
    """The percentiles a run takes for ``max_drift``: the baseline's (None when not asked)."""
    if baseline is None or rules.max_drift is None:
        return None
    return tuple(float(key) for key in baseline.percentiles)


def load_baseline(rules: Rules) -> StatsDocument | None:
    if rules.baseline is None:
        return None
    found = read_stats(rules.baseline, rules.subject("baseline"))
    if rules.max_drift is not None and not found.percentiles:
        raise HookscopeError(f"{rules.subject('max_drift')} needs percentiles in the baseline "
                             f"{str(rules.baseline)!r}: write it with `hookscope stats MODEL "
                             f"INPUT... --percentiles 1,5,25,50,75,95,99 --format json`.")
    return found._replace(path=str(rules.baseline))
