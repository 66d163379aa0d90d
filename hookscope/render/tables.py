"""Rich tables shared by the commands: the one table style and its columns, a run header,
layer statistics and predictions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.style import StyleType
from rich.table import Column, Table
from rich.text import Text

from hookscope.core.files import format_shape, format_shapes
from hookscope.numerics.health import DEAD as ZERO_WARN


def col(header: str, *, style: str = "") -> Column:
    """A column whose cells fold at a narrow width (Rich narrows the widest columns first),
    so no number, shape or name is ever cut short or hidden."""
    return Column(header, style=style, overflow="fold")


def num(header: str, *, style: str = "") -> Column:
    """A right-aligned column of numbers, folded as :func:`col`'s cells are."""
    return Column(header, style=style, justify="right", overflow="fold")


class DataTable(Table):
    """The one table style: a bold header rule, two spaces between columns, no borders.
    Cells given as strings are shown literally (no markup, so names may hold ``[``)."""

    def __init__(self, columns: Sequence[Column | str], *, title: str | None = None) -> None:
        super().__init__(*(c if isinstance(c, Column) else col(c) for c in columns),
                         title=title, title_justify="left", box=box.SIMPLE_HEAD,
                         header_style="bold", show_edge=False, pad_edge=False,
                         collapse_padding=True)

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


def fmt_count(value: float | None, unit: str = "") -> str:
    """A count in thousands, three significant digits (one decimal from 100): ``1.81G``,
    ``115.6M``, ``512``; with a ``unit``, spaced and with SI's ``k``: ``46.8 MB``, ``602.1 kB``.
    None (not measured) is ``n/a``."""
    if value is None:
        return "n/a"
    step = 0
    while abs(value) >= 999.95 and step < len(_PREFIXES) - 1:
        value /= 1000
        step += 1
    if step == 0 and float(value).is_integer():
        text = str(int(value))
    else:
        text = f"{value:.1f}".removesuffix(".0") if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {_PREFIXES[step]}{unit}" if unit else text + _PREFIXES[step].upper()


_PREFIXES = ("", "k", "M", "G", "T", "P")


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


_STYLES = {"bad": "red", "dead": "yellow"}


def shape_text(row: Mapping[str, Any]) -> str:
    """A call's output shape, or its shapes joined by ``;``."""
    shapes = row.get("output_shapes") or []
    return format_shapes(shapes) if len(shapes) > 1 else format_shape(row.get("output_shape"))


def stats_table(rows: Sequence[Mapping[str, Any]], *, input_stats: bool = False,
                per_channel: bool = False, percentiles: Sequence[str] = ()) -> DataTable:
    """Per-call statistics; non-finite rows red, mostly-zero ones yellow; optionally the dead
    channels and the percentiles."""
    columns: list[Column | str] = [
        num("#", style="dim"), "layer", col("type", style="dim"), num("call"), "input",
        "output", *map(num, ("mean", "std", "min", "max", "zeros", "non-finite"))]
    if input_stats:
        columns += map(num, ("in mean", "in std", "in non-finite"))
    if per_channel:
        columns.append(num("dead ch."))
    table = DataTable(columns + [num(f"p{key}") for key in percentiles])
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
