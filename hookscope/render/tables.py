"""Rich tables shared by the commands: the one table style and its columns, a run header,
layer statistics and predictions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from copy import copy
from dataclasses import dataclass, replace
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType, RenderResult
from rich.measure import Measurement
from rich.style import StyleType
from rich.table import Column, Table
from rich.text import Text

from hookscope.core.files import format_shape, format_shapes
from hookscope.numerics.health import DEAD as ZERO_WARN


@dataclass
class Col(Column):
    """A column that ``hide``s at a narrow width: the lowest first (None: never)."""

    hide: int | None = None


def col(header: str, hide: int | None = None, *, style: str = "",
        justify: JustifyMethod = "left") -> Col:
    """A column whose cells fold at a narrow width (Rich narrows the widest columns first),
    so no number, shape or name is ever cut short; ``hide``: its hiding priority."""
    return Col(header, style=style, justify=justify, overflow="fold", hide=hide)


def num(header: str, hide: int | None = None, *, style: str = "") -> Col:
    """A right-aligned column of numbers."""
    return col(header, hide, style=style, justify="right")


def call_hide(rows: Sequence[Mapping[str, Any]], *, when_all_zero: int, otherwise: int) -> int:
    """The ``call`` column's hiding priority: it says little when every call is the first."""
    return when_all_zero if all(r.get("call", 0) == 0 for r in rows) else otherwise


class DataTable(Table):
    """The one table style: a bold header rule, two spaces between columns, no borders.
    Cells given as strings are shown literally (no markup, so names may hold ``[``)."""

    def __init__(self, columns: Sequence[Column | str], *, title: str | None = None) -> None:
        super().__init__(*(c if isinstance(c, Column) else col(c) for c in columns),
                         title=title, title_justify="left", box=box.SIMPLE_HEAD,
                         header_style="bold", show_edge=False, pad_edge=False,
                         collapse_padding=True)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """The table, less its columns of lowest ``hide`` priority while it is wider than
        the console, and a dim line naming what was hidden."""
        shown, hidden, wide = self, [], options.update_width(1 << 16)
        order = sorted((c.hide, -i) for i, c in enumerate(self.columns)
                       if isinstance(c, Col) and c.hide is not None)
        for _, i in order:
            if Measurement.get(console, wide, shown).maximum <= options.max_width:
                break
            hidden.append(-i)
            shown = copy(self)
            kept = [c for j, c in enumerate(self.columns) if j not in hidden]
            shown.columns = [replace(c, _index=j) for j, c in enumerate(kept)]  # Rich pads by it
        yield from Table.__rich_console__(shown, console, options)
        if hidden:
            names = ", ".join(self.columns[i].header for i in sorted(hidden))  # type: ignore[misc]
            yield Text(f"hidden at width {options.max_width}: {names} (all in --format json/csv "
                       "or a wider terminal)", style="dim")

    def add_row(self, *cells: RenderableType | None, style: StyleType | None = None,
                end_section: bool = False) -> None:
        """Add a row; strings are shown literally."""
        super().add_row(*(c if isinstance(c, Text) else Text("" if c is None else str(c))
                          for c in cells), style=style, end_section=end_section)


def fmt_pct(value: float | None, digits: int = 2, *, sign: bool = False) -> str:
    """A fraction as a percentage; None and non-finite values (null in JSON) as ``-``."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:+.{digits}%}" if sign else f"{value:.{digits}%}"


def fmt_float(value: float | None, digits: int = 4) -> str:
    """Compact float text; None and non-finite values (null in JSON) as ``-``."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def joined(*parts: str | Text | tuple[str, StyleType], sep: str = "  ") -> Text:
    """Parts (text, or ``(text, style)``) joined by ``sep`` into one line, folded at a
    narrow width."""
    return Text(sep).join(Text.assemble(p) for p in parts)


def header(doc: Mapping[str, Any], extra: str = "") -> Text:
    """One line: model, weights loaded, device, number of inputs, input shape and ``extra``."""
    parts: list[str | tuple[str, StyleType]] = [
        (str(doc.get("model")), "bold"), (f"weights: {doc['weights']['loaded']}", "cyan"),
        f"device: {doc.get('device')}", f"inputs: {len(doc.get('inputs', []))}"]
    if doc.get("input_shape"):
        parts.append(f"input: {format_shape(doc['input_shape'])}")
    return joined(*parts, *([extra] if extra else []))


