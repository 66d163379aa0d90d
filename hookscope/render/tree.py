"""Rich views for ``models`` (a table), ``layers`` (a tree) and ``debug`` (trace lines)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text
from rich.tree import Tree

from hookscope.core.files import Output, dumps_ndjson, format_shape, write
from hookscope.render import console
from hookscope.render.tables import DataTable, col, fmt_count, fmt_float, header, joined


def models_table(doc: Mapping[str, Any]) -> DataTable:
    """One row per model: name, task, the DEFAULT weights and every weights enum member (for
    Hugging Face folders: the saved architecture and the folder's files)."""
    default, every = ("architecture", "files") if doc.get("source") == "hf" else \
        ("default weights", "all weights")
    table = DataTable(["model", col("task", style="dim"), col(default, style="cyan"), every],
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
    return Text("→ ", style="green") + Text("  ").join(
        Text.assemble((f"#{i} ", "dim"), (_shape_text(call), "green")) for i, call in enumerate(calls))


_TRAINABLE = {True: ("trainable", "dim"), False: ("frozen", "yellow")}


def _params_text(row: Mapping[str, Any]) -> Text:
    own, total = row["params"], row["params_total"]
    if total is None:  # a lazy parameter before the forward that gives it a size
        if own is None:
            return Text("uninitialised params", style="yellow")
        return Text.assemble(("params partly uninitialised", "yellow"),
                             (f" (own {own:,})" if own else "", "dim"))
    params = Text.assemble((f"{total:,} params", "cyan" if total else "dim"))
    if own != total:
        params.append_tokens([(" ", None), (f"(own {own:,})", "dim")])
    return params


def _label(row: Mapping[str, Any], name: str, *more: Text) -> Text:
    """A node's label: name, type, parameters (own too when they differ), MACs, whether it
    is trainable, and its calls' output shapes."""
    parts: list[Text | tuple[str, str]] = [(name, "bold"), (row["type"], "magenta"),
                                           _params_text(row)]
    if row.get("macs_counted") is False:
        parts.append(("MACs not counted", "yellow"))
    elif row.get("macs"):  # zero (ReLU, BatchNorm) and unmeasured (no input) stay quiet
        parts.append((f"{fmt_count(row['macs'])} MACs", "blue"))
    if row.get("trainable") is not None:
        parts.append(_TRAINABLE.get(row["trainable"], ("partly trainable", "yellow")))
    if row.get("scripted"):
        parts.append(("scripted, not hooked", "yellow"))
    elif row.get("macs_counted", False) is not None:  # None: no forward pass, nothing to say
        parts.append(_calls_text(row.get("calls") or []))
    return joined(*parts, *more)


def _batch(doc: Mapping[str, Any]) -> int | None:
    """The batch size of the forward pass the shapes and FLOPs come from."""
    calls = doc["root"].get("calls") or []
    shapes = calls[0].get("input_shapes") if calls else None
    return shapes[0][0] if shapes and shapes[0] else None


def _macs_text(doc: Mapping[str, Any]) -> Text | None:
    """MACs and FLOPs for the batch, or why there are none."""
    totals = doc["totals"]
    if doc.get("forward") is False:
        return Text("no forward pass: shapes and MACs not measured", style="dim")
    uncounted = totals.get("uncounted_ops") or {}
    if uncounted:
        where = "; ".join(f"{op} in {', '.join(n or '(the model itself)' for n in names[:4])}"
                          for op, names in uncounted.items())
        return Text(f"MACs not counted (no formula for {where})", style="yellow")
    if totals.get("macs") is None:
        return None
    text = Text.assemble((f"{fmt_count(totals['macs'])} MACs", "blue"), " ",
                         (f"({fmt_count(totals['flops'])} FLOPs)", "dim"))
    batch = _batch(doc)
    if batch is not None:
        text.append(f" for batch {batch}")
    return text


def _totals_line(doc: Mapping[str, Any]) -> Text:
    """The line under the tree: MACs, FLOPs and bytes of the whole model."""
    totals, macs = doc["totals"], _macs_text(doc)
    first = Text.assemble(("totals:", "bold"), *((" ", macs) if macs is not None else ()))
    by_dtype = totals["params_bytes"]
    params = Text.assemble((f"params {fmt_count(sum(by_dtype.values()), 'B')}", "cyan"))
    if len(by_dtype) > 1:
        each = ", ".join(f"{dtype} {fmt_count(n, 'B')}" for dtype, n in by_dtype.items())
        params.append_tokens([(" ", None), (f"({each})", "dim")])
    if totals.get("uninitialised"):
        params.append_tokens([(" ", None), (f"+ {len(totals['uninitialised'])} uninitialised",
                                            "yellow")])
    parts: list[Text | str] = [first, params]
    if totals.get("buffers_bytes"):
        parts.append(f"buffers {fmt_count(totals['buffers_bytes'], 'B')}")
    if totals.get("activation_bytes") is not None:
        parts.append(f"activations {fmt_count(totals['activation_bytes'], 'B')}")
    if totals.get("input_bytes") is not None:
        parts.append(f"input {fmt_count(totals['input_bytes'], 'B')}")
    return joined(*parts)


def layers_tree(doc: Mapping[str, Any]) -> RenderableType:
    """The module tree, then a line of totals when the document has them."""
    root, totals = doc["root"], doc["totals"]
    trainable = totals["trainable_params"]
    summary = Text(f"[{totals['modules']} modules, "
                   f"{'?' if trainable is None else format(trainable, ',')} trainable]", style="dim")
    tree = Tree(_label(root, doc.get("model") or root["type"], summary), guide_style="dim")
    nodes = {"": tree}
    for row in doc["layers"]:
        # A parent is always listed before its children (named_modules order).
        name = row["name"]
        nodes[name] = nodes.get(name.rpartition(".")[0], tree).add(_label(row, name))
    return Group(tree, *([_totals_line(doc)] if "params_bytes" in totals else []))


def layers_view(doc: Mapping[str, Any]) -> RenderableType:
    """The whole ``layers`` output: a header line and the tree."""
    return Group(header(doc), layers_tree(doc))


def _who(event: Mapping[str, Any]) -> str:
    name = event.get("name")
    if name is None:
        return "(before any module ran)"
    shown = name if name else "(the model itself)"
    call = event.get("call")
    return f"{shown}#{call}" if call else shown


def _stats_text(stats: Mapping[str, Any] | None) -> Text:
    if not stats:
        return Text()
    nonfinite = int(stats.get("nonfinite") or 0)
    return Text.assemble(
        f"mean {fmt_float(stats.get('mean'))}  std {fmt_float(stats.get('std'))}",
        (f"  min {fmt_float(stats.get('min'))}  max {fmt_float(stats.get('max'))}", "dim"),
        (f"  non-finite {nonfinite}" if nonfinite else "", "bold red"))


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
        return Text.assemble("✗ error in ", (_who(event), "bold red"),
                             (f" {event['type']}" if event.get("type") else "", "magenta"),
                             f"  in {_shapes(event.get('input_shapes'))}",
                             (f"\n  {event.get('exception')}: {event.get('message')}", "red"),
                             style="bold red")
    bad = kind == "nonfinite" or int(event.get("nonfinite") or 0)
    text = Text.assemble(indent, _LEADS[kind], (_who(event), "bold red" if bad else "bold"),
                         (f" {event['type']}", "magenta"))
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
        for side, pad, stats in (("in", "  ", inputs), ("out", " ", outputs)):
            for i, s in enumerate(stats):
                text.append(f"\n{indent}     {side}[{i}]{pad}")
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
    """The text trace's lines, one record at a time: the header first, a rule between batches."""

    def __init__(self, envelope: Mapping[str, Any]) -> None:
        self._batch = 0
        self._header: list[RenderableType] = [header(envelope)]  # until the first line

    def lines(self, record: Mapping[str, Any]) -> list[RenderableType]:
        """The lines of one trace event (its ``to_dict()``) or of the closing summary
        (:func:`summary_record`)."""
        lines, self._header = self._header, []
        if record["event"] == "summary":
            return [*lines, summary_line(record)]
        batch = int(record.get("batch") or 0)
        if batch != self._batch:
            self._batch = batch
            lines.append(Text(f"── batch {batch} ──", style="dim"))
        return [*lines, trace_line(record)]


def summary_record(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The closing summary as the trace's last record (the NDJSON trace's last line)."""
    return {"event": "summary"} | dict(summary)


def debug_view(doc: Mapping[str, Any]) -> RenderableType:
    """The whole ``debug`` document (``DebugReport.document``) as its text trace."""
    trace = TextTrace(doc)
    return Group(*(line for record in [*doc["events"], summary_record(doc["summary"])]
                   for line in trace.lines(record)))


def debug_ndjson(doc: Mapping[str, Any]) -> str:
    """The whole ``debug`` document as its NDJSON trace: one line per event, then the summary."""
    return "".join(map(dumps_ndjson, [*doc["events"], summary_record(doc["summary"])]))


class TraceWriter:
    """``debug``'s live trace on stdout (``fmt`` ``text`` or ``ndjson``), streamed as the
    model runs so what ran before a crash or a hang is already on screen: the one output
    that bypasses :func:`hookscope.render.views.emit`. Its lines are the ``debug`` view's.
    """

    def __init__(self, fmt: str, output: Output, envelope: Mapping[str, Any]) -> None:
        self.fmt, self.output = fmt, output
        self.text = TextTrace(envelope)

    def event(self, event: Mapping[str, Any]) -> None:
        """One trace event (its ``to_dict()``)."""
        if self.fmt == "ndjson":
            write(self.output, dumps_ndjson(event))
            return
        for line in self.text.lines(event):  # a closed pipe raises BrokenPipeError: exit 0
            console.stdout().print(line, soft_wrap=True, highlight=False)

    def summary(self, summary: Mapping[str, Any]) -> None:
        """The closing summary (the document's ``summary``)."""
        self.event(summary_record(summary))
