"""The ``hookscope diff`` view: where two runs part, and each call's difference."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Column
from rich.text import Text

from hookscope.core.files import format_shape
from hookscope.render.tables import DataTable, col, fmt_float, fmt_pct, header, num

Doc = Mapping[str, Any]

#: CSV columns: the JSON layer fields (a contract).
DIFF_COLUMNS = ("name", "type", "call", "shape", "shape_b", "max_abs", "rel_l2", "cosine",
                "nonfinite_a", "nonfinite_b", "exceeds")
OFFLINE_COLUMNS = ("name", "type", "call", "shape", "shape_b",
                   *(f"{stat}_{part}" for stat in ("mean", "std", "zero_fraction", "nonfinite")
                     for part in ("a", "b", "delta", "rel")),
                   "rel", "exceeds")
#: How many one-side calls are named in the table view.
SHOWN = 6


def diff_csv(doc: Doc) -> tuple[list[dict[str, Any]], Sequence[str]]:
    """One row per compared call."""
    return list(doc["layers"]), OFFLINE_COLUMNS if doc.get("offline") else DIFF_COLUMNS


def _value(value: Any) -> float | None:
    """A number to show: None for a missing or NaN value (shown as ``-``)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _side(doc: Doc) -> str:
    """What the second run was: model, weights, precision, device."""
    against = doc.get("against") or {}
    precision = against.get("precision") or {}
    weights = (against.get("weights") or {}).get("loaded")
    parts = [f"against: {against.get('model')}", f"weights: {weights}",
             f"dtype: {precision.get('dtype')}"]
    if precision.get("autocast"):
        parts.append(f"autocast: {precision['autocast']}")
    parts.append(f"device: {against.get('device')}")
    return "  ".join(parts)


def _verdict(doc: Doc) -> Text:
    """The first divergence in bold, or that there is none."""
    first = doc.get("first_divergence")
    tolerance = fmt_float(doc.get("tolerance"))
    if first is None:
        return Text(f"no call differs by more than the tolerance ({tolerance})", style="green")
    call = f" (call {first['call']})" if first.get("call") else ""
    reasons = {"shape": "the output shapes differ", "nonfinite": "the non-finite counts differ"}
    value = _value(first.get("rel_l2", first.get("rel")))
    detail = reasons.get(first.get("reason", ""),
                         f"relative {'L2 error' if 'rel_l2' in first else 'change'} "
                         f"{fmt_float(value) if value is not None else 'inf'}")
    limit = f" (tolerance {tolerance})" if first.get("reason") in ("rel_l2", "rel") else ""
    return Text(f"first divergence: {first['name']}{call} {first['type']}: {detail}{limit}",
                style="bold red")


def _outputs(doc: Doc) -> list[Text]:
    """The final outputs' agreement, when the document has it."""
    outputs = doc.get("outputs")
    if not outputs:
        return []
    n, agree = outputs["inputs"], outputs["top1_agree"]
    line = Text(f"final output: top-1 agreement {agree}/{n}",
                style="" if agree == n else "bold red")
    if outputs.get("max_abs_logit") is not None:
        line.append(f", max |Δ logit| {fmt_float(outputs['max_abs_logit'])}, KL(a‖b) mean "
                    f"{fmt_float(outputs['kl_mean'])}, max {fmt_float(outputs['kl_max'])}",
                    style="")
    return [line]


def _one_side(doc: Doc) -> list[Text]:
    """The calls seen on one side only."""
    lines = []
    for key, side in (("unmatched_a", "A (MODEL)"), ("unmatched_b", "B (against)")):
        refs = doc.get(key) or []
        if refs:
            names = [f"{r['name']}" + (f"#{r['call']}" if r["call"] else "") for r in refs]
            more = f", ... ({len(names) - SHOWN} more)" if len(names) > SHOWN else ""
            lines.append(Text(f"only in {side}, {len(refs)} call(s): "
                              f"{', '.join(names[:SHOWN])}{more}", style="yellow"))
    return lines


def _shape(row: Mapping[str, Any]) -> str:
    shape, other = row.get("shape"), row.get("shape_b")
    return format_shape(shape) if other == shape else f"{format_shape(shape)}≠{format_shape(other)}"


def _count(value: Any) -> int | str:
    number = _value(value)
    return "-" if number is None else int(number)


def _table(doc: Doc, columns: Sequence[Column], cells: Callable[[Mapping[str, Any]], list[str]]
           ) -> DataTable:
    """Each compared call in A's execution order, the first divergence in bold red and rows
    above the tolerance in red; ``columns`` and ``cells`` follow the call's type and call."""
    first = doc.get("first_divergence") or {}
    table = DataTable([num("#", style="dim"), "layer", col("type", style="dim"), num("call"),
                       *columns])
    for i, row in enumerate(doc["layers"]):
        first_row = (row["name"], row["call"]) == (first.get("name"), first.get("call"))
        table.add_row(str(i), row["name"], row["type"], str(row["call"]), *cells(row),
                      style="bold red" if first_row else "red" if row.get("exceeds") else None)
    return table


def layers_table(doc: Doc) -> DataTable:
    """Two runs' outputs compared call by call."""
    columns = [col("shape"), num("max |a−b|"), num("rel L2"), num("cosine"), num("NaN/Inf a"),
               num("NaN/Inf b")]
    return _table(doc, columns, lambda row: [
        _shape(row), fmt_float(row.get("max_abs")), fmt_float(row.get("rel_l2")),
        fmt_float(row.get("cosine"), 6), str(row["nonfinite_a"]), str(row["nonfinite_b"])])


def offline_table(doc: Doc) -> DataTable:
    """Two saved ``stats`` documents: each statistic's change, b − a."""
    columns = [num("Δ mean"), num("Δ std"), num("Δ zeros"), num("rel"), num("NaN/Inf a"),
               num("NaN/Inf b")]
    return _table(doc, columns, lambda row: [
        fmt_float(row.get("mean_delta")), fmt_float(row.get("std_delta")),
        fmt_pct(row.get("zero_fraction_delta"), 1, sign=True), fmt_float(row.get("rel")),
        str(_count(row.get("nonfinite_a"))), str(_count(row.get("nonfinite_b")))])


def diff_view(doc: Doc) -> RenderableType:
    """The whole ``diff`` table output."""
    offline = "  offline: two saved stats documents" if doc.get("offline") else ""
    return Group(header(doc, f"layer calls: {len(doc['layers'])}{offline}"),
                 Text(_side(doc), style="cyan"), _verdict(doc), *_outputs(doc), *_one_side(doc),
                 offline_table(doc) if offline else layers_table(doc))
