"""What every HTML page shares: the Jinja2 environment, the base template's assets and
Content-Security-Policy, and the cells of the sortable tables.

Autoescape is on, so every string from a model, its labels, file names or a log is escaped;
only the page's own style, script and matplotlib's SVG figures are marked safe. A page is
self-contained, and its policy lets nothing load and only its own script run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping
from contextlib import suppress
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookscope.numerics.drift import finite
from hookscope.render.tables import fmt_float

if TYPE_CHECKING:
    from jinja2 import Environment

TEMPLATES = Path(__file__).parent / "templates"


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The pages' Jinja2 environment: autoescape on, an undefined name an error."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    return Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True,
                       undefined=StrictUndefined, keep_trailing_newline=True)


@lru_cache(maxsize=1)
def page_assets() -> dict[str, Any]:
    """The base template's ``css``, ``script`` and ``policy``: nothing loads from anywhere,
    images only from ``data:``, and only this script runs (by its hash)."""
    from markupsafe import Markup

    script = (TEMPLATES / "page.js").read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return {"css": Markup((TEMPLATES / "page.css").read_text(encoding="utf-8")),
            "script": Markup(script),
            "policy": f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
                      f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'"}


def render(template: str, **context: Any) -> str:
    """The page ``template`` drawn with ``context`` and the base template's assets."""
    return environment().get_template(template).render(**page_assets(), **context)


def fact(key: str, value: Any) -> dict[str, Any]:
    """One envelope entry as the ``fact`` macro draws it: a few keys in words, a time as UTC,
    other mappings and lists as JSON."""
    if key == "weights" and isinstance(value, Mapping):
        classes = value.get("num_classes")
        return {"text": value.get("loaded"), "dim": f"(requested {value.get('requested')}"
                f"{f', {classes} classes' if classes else ''})"}
    if key == "preprocessing" and isinstance(value, Mapping):
        return _preprocessing(value)
    if key == "precision" and isinstance(value, Mapping):
        auto = value.get("autocast")
        return {"text": f"{value.get('dtype')}" + (f" (autocast {auto})" if auto else "")}
    if key == "inputs" and isinstance(value, list):
        return {"codes": [str(v) for v in value]}
    if key == "selection" and isinstance(value, Mapping):
        modules = value.get("modules")
        shown = ", ".join(f"{k} {json.dumps(v)}" for k, v in value.items() if k != "modules")
        return {"text": shown + (f"; {len(modules)} modules" if isinstance(modules, list) else "")}
    if key == "started" and isinstance(value, (int, float)):
        with suppress(OverflowError, OSError, ValueError):  # beyond the platform's dates
            return {"time": datetime.fromtimestamp(value, timezone.utc).isoformat(timespec="seconds")}
    if isinstance(value, (Mapping, list)):
        return {"json": json.dumps(value, default=str)}
    return {"text": "" if value is None else value if isinstance(value, str) else json.dumps(value)}


def _preprocessing(pre: Mapping[str, Any]) -> dict[str, Any]:
    """``resize 256 → crop 224 (bilinear); mean ...; std ...; 3 channels``, then the rest."""
    size = " → ".join(f"{k} {pre[k]}" for k in ("resize", "crop") if pre.get(k) is not None)
    if pre.get("interpolation"):
        size += f" ({pre['interpolation']})"
    parts = [size.strip()] + [f"{k} {_short(pre[k])}" for k in ("mean", "std")
                              if pre.get(k) is not None]
    if pre.get("channels") is not None:
        parts.append(f"{pre['channels']} channels")
    known = {"resize", "crop", "interpolation", "mean", "std", "channels", "origin"}
    parts += [f"{k} {_short(v)}" for k, v in pre.items() if k not in known and v is not None]
    return {"text": "; ".join(p for p in parts if p),
            "dim": f"(from {pre['origin']})" if pre.get("origin") else None}


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def cell(text: Any, raw: Any = None, cls: str = "", *, code: bool = False) -> dict[str, Any]:
    """One table cell: its text, its sort key (``data-v``: floats as ``repr``, None and
    non-finite empty), its class, and whether it is code."""
    unknown = raw is None or (isinstance(raw, float) and not math.isfinite(raw))
    key = "" if unknown else repr(float(raw)) if isinstance(raw, float) else str(raw)
    return {"text": text, "v": key, "cls": cls, "code": code}


#: The columns of :func:`lead_cells` and of :func:`stats_cells`: (title, sort type).
LEAD_COLUMNS = (("#", "num"), ("layer", "text"), ("type", "text"), ("call", "num"))
STATS_COLUMNS = tuple((title, "num") for title in ("mean", "std", "min", "max", "zeros", "non-finite"))


def lead_cells(i: int, row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The first cells of a layer call's row: its index, name, type and call."""
    kind, call = row.get("type") or "", row.get("call") or 0
    return [cell(i, i, "n dim"), cell(row["name"], row["name"], code=True),
            cell(kind, kind, "dim"), cell(call, call, "n")]


def strong(n: int) -> dict[str, Any]:
    """A count of non-finite values: bold unless zero."""
    return cell(n, n, "n strong" if n else "n")


def num(value: Any) -> dict[str, Any]:
    """A number's cell, as the terminal tables write it."""
    return cell(fmt_float(value), value, "n")


def stats_cells(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A call's mean, std, min, max, zero fraction and non-finite count."""
    zero = finite(row.get("zero_fraction"))
    return [*(num(row.get(k)) for k in ("mean", "std", "min", "max")),
            cell("-" if zero is None else f"{zero:.1%}", zero, "n"),
            strong(int(row.get("nonfinite") or 0))]


def page_row(row: Mapping[str, Any], cells: list[dict[str, Any]], cls: str = "") -> dict[str, Any]:
    """One row of a page's table: its name (for the filter), class and cells."""
    return {"name": row["name"], "cls": cls, "cells": cells}
