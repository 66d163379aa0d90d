"""The Rich summary printed by ``hookscope gradcam`` (table format)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from hookscope.render.tables import Col, FitTable, fmt_float, header, num


def cam_table(results: list[Mapping[str, Any]]) -> FitTable:
    """One row per input and method: target, score, probability, peak, files written."""
    # Hidden first: peak, overlay path (the folder is on the line above), prob, label.
    table = FitTable([
        Col("input", name=True), Col("method"), num("class"),
        Col("label", 4, wrap=True), num("score"),
        num("prob", 3), num("peak y,x", 1),
        Col("overlay", 2, name=True),
    ])
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
