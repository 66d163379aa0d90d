"""Rich views for ``models`` (a table), ``layers`` (a tree) and ``debug`` (trace lines)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.text import Text
from rich.tree import Tree

from hookscope.core.files import Output, dumps_ndjson, format_shape, write
from hookscope.render import console
from hookscope.render.tables import Col, FitTable, Part, fit_parts, fmt_float, footnote, header


def models_table(doc: Mapping[str, Any]) -> FitTable:
    """One row per model: name, task, the DEFAULT weights and every weights enum member."""
    # Hidden first: task, then the list of every weights member (json/csv keep both).
    table = FitTable([Col("model", name=True), Col("task", 1, style="dim"),
                      Col("default weights", style="cyan"), Col("all weights", 2, wrap=True)],
                     title=f"{len(doc['models'])} model(s)")
    for m in doc["models"]:
        weights = ", ".join(m["weights"]) if m["weights"] else Text("none", style="dim")
        table.add_row(m["name"], m["task"], m.get("default") or Text("-", style="dim"), weights)
    return table


def _shape_text(call: Mapping[str, Any]) -> str:
    shapes = call.get("output_shapes") or []
    if len(shapes) > 1:
        return f"({_shapes(shapes)})"
    if call.get("output_shape") is not None:
        return format_shape(call["output_shape"])
    return "-"


def _calls_text(calls: Sequence[Mapping[str, Any]]) -> Text:
    if not calls:
        return Text("not called", style="dim")
    if len(calls) == 1:
        return Text("→ " + _shape_text(calls[0]), style="green")
    text = Text("→ ", style="green")
    for i, call in enumerate(calls):
        if i:
            text.append("  ")
        text.append(f"#{i} ", style="dim")
        text.append(_shape_text(call), style="green")
    return text


_TRAINABLE = {True: ("trainable", "dim"), False: ("frozen", "yellow")}
_COUNT_UNITS = ("", "K", "M", "G", "T", "P")
_BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def _scaled(value: float) -> tuple[str, int]:
    """``value`` in thousands: three significant digits, one decimal from 100 (115.6, 512)."""
    unit = 0
    while abs(value) >= 999.95 and unit < len(_COUNT_UNITS) - 1:
        value /= 1000
        unit += 1
    if unit == 0 and float(value).is_integer():
        return str(int(value)), 0
    text = f"{value:.1f}".removesuffix(".0") if abs(value) >= 100 else f"{value:.3g}"
    return text, unit


def human_count(value: float) -> str:
    """A count in SI units: ``1.81G``, ``115.6M``, ``512``."""
    text, unit = _scaled(value)
    return text + _COUNT_UNITS[unit]


def human_bytes(value: float) -> str:
    """Bytes in decimal units: ``46.8 MB``, ``602.1 kB``, ``512 B``."""
    text, unit = _scaled(value)
    return f"{text} {_BYTE_UNITS[unit]}"


def _parts(row: Mapping[str, Any], name: str) -> list[Part]:
    """A node's label, most important first; hidden first: trainable, own params, MACs,
    params, shapes, type (the name never)."""
    own, total = row["params"], row["params_total"]
    parts = [Part("name", Text(name, style="bold"), name=True),
             Part("type", Text(row["type"], style="magenta"), 6)]
    parts.append(Part("params", Text(f"{total:,} params", style="cyan" if total else "dim"), 4))
    if own != total:
        parts.append(Part("own params", Text(f"(own {own:,})", style="dim"), 2, sep=" "))
    if row.get("macs"):  # zero (ReLU, BatchNorm) and unmeasured (no input) stay quiet
        parts.append(Part("MACs", Text(f"{human_count(row['macs'])} MACs", style="blue"), 3))
    if row.get("trainable") is not None:
        words, style = _TRAINABLE.get(row["trainable"], ("partly trainable", "yellow"))
        parts.append(Part("trainable", Text(words, style=style), 1))
    parts.append(Part("shapes", _calls_text(row.get("calls") or []), 5))
    return parts


def _batch(doc: Mapping[str, Any]) -> int | None:
    """The batch size of the forward pass the shapes and FLOPs come from."""
    calls = doc["root"].get("calls") or []
    shapes = calls[0].get("input_shapes") if calls else None
    return shapes[0][0] if shapes and shapes[0] else None


def _totals_parts(doc: Mapping[str, Any]) -> list[Part]:
    """The line under the tree: MACs, FLOPs and bytes of the whole model; hidden first:
    parameter bytes by dtype, input, FLOPs, activations, batch, parameter bytes."""
    totals = doc["totals"]
    parts = [Part("totals", Text("totals:", style="bold"))]
    if totals.get("macs") is not None:
        parts += [Part("MACs", Text(f"{human_count(totals['macs'])} MACs", style="blue"),
                       sep=" "),
                  Part("FLOPs", Text(f"({human_count(totals['flops'])} FLOPs)", style="dim"),
                       3, sep=" ")]
        batch = _batch(doc)
        if batch is not None:
            parts.append(Part("batch", Text(f"for batch {batch}"), 5, sep=" "))
    by_dtype = totals["params_bytes"]
    parts.append(Part("params bytes", Text(f"params {human_bytes(sum(by_dtype.values()))}",
                                           style="cyan"), 6))
    if len(by_dtype) > 1:
        each = ", ".join(f"{dtype} {human_bytes(n)}" for dtype, n in by_dtype.items())
        parts.append(Part("params by dtype", Text(f"({each})", style="dim"), 1, sep=" "))
    if totals.get("activation_bytes") is not None:
        parts.append(Part("activations", Text(
            f"activations {human_bytes(totals['activation_bytes'])}"), 4))
    if totals.get("input_bytes") is not None:
        parts.append(Part("input", Text(f"input {human_bytes(totals['input_bytes'])}"), 2))
    return parts


class LayersTree:
    """The module tree, each label fitted to the width left by the guides (4 cells a level),
    then a line of totals when the document has them."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width, root, totals = options.max_width, self.doc["root"], self.doc["totals"]
        summary = Text(f"[{totals['modules']} modules, {totals['trainable_params']:,} trainable]",
                       style="dim")
        label, hidden, shortened = fit_parts([*_parts(root, self.doc.get("model") or root["type"]),
                                              Part("module counts", summary, 1)], width)
        tree = Tree(label, guide_style="dim")
        nodes: dict[str, tuple[Tree, int]] = {"": (tree, 0)}
        for row in self.doc["layers"]:
            name = row["name"]
            # A parent is always listed before its children (named_modules order).
            node, depth = nodes.get(name.rpartition(".")[0], (tree, 0))
            label, lost, short = fit_parts(_parts(row, name), width - 4 * (depth + 1))
            nodes[name] = (node.add(label), depth + 1)
            hidden += lost
            shortened = shortened or short
        yield tree
        if "params_bytes" in totals:
            line, lost, _ = fit_parts(_totals_parts(self.doc), width)
            hidden += lost
            yield line
        if hidden or shortened:
            yield footnote(hidden, width, shortened=shortened, where=" in some labels")


