"""Rich tables shared by the commands: a run header, layer statistics, predictions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from hookscope.render.output import format_shape, format_shapes

ZERO_WARN = 0.99


def data_table(**kwargs: Any) -> Table:
    """The one table style of every command: a bold header rule and no cell borders."""
    return Table(box=box.SIMPLE_HEAD, header_style="bold", **kwargs)


def fmt_float(value: float | None, digits: int = 4) -> str:
    """Compact, aligned-friendly float text; ``nan``/``inf`` spelt out, None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def header(doc: Mapping[str, Any], extra: str = "") -> Text:
    """One line: model, weights actually loaded, device, number of inputs."""
    n = len(doc.get("inputs", []))
    text = Text()
    text.append(str(doc.get("model")), style="bold")
    text.append(f"  weights: {doc['weights']['loaded']}", style="cyan")
    text.append(f"  device: {doc.get('device')}")
    text.append(f"  inputs: {n}")
    if doc.get("input_shape"):
        text.append(f"  input: {format_shape(doc['input_shape'])}")
    if extra:
        text.append(f"  {extra}")
    return text


def stats_table(rows: Sequence[Mapping[str, Any]], *, input_stats: bool = False) -> Table:
    """Per-call statistics; non-finite counts red, mostly-zero layers yellow."""
    table = data_table()
    table.add_column("#", justify="right", style="dim")
    table.add_column("layer", overflow="fold")
    table.add_column("type", style="dim")
    table.add_column("call", justify="right")
    table.add_column("input", overflow="fold")
    table.add_column("output", overflow="fold")
    for name in ("mean", "std", "min", "max"):
        table.add_column(name, justify="right")
    table.add_column("zeros", justify="right")
    table.add_column("non-finite", justify="right")
    if input_stats:
        table.add_column("in mean", justify="right")
        table.add_column("in std", justify="right")
        table.add_column("in non-finite", justify="right")
    for i, row in enumerate(rows):
        zero = row.get("zero_fraction")
        nonfinite = int(row.get("nonfinite") or 0)
        style = "red" if nonfinite else ("yellow" if zero is not None and zero >= ZERO_WARN else None)
        cells = [
            str(i),
            row["name"],
            row["type"],
            str(row["call"]),
            format_shapes(row.get("input_shapes") or []),
            format_shapes(row.get("output_shapes") or [])
            if len(row.get("output_shapes") or []) > 1
            else format_shape(row.get("output_shape")),
            fmt_float(row.get("mean")),
            fmt_float(row.get("std")),
            fmt_float(row.get("min")),
            fmt_float(row.get("max")),
            "-" if zero is None else f"{zero:.1%}",
            Text(str(nonfinite), style="bold red") if nonfinite else Text("0"),
        ]
        if input_stats:
            ins = row.get("input_stats") or {}
            in_nonfinite = int(ins.get("nonfinite") or 0)
            cells += [
                fmt_float(ins.get("mean")),
                fmt_float(ins.get("std")),
                Text(str(in_nonfinite), style="bold red") if in_nonfinite else Text("0"),
            ]
        table.add_row(*cells, style=style)
    return table


def predictions_table(inputs: Sequence[str], predictions: Sequence[Sequence[Mapping[str, Any]]]) -> Table:
    """Top predictions per input."""
    table = data_table(title="top predictions",
                  title_justify="left")
    table.add_column("input", overflow="fold")
    table.add_column("rank", justify="right")
    table.add_column("class", justify="right")
    table.add_column("label")
    table.add_column("prob", justify="right")
    for name, preds in zip(inputs, predictions, strict=False):
        for rank, p in enumerate(preds, 1):
            table.add_row(
                name if rank == 1 else "",
                str(rank),
                str(p["index"]),
                p.get("label") or "",
                f"{p['prob']:.2%}",
                end_section=rank == len(preds),
            )
    return table


def stats_view(doc: Mapping[str, Any], *, input_stats: bool = False) -> RenderableType:
    """The whole ``stats`` table output."""
    parts: list[RenderableType] = [header(doc, f"layer calls: {len(doc['layers'])}"),
                                   stats_table(doc["layers"], input_stats=input_stats)]
    if doc.get("predictions"):
        parts.append(predictions_table(doc["inputs"], doc["predictions"]))
    return Group(*parts)


def print_view(renderable: RenderableType, console: Console) -> None:
    """Print a renderable on the data console."""
    console.print(renderable)
