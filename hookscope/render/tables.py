"""Rich tables shared by the commands: a run header, layer statistics, predictions, and
:class:`FitTable`, the one table every view draws, which fits itself to the width it gets."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType, RenderResult
from rich.measure import Measurement
from rich.style import StyleType
from rich.table import Table
from rich.text import Text

from hookscope.core.output import format_shape, format_shapes
from hookscope.numerics.health import DEAD as ZERO_WARN

#: Priority of a column (or label part) that is never hidden; lower priorities hide first.
REQUIRED = 100
#: Width of piped and file output (see ``console.stdout``): names are never shortened there.
PIPE_WIDTH = 200
#: A shortened name keeps at least this many cells.
NAME_MIN = 10
_UNBOUNDED = 100_000
_NAME_BREAK = re.compile(r"[./]")
_NAME_SLACK = 4


def data_table(**kwargs: Any) -> Table:
    """The one table style: a bold header rule, two spaces between columns, no borders."""
    return Table(box=box.SIMPLE_HEAD, header_style="bold", show_edge=False, pad_edge=False,
                 collapse_padding=True, **kwargs)


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


def shorten_name(text: Text, width: int) -> Text:
    """Cut a dotted name (or a path) from the left to ``width`` cells, marked with ``…``.

    Cuts just after a ``.`` or ``/`` (``…layer4.1.conv2``) unless that would waste more than
    a few cells, since the end of a name is what tells layers apart.
    """
    if text.cell_len <= width:
        return text
    plain = text.plain
    room = max(width - 1, 1)
    start = len(plain) - room
    breaks = [m.end() for m in _NAME_BREAK.finditer(plain) if start <= m.end() < len(plain)]
    if breaks and breaks[0] - start <= _NAME_SLACK:
        start = breaks[0]
    short = Text("…", style=text.style)
    short.append_text(text[start:])
    return short


def footnote(hidden: Iterable[str], width: int, *, shortened: bool = False,
             where: str = "") -> Text:
    """The dim line under a view that had to hide or shorten something to fit ``width``."""
    names = list(dict.fromkeys(hidden))
    said = [f"hidden{where} at width {width}: {', '.join(names)}"] if names else []
    if shortened:
        said.append("long names shortened from the left")
    return Text(f"{'; '.join(said)} (all in --format json/csv or a wider terminal)",
                style="dim")


def as_text(cell: RenderableType | None) -> Text:
    """A cell as Text: strings are taken literally (no markup, so names may hold ``[``)."""
    if isinstance(cell, Text):
        return cell
    return Text("" if cell is None else str(cell))


@dataclass(frozen=True)
class Col:
    """One column of a :class:`FitTable`: the lowest ``priority`` hides first (``REQUIRED``
    never); only ``wrap`` columns (free text) may wrap; ``name`` columns (dotted names,
    paths) are shortened from the left as a last resort."""

    header: str
    priority: int = REQUIRED
    justify: JustifyMethod = "left"
    style: str = ""
    wrap: bool = False
    name: bool = False


def num(header: str, priority: int = REQUIRED, *, style: str = "") -> Col:
    """A right-aligned column of numbers."""
    return Col(header, priority, justify="right", style=style)


@dataclass
class Row:
    """One row of a :class:`FitTable`."""

    cells: list[Text]
    style: StyleType | None = None
    end_section: bool = False


@dataclass
class Fit:
    """What a :class:`FitTable` shows at one width: the columns, and shortened names' widths."""

    shown: list[int]
    limits: dict[int, int] = field(default_factory=dict)


class FitTable:
    """A data table that hides its least important columns to fit the width it is drawn at.

    Columns go lowest priority first (ties: the rightmost); if even the ``REQUIRED`` ones do
    not fit, ``name`` columns are shortened, except at ``PIPE_WIDTH`` and wider. A dim
    footnote says what was hidden.
    """

    def __init__(self, columns: Sequence[Col], *, title: str | None = None) -> None:
        self.columns = list(columns)
        self.title = title
        self.rows: list[Row] = []
        self._needs: dict[tuple[int, int | None, bool], int] = {}

    def add_row(self, *cells: RenderableType | None, style: StyleType | None = None,
                end_section: bool = False) -> None:
        """Add a row; strings are shown literally."""
        self.rows.append(Row([as_text(c) for c in cells], style, end_section))
        self._needs.clear()

    def _cells(self, index: int, limit: int | None = None) -> list[Text]:
        cells = [row.cells[index] for row in self.rows]
        return cells if limit is None else [shorten_name(c, limit) for c in cells]

    def _need(self, console: Console, options: ConsoleOptions, index: int,
              limit: int | None = None, *, wrap: bool = False) -> int:
        """A column's widest cell, or with ``wrap`` (for a wrap column) its longest word."""
        wrap = wrap and self.columns[index].wrap
        key = (index, limit, wrap)
        if key not in self._needs:
            sizes = [Measurement.get(console, options, c) for c in self._cells(index, limit)]
            self._needs[key] = max((m.minimum if wrap else m.maximum for m in sizes), default=1)
        return self._needs[key]

    def _width(self, console: Console, options: ConsoleOptions, shown: list[int],
               needs: Sequence[int] | Mapping[int, int]) -> int:
        """The narrowest this table can be drawn with ``shown`` columns, borders included."""
        skeleton = data_table()
        for i in shown:
            skeleton.add_column(self.columns[i].header, min_width=needs[i])
        return Measurement.get(console, options.update_width(_UNBOUNDED), skeleton).minimum

    def fit(self, console: Console, options: ConsoleOptions) -> Fit:
        """Choose the columns (and name widths) for ``options.max_width``.

        Rows stay one line where hiding columns can do it: free text wraps only once the
        ``REQUIRED`` columns alone are too wide.
        """
        width, wide = options.max_width, options.update_width(_UNBOUNDED)
        needs = [self._need(console, wide, i) for i in range(len(self.columns))]
        fit = Fit(list(range(len(self.columns))))
        order = sorted((c.priority, -i) for i, c in enumerate(self.columns)
                       if c.priority < REQUIRED)
        for _, minus_index in order:
            if self._width(console, options, fit.shown, needs) <= width:
                break
            fit.shown.remove(-minus_index)
        if self._width(console, options, fit.shown, needs) > width:
            needs = [self._need(console, wide, i, wrap=True) for i in range(len(needs))]
        excess = self._width(console, options, fit.shown, needs) - width
        names = sorted((i for i in fit.shown if self.columns[i].name), key=lambda i: -needs[i])
        for i in names if excess > 0 and width < PIPE_WIDTH else []:
            fit.limits[i] = max(needs[i] - excess, NAME_MIN)
            excess -= needs[i] - self._need(console, wide, i, fit.limits[i])
        return fit

    def table(self, fit: Fit, widths: Mapping[int, int] | None = None) -> Table:
        """The Rich table for one fit; ``widths`` pins columns (their headers then wrap)."""
        table = data_table(title=self.title, title_justify="left")
        for i in fit.shown:
            col = self.columns[i]
            table.add_column(Text(col.header, no_wrap=False), justify=col.justify,
                             style=col.style, no_wrap=not col.wrap,
                             overflow="fold" if col.wrap else "ellipsis",
                             width=(widths or {}).get(i))
        cells = [self._cells(i, fit.limits.get(i)) for i in fit.shown]
        for r, row in enumerate(self.rows):
            table.add_row(*(column[r] for column in cells), style=row.style,
                          end_section=row.end_section)
        return table

    def render(self, console: Console, options: ConsoleOptions) -> tuple[Table, Fit]:
        """The table drawn at ``options.max_width``, and the fit it uses."""
        fit = self.fit(console, options)
        wide = options.update_width(_UNBOUNDED)
        needs = {i: self._need(console, wide, i, fit.limits.get(i)) for i in fit.shown}
        headers = {i: Measurement.get(console, wide, Text(self.columns[i].header))
                   for i in fit.shown}
        whole = {i: max(needs[i], headers[i].maximum) for i in fit.shown}
        if self._width(console, options, fit.shown, whole) <= options.max_width:
            return self.table(fit), fit
        # Too wide with whole headers and free text: pin the columns that may not wrap to
        # their cells (or the header's longest word), so Rich narrows only the rest.
        pinned = {i: max(needs[i], headers[i].minimum) for i in fit.shown
                  if not self.columns[i].wrap}
        return self.table(fit, pinned), fit

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table, fit = self.render(console, options)
        yield table
        hidden = [c.header for i, c in enumerate(self.columns) if i not in fit.shown]
        if hidden or fit.limits:
            yield footnote(hidden, options.max_width, shortened=bool(fit.limits))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.render(console, options)[0])


