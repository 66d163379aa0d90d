"""Rich views for ``models`` (a table), ``layers`` (a tree) and ``debug`` (trace lines).

Every view takes the plain JSON-ready dicts the commands also write as JSON, so the
terminal and the file formats cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from hookscope.render.output import format_shape
from hookscope.render.tables import data_table, fmt_float, header

# ----------------------------------------------------------------------------- models


def models_table(doc: Mapping[str, Any]) -> Table:
    """One row per model: name, task, the DEFAULT weights and every weights enum member."""
    table = data_table(
                  title=f"{len(doc['models'])} model(s)", title_justify="left")
    table.add_column("model")
    table.add_column("task", style="dim")
    table.add_column("default weights", style="cyan")
    table.add_column("all weights", overflow="fold")
    for m in doc["models"]:
        weights = ", ".join(m["weights"]) if m["weights"] else Text("none", style="dim")
        table.add_row(m["name"], m["task"], m.get("default") or Text("-", style="dim"), weights)
    return table


# ----------------------------------------------------------------------------- layers


def _shape_text(call: Mapping[str, Any]) -> str:
    shapes = call.get("output_shapes") or []
    if len(shapes) > 1:
        return "(" + ", ".join(format_shape(s) for s in shapes) + ")"
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


def _trainable_text(value: Any) -> Text:
    if value is None:
        return Text("")
    if value is True:
        return Text("trainable", style="dim")
    if value is False:
        return Text("frozen", style="yellow")
    return Text("partly trainable", style="yellow")


def _params_text(row: Mapping[str, Any]) -> Text:
    own, total = row["params"], row["params_total"]
    if total == 0:
        return Text("0 params", style="dim")
    text = Text(f"{total:,} params", style="cyan")
    if own != total:
        text.append(f" (own {own:,})", style="dim")
    return text


def _label(row: Mapping[str, Any], name: str) -> Text:
    label = Text()
    label.append(name, style="bold")
    label.append(f"  {row['type']}", style="magenta")
    label.append("  ")
    label.append_text(_params_text(row))
    trainable = _trainable_text(row.get("trainable"))
    if trainable.plain:
        label.append("  ")
        label.append_text(trainable)
    label.append("  ")
    label.append_text(_calls_text(row.get("calls") or []))
    return label


def layers_tree(doc: Mapping[str, Any]) -> Tree:
    """The module tree; each node's label starts with its full dotted name."""
    root = doc["root"]
    totals = doc["totals"]
    label = _label(root, doc.get("model") or root["type"])
    label.append(f"  [{totals['modules']} modules, {totals['trainable_params']:,} trainable]",
                 style="dim")
    tree = Tree(label, guide_style="dim")
    nodes: dict[str, Tree] = {"": tree}
    for row in doc["layers"]:
        name = row["name"]
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        # A parent is always listed before its children (named_modules order).
        nodes[name] = nodes.get(parent, tree).add(_label(row, name))
    return tree


def layers_view(doc: Mapping[str, Any]) -> RenderableType:
    """The whole ``layers`` output: a header line and the tree."""
    return Group(header(doc), layers_tree(doc))


# ----------------------------------------------------------------------------- debug


def _indent(event: Mapping[str, Any]) -> str:
    return "  " * max(int(event.get("depth") or 0) - 1, 0)


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


def trace_line(event: Mapping[str, Any]) -> Text:
    """One line of the live trace for an ``enter``, ``exit``, ``nonfinite`` or ``error`` event."""
    kind = event["event"]
    text = Text(_indent(event))
    if kind == "enter":
        text.append("→ ", style="dim")
        text.append(_who(event), style="bold")
        text.append(f" {event['type']}", style="magenta")
        text.append(f"  in {_shapes(event.get('input_shapes'))}")
    elif kind == "exit":
        nonfinite = int(event.get("nonfinite") or 0)
        text.append("← ", style="dim")
        text.append(_who(event), style="bold red" if nonfinite else "bold")
        text.append(f" {event['type']}", style="magenta")
        text.append(f"  out {_shapes(event.get('output_shapes'))}  ")
        text.append_text(_stats_text(event))
    elif kind == "nonfinite":
        outputs = event.get("output_stats") or []
        bad = sum(int(s.get("nonfinite") or 0) for s in outputs)
        text.append("!! first non-finite: ", style="bold red")
        text.append(_who(event), style="bold red")
        text.append(f" {event['type']}", style="magenta")
        if event.get("source") == "input":
            inputs = event.get("input_stats") or []
            bad_in = sum(int(s.get("nonfinite") or 0) for s in inputs)
            text.append(f"  the model's input already holds {bad_in} non-finite value(s); "
                        "this is the first module to receive it", style="red")
        else:
            text.append(f"  inputs finite, output has {bad} non-finite value(s)", style="red")
        for i, s in enumerate(event.get("input_stats") or []):
            text.append(f"\n{_indent(event)}     in[{i}]  ")
            text.append_text(_stats_text(s))
        for i, s in enumerate(outputs):
            text.append(f"\n{_indent(event)}     out[{i}] ")
            text.append_text(_stats_text(s))
    elif kind == "error":
        text = Text("✗ error in ", style="bold red")
        text.append(_who(event), style="bold red")
        if event.get("type"):
            text.append(f" {event['type']}", style="magenta")
        text.append(f"  in {_shapes(event.get('input_shapes'))}")
        text.append(f"\n  {event.get('exception')}: {event.get('message')}", style="red")
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


class TracePrinter:
    """Prints debug events on a console as they happen (one call per event dict)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._batch = 0

    def _print(self, text: Text) -> None:
        # A closed pipe raises BrokenPipeError (see render.console), which the CLI exits 0 on.
        self.console.print(text, soft_wrap=True, highlight=False)

    def __call__(self, event: Mapping[str, Any]) -> None:
        batch = int(event.get("batch") or 0)
        if batch != self._batch:
            self._batch = batch
            self._print(Text(f"── batch {batch} ──", style="dim"))
        self._print(trace_line(event))

    def header(self, doc: Mapping[str, Any]) -> None:
        self._print(header(doc))

    def summary(self, summary: Mapping[str, Any]) -> None:
        self._print(summary_line(summary))