def layers_view(doc: Mapping[str, Any]) -> RenderableType:
    """The whole ``layers`` output: a header line and the tree."""
    return Group(header(doc), LayersTree(doc))


def _who(event: Mapping[str, Any]) -> str:
    name = event.get("name")
    if name is None:
        return "(before any module ran)"
    shown = name if name else "(the model itself)"
    call = event.get("call")
    return f"{shown}#{call}" if call else shown


def _stats_text(stats: Mapping[str, Any] | None) -> Text:
    text = Text()
    if not stats:
        return text
    text.append(f"mean {fmt_float(stats.get('mean'))}  std {fmt_float(stats.get('std'))}")
    text.append(f"  min {fmt_float(stats.get('min'))}  max {fmt_float(stats.get('max'))}",
                style="dim")
    nonfinite = int(stats.get("nonfinite") or 0)
    if nonfinite:
        text.append(f"  non-finite {nonfinite}", style="bold red")
    return text


def _shapes(shapes: Sequence[Sequence[int]] | None) -> str:
    if not shapes:
        return "-"
    return ", ".join(format_shape(s) for s in shapes)


_LEADS = {"enter": ("→ ", "dim"), "exit": ("← ", "dim"),
          "nonfinite": ("!! first non-finite: ", "bold red")}


def _nonfinite(stats: Sequence[Mapping[str, Any]]) -> int:
    return sum(int(s.get("nonfinite") or 0) for s in stats)