@dataclass(frozen=True)
class Part:
    """One piece of a one-line label, hidden by priority like a :class:`Col`; ``what`` is
    named in the footnote, ``sep`` goes before it unless it comes first."""

    what: str
    text: Text
    priority: int = REQUIRED
    sep: str = "  "
    name: bool = False


def _join(parts: Sequence[Part]) -> Text:
    line = Text()
    for i, part in enumerate(parts):
        if i:
            line.append(part.sep)
        line.append_text(part.text)
    return line


def fit_parts(parts: Sequence[Part], width: int) -> tuple[Text, list[str], bool]:
    """Join ``parts`` into one line of at most ``width`` cells, hiding low priorities first.

    Returns the line, what was hidden, and whether a name had to be shortened.
    """
    shown = dict(enumerate(parts))
    order = sorted((p.priority, -i) for i, p in enumerate(parts) if p.priority < REQUIRED)
    for _, minus_index in order:
        if _join(list(shown.values())).cell_len <= width:
            break
        del shown[-minus_index]
    excess = _join(list(shown.values())).cell_len - width
    shortened = False
    for i, part in list(shown.items()) if width < PIPE_WIDTH else []:
        if part.name and excess > 0:
            short = shorten_name(part.text, max(part.text.cell_len - excess, NAME_MIN))
            excess -= part.text.cell_len - short.cell_len
            shown[i] = replace(part, text=short)
            shortened = True
    hidden = [p.what for i, p in enumerate(parts) if i not in shown]
    return _join(list(shown.values())), hidden, shortened


