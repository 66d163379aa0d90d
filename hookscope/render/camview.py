"""The Rich summary printed by ``hookscope gradcam`` (table format)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from hookscope.render.tables import data_table, fmt_float, header


def cam_table(results: list[Mapping[str, Any]]) -> Table:
    """One row per input and method: target, score, probability, peak, files written."""
    table = data_table()
    table.add_column("input", overflow="fold")
    table.add_column("method")
    table.add_column("class", justify="right")
    table.add_column("label", overflow="fold")
    table.add_column("score", justify="right")
    table.add_column("prob", justify="right")
    table.add_column("peak y,x", justify="right")
    table.add_column("overlay", overflow="fold")
    previous = None
    for row in results:
        peak = row.get("peak") or []
        table.add_row(
            "" if row["input"] == previous else str(row["input"]),
            row["method"],
            str(row["target"]),
            row.get("label") or "",
            fmt_float(row.get("score")),
            "-" if row.get("prob") is None else f"{row['prob']:.2%}",
            ",".join(str(v) for v in peak),
            str(row.get("overlay") or ""),
        )
        previous = row["input"]
    return table


def cam_view(doc: Mapping[str, Any]) -> RenderableType:
    """Header, the chosen layer, and the per-input table."""
    layer = Text()
    layer.append("layer: ", style="bold")
    layer.append(str(doc.get("layer")))
    if doc.get("layer_shape"):
        layer.append(f"  ({'x'.join(str(d) for d in doc['layer_shape'])})", style="dim")
    if doc.get("layer_default"):
        layer.append("  chosen automatically: the last module with a spatial output",
                     style="dim")
    files = len(doc.get("results", []))
    layer.append(f"\nwrote {files} overlay(s) to {doc.get('out')}", style="green")
    return Group(header(doc), layer, cam_table(doc.get("results", [])))
