"""The Rich summary printed by ``hookscope gradcam`` (table format)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Column
from rich.text import Text

from hookscope.core.files import format_shape
from hookscope.render.tables import DataTable, fmt_float, fmt_pct, header, joined, num

#: The peak's coordinates, by the map's rank.
PEAK_AXES = {1: "l", 2: "y,x", 3: "d,y,x"}
#: The metric columns, in this order, when present.
METRIC_ORDER = ("road", "road_morf", "road_lerf", "deletion", "insertion", "drop", "increase")


def results_table(results: Sequence[Mapping[str, Any]], columns: Sequence[Column],
                  cells: Callable[[Mapping[str, Any]], list[str]]) -> DataTable:
    """One row per input and method (an input named once): its class, label, ``cells`` and
    the overlay written; a detector's label is how many detections it explained."""
    table = DataTable(["input", "method", num("class"), "label", *columns, "overlay"])
    for i, row in enumerate(results):
        target = row.get("target")
        label = row.get("label") or ""
        if target is None and row.get("detections") is not None:
            label = f"{len(row['detections'])} detection(s)"
        same = i and results[i - 1]["input"] == row["input"]
        table.add_row("" if same else str(row["input"]), row["method"],
                      "-" if target is None else str(target), label, *cells(row),
                      str(row.get("overlay") or ""))
    return table


def cam_table(results: Sequence[Mapping[str, Any]]) -> DataTable:
    """Score, probability and peak (its coordinates named by the map's rank: a signal's l, a
    volume's d,y,x) per input and method."""
    rank = max((len(r.get("peak") or ()) for r in results), default=2)
    return results_table(results, [num("score"), num("prob"),
                                   num("peak " + PEAK_AXES.get(rank, "y,x"))], lambda row: [
        fmt_float(row.get("score")), fmt_pct(row.get("prob")),
        ",".join(str(v) for v in row.get("peak") or [])])


def metric_columns(rows: Sequence[Mapping[str, Any]]
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows with one column per metric some row has (CSV), and those metrics' names."""
    present = [m for m in METRIC_ORDER if any(m in (r.get("metrics") or {}) for r in rows)]
    return [dict(r) | {m: (r.get("metrics") or {}).get(m) for m in present} for r in rows], present


def metrics_table(means: Mapping[str, Mapping[str, float]]) -> DataTable:
    """One row per method: each metric's mean over the inputs."""
    present = [m for m in METRIC_ORDER if any(m in v for v in means.values())]
    table = DataTable(["method", *(num(m) for m in present)],
                      title="metrics (mean over inputs)")
    for method, values in means.items():
        table.add_row(method, *(fmt_float(values.get(m)) for m in present))
    return table


def cam_view(doc: Mapping[str, Any]) -> RenderableType:
    """Header, the chosen layers, the per-input table and the metrics' means."""
    layer = Text()
    layers = doc.get("layers") or [doc.get("layer")]
    shapes = doc.get("layer_shapes") or [doc.get("layer_shape")]
    layer.append("layer: " if len(layers) == 1 else "layers (fused): ", style="bold")
    for i, (name, shape) in enumerate(zip(layers, shapes, strict=False)):
        layer.append(("" if i == 0 else ", ") + str(name))
        if shape:
            layer.append(f" ({format_shape(shape)})", style="dim")
    chosen = []
    if doc.get("layer_default"):
        from hookscope.cam.layer import why_chosen  # views are imported before torch is

        task = doc.get("task")
        what = "the last module with an image-grid output (a token model: its last " \
            "block's first norm)" if task in (None, "classification") else \
            why_chosen(str(layers[0]), task)
        chosen.append((f"chosen automatically: {what}", "dim"))
    results = doc.get("results", [])
    wrote = Text(f"wrote {len(results)} overlay(s) to {doc.get('out')}", style="green")
    if doc.get("skipped"):
        wrote.append(f"; skipped {len(doc['skipped'])} input(s) (see the warnings)", style="yellow")
    uses_layer = not results or any(r.get("layer") is not None for r in results)
    return Group(header(doc), *([joined(layer, *chosen)] if uses_layer else []), wrote,
                 cam_table(results), *([metrics_table(doc["metrics"])] if doc.get("metrics") else []))