class Header:
    """A line of :class:`Part` s that drops its least important parts rather than wrap."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self.parts = list(parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = fit_parts(self.parts, options.max_width)[0]
        line.overflow = "fold"
        yield line

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, _join(self.parts).cell_len)


def header(doc: Mapping[str, Any], extra: str = "") -> Header:
    """One line: model, weights loaded, device, number of inputs, input shape and ``extra``
    (hidden first at a narrow width, then the shape, the device, the count)."""
    parts = [Part("model", Text(str(doc.get("model")), style="bold"), name=True),
             Part("weights", Text(f"weights: {doc['weights']['loaded']}", style="cyan")),
             Part("device", Text(f"device: {doc.get('device')}"), 3),
             Part("inputs", Text(f"inputs: {len(doc.get('inputs', []))}"), 4)]
    if doc.get("input_shape"):
        parts.append(Part("input", Text(f"input: {format_shape(doc['input_shape'])}"), 2))
    if extra:
        parts.append(Part("extra", Text(extra), 1))
    return Header(parts)


def count_text(count: int) -> Text:
    """A count of non-finite values: bold red unless zero."""
    return Text(str(count), style="bold red") if count else Text("0")


def call_priority(rows: Sequence[Mapping[str, Any]], *, when_all_zero: int, otherwise: int) -> int:
    """A ``call`` column says little when every module ran once, so it may go early then."""
    return when_all_zero if all(int(r.get("call") or 0) == 0 for r in rows) else otherwise


def _stats_columns(rows: Sequence[Mapping[str, Any]], input_stats: bool, per_channel: bool,
                   percentiles: Sequence[str]) -> list[Col]:
    # Hidden first: input shapes, type, call (when all 0), min/max, input stats, call, #,
    # dead channels, and last the percentiles, which the user asked for by name.
    columns = [num("#", 10, style="dim"), Col("layer", name=True), Col("type", 2, style="dim"),
               num("call", call_priority(rows, when_all_zero=3, otherwise=9)), Col("input", 1),
               Col("output"), num("mean"), num("std"), num("min", 4), num("max", 5),
               num("zeros"), num("non-finite")]
    if input_stats:
        columns += [num("in mean", 7), num("in std", 6), num("in non-finite", 8)]
    if per_channel:
        columns.append(num("dead ch.", 11))
    columns += [num(f"p{key}", 12) for key in percentiles]
    return columns


def shape_text(row: Mapping[str, Any]) -> str:
    """A call's output shape, or its shapes joined by ``;``."""
    shapes = row.get("output_shapes") or []
    return format_shapes(shapes) if len(shapes) > 1 else format_shape(row.get("output_shape"))


def stats_table(rows: Sequence[Mapping[str, Any]], *, input_stats: bool = False,
                per_channel: bool = False, percentiles: Sequence[str] = ()) -> FitTable:
    """Per-call statistics; non-finite rows red, mostly-zero ones yellow; optionally the dead
    channels and the percentiles."""
    table = FitTable(_stats_columns(rows, input_stats, per_channel, percentiles))
    for i, row in enumerate(rows):
        zero, nonfinite = row.get("zero_fraction"), int(row.get("nonfinite") or 0)
        style = "red" if nonfinite else ("yellow" if zero is not None and zero >= ZERO_WARN else None)
        cells: list[RenderableType] = [
            str(i), row["name"], row["type"], str(row["call"]),
            format_shapes(row.get("input_shapes") or []), shape_text(row),
            *(fmt_float(row.get(k)) for k in ("mean", "std", "min", "max")),
            fmt_pct(zero, 1), count_text(nonfinite)]
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
        table.add_row(*cells, style=style)
    return table


#: Shown where an input's logits held NaN or Inf, instead of a ranking that means nothing.
NONFINITE_LOGITS = "non-finite logits: no prediction"


def predictions_table(inputs: Sequence[str],
                      predictions: Sequence[Sequence[Mapping[str, Any]] | None]) -> FitTable:
    """Top predictions per input."""
    table = FitTable([Col("input", name=True), num("rank", 1),
                      num("class"), Col("label", wrap=True),
                      num("prob")], title="top predictions")
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