def health(row: Mapping[str, Any]) -> str:
    """``bad`` for a call with non-finite values, ``dead`` for one of at least
    :data:`ZERO_WARN` zeros, else ``""``: red and yellow in every table."""
    zero = row.get("zero_fraction")
    if int(row.get("nonfinite") or 0):
        return "bad"
    return "dead" if zero is not None and math.isfinite(zero) and zero >= ZERO_WARN else ""


def count_text(count: int) -> Text:
    """A count of non-finite values: bold red unless zero."""
    return Text(str(count), style="bold red") if count else Text("0")


def _stats_columns(rows: Sequence[Mapping[str, Any]], input_stats: bool, per_channel: bool,
                   percentiles: Sequence[str]) -> list[Column | str]:
    # Hidden first: input shapes, type, call (when all 0), min/max, input stats, call, #,
    # dead channels, and last the percentiles, which the user asked for by name.
    columns: list[Column | str] = [
        num("#", 10, style="dim"), "layer", col("type", 2, style="dim"),
        num("call", call_hide(rows, when_all_zero=3, otherwise=9)), col("input", 1), "output",
        num("mean"), num("std"), num("min", 4), num("max", 5), num("zeros"), num("non-finite")]
    if input_stats:
        columns += [num("in mean", 7), num("in std", 6), num("in non-finite", 8)]
    if per_channel:
        columns.append(num("dead ch.", 11))
    return columns + [num(f"p{key}", 12) for key in percentiles]


_STYLES = {"bad": "red", "dead": "yellow"}


def shape_text(row: Mapping[str, Any]) -> str:
    """A call's output shape, or its shapes joined by ``;``."""
    shapes = row.get("output_shapes") or []
    return format_shapes(shapes) if len(shapes) > 1 else format_shape(row.get("output_shape"))


def stats_table(rows: Sequence[Mapping[str, Any]], *, input_stats: bool = False,
                per_channel: bool = False, percentiles: Sequence[str] = ()) -> DataTable:
    """Per-call statistics; non-finite rows red, mostly-zero ones yellow; optionally the dead
    channels and the percentiles."""
    table = DataTable(_stats_columns(rows, input_stats, per_channel, percentiles))
    for i, row in enumerate(rows):
        cells: list[RenderableType] = [
            str(i), row["name"], row["type"], str(row["call"]),
            format_shapes(row.get("input_shapes") or []), shape_text(row),
            *(fmt_float(row.get(k)) for k in ("mean", "std", "min", "max")),
            fmt_pct(row.get("zero_fraction"), 1), count_text(int(row.get("nonfinite") or 0))]
        if input_stats:
            ins = row.get("input_stats") or {}
            cells += [fmt_float(ins.get("mean")), fmt_float(ins.get("std")),
                      count_text(int(ins.get("nonfinite") or 0))]
        if per_channel:
            dead = sum(1 for ch in row.get("channels") or []
                       if (ch.get("zero_fraction") or 0) >= ZERO_WARN)
            cells.append(Text(str(dead), style="yellow") if dead else "0")
        values = row.get("percentiles") or {}
        cells += [fmt_float(values.get(key)) for key in percentiles]
        table.add_row(*cells, style=_STYLES.get(health(row)))
    return table


#: Shown where an input's logits held NaN or Inf, instead of a ranking that means nothing.
NONFINITE_LOGITS = "non-finite logits: no prediction"


def predictions_table(inputs: Sequence[str],
                      predictions: Sequence[Sequence[Mapping[str, Any]] | None]) -> DataTable:
    """Top predictions per input."""
    table = DataTable(["input", num("rank"), num("class"),
                       "label", num("prob")], title="top predictions")
    for name, preds in zip(inputs, predictions, strict=False):
        if preds is None:
            table.add_row(name, "", "", Text(NONFINITE_LOGITS, style="red"), "",
                          end_section=True)
            continue
        for rank, p in enumerate(preds, 1):
            table.add_row(name if rank == 1 else "", str(rank), str(p["index"]),
                          p.get("label") or "", fmt_pct(p["prob"]),
                          end_section=rank == len(preds))
    return table


def stats_view(doc: Mapping[str, Any], *, input_stats: bool = False, per_channel: bool = False,
               percentiles: Sequence[str] = ()) -> RenderableType:
    """The whole ``stats`` table output."""
    table = stats_table(doc["layers"], input_stats=input_stats, per_channel=per_channel,
                        percentiles=percentiles)
    parts: list[RenderableType] = [header(doc, f"layer calls: {len(doc['layers'])}"), table]
    if doc.get("predictions"):
        parts.append(predictions_table(doc["inputs"], doc["predictions"]))
    return Group(*parts)