def trace_line(event: Mapping[str, Any]) -> Text:
    """One line of the live trace for an ``enter``, ``exit``, ``nonfinite`` or ``error`` event."""
    kind, indent = event["event"], "  " * max(int(event.get("depth") or 0) - 1, 0)
    if kind == "error":
        text = Text("✗ error in ", style="bold red")
        text.append(_who(event), style="bold red")
        if event.get("type"):
            text.append(f" {event['type']}", style="magenta")
        text.append(f"  in {_shapes(event.get('input_shapes'))}")
        text.append(f"\n  {event.get('exception')}: {event.get('message')}", style="red")
        return text
    lead, style = _LEADS[kind]
    text = Text(indent)
    text.append(lead, style=style)
    bad = kind == "nonfinite" or int(event.get("nonfinite") or 0)
    text.append(_who(event), style="bold red" if bad else "bold")
    text.append(f" {event['type']}", style="magenta")
    if kind == "enter":
        text.append(f"  in {_shapes(event.get('input_shapes'))}")
    elif kind == "exit":
        text.append(f"  out {_shapes(event.get('output_shapes'))}  ")
        text.append_text(_stats_text(event))
    else:
        inputs, outputs = event.get("input_stats") or [], event.get("output_stats") or []
        if event.get("source") == "input":
            text.append(f"  the model's input already holds {_nonfinite(inputs)} non-finite "
                        "value(s); this is the first module to receive it", style="red")
        else:
            text.append(f"  inputs finite, output has {_nonfinite(outputs)} non-finite "
                        "value(s)", style="red")
        for i, s in enumerate(inputs):
            text.append(f"\n{indent}     in[{i}]  ")
            text.append_text(_stats_text(s))
        for i, s in enumerate(outputs):
            text.append(f"\n{indent}     out[{i}] ")
            text.append_text(_stats_text(s))
    return text


def summary_line(summary: Mapping[str, Any]) -> Text:
    """The closing line of a text trace."""
    text = Text("summary: ", style="bold")
    text.append(f"{summary['batches']} batch(es), {summary['samples']} sample(s), "
                f"{summary['calls']} traced call(s)")
    if summary.get("nonfinite_calls"):
        text.append(f", {summary['nonfinite_calls']} with non-finite output", style="red")
    origin = summary.get("origin")
    if origin:
        where = "input, first seen by" if origin.get("source") == "input" else "origin"
        text.append(f"; non-finite {where} {_who(origin)} ({origin['type']})", style="bold red")
    else:
        text.append("; no non-finite values", style="green")
    error = summary.get("error")
    if error:
        text.append(f"; error in {_who(error)}", style="bold red")
    return text


class TextTrace:
    """The text trace's lines, one event at a time: the header first, a rule between batches."""

    def __init__(self, envelope: Mapping[str, Any]) -> None:
        self._batch = 0
        self._header: list[RenderableType] = [header(envelope)]  # until the first line

    def event(self, event: Mapping[str, Any]) -> list[RenderableType]:
        """The lines of one trace event (its ``to_dict()``)."""
        lines, self._header = self._header, []
        batch = int(event.get("batch") or 0)
        if batch != self._batch:
            self._batch = batch
            lines.append(Text(f"── batch {batch} ──", style="dim"))
        return [*lines, trace_line(event)]

    def summary(self, summary: Mapping[str, Any]) -> list[RenderableType]:
        """The closing summary's line."""
        lines, self._header = self._header, []
        return [*lines, summary_line(summary)]


def debug_view(doc: Mapping[str, Any]) -> RenderableType:
    """The whole ``debug`` document (``DebugReport.document``) as its text trace."""
    trace = TextTrace(doc)
    return Group(*(line for event in doc["events"] for line in trace.event(event)),
                 *trace.summary(doc["summary"]))


def debug_ndjson(doc: Mapping[str, Any]) -> str:
    """The whole ``debug`` document as its NDJSON trace: one line per event, then the summary."""
    return "".join(map(dumps_ndjson, doc["events"])) + summary_ndjson(doc["summary"])


def summary_ndjson(summary: Mapping[str, Any]) -> str:
    """The NDJSON trace's closing line."""
    return dumps_ndjson({"event": "summary"} | dict(summary))


class TraceWriter:
    """``debug``'s live trace on stdout (``fmt`` ``text`` or ``ndjson``), streamed as the
    model runs so what ran before a crash or a hang is already on screen: the one output
    that bypasses :func:`hookscope.render.views.emit`. Its lines are the ``debug`` view's.
    """

    def __init__(self, fmt: str, output: Output, envelope: Mapping[str, Any]) -> None:
        self.fmt, self.output = fmt, output
        self.text = TextTrace(envelope)

    def _print(self, lines: Sequence[RenderableType]) -> None:
        for line in lines:  # a closed pipe raises BrokenPipeError (see render.console): exit 0
            console.stdout().print(line, soft_wrap=True, highlight=False)

    def event(self, event: Mapping[str, Any]) -> None:
        """One trace event (its ``to_dict()``)."""
        if self.fmt == "ndjson":
            write(self.output, dumps_ndjson(event))
        else:
            self._print(self.text.event(event))

    def summary(self, summary: Mapping[str, Any]) -> None:
        """The closing summary (the document's ``summary``)."""
        if self.fmt == "ndjson":
            write(self.output, summary_ndjson(summary))
        else:
            self._print(self.text.summary(summary))
