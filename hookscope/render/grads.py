"""Tables for ``hookscope grads``: per-call output gradients and per-parameter norms."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from hookscope.core.files import format_shape
from hookscope.render.tables import DataTable, col, count_text, fmt_float, header, num

FLAG_STYLES = {"nonfinite": "bold red", "explode": "red", "vanish": "yellow"}

LAYER_COLUMNS = ("name", "type", "call", "shape", "norm", "mean", "std", "max_abs",
                 "nonfinite", "flag")
CSV_COLUMNS = ("kind", *LAYER_COLUMNS, "grad_norm", "weight_norm", "ratio")


def grads_csv(doc: Mapping[str, Any], *, params: bool = True
              ) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """One CSV: layer rows (``kind`` = layer) then parameter rows (``kind`` = param)."""
    rows = [{"kind": "layer", **row} for row in doc["layers"]]
    return rows + [{"kind": "param", **row} for row in doc["params"]], CSV_COLUMNS


def layers_table(rows: list[Mapping[str, Any]]) -> DataTable:
    """Output gradients in backward order; flagged rows coloured."""
    table = DataTable([num("#", style="dim"), "layer", col("type", style="dim"), num("call"),
                       "shape", num("norm"), num("mean"), num("std"), num("max |g|"),
                       num("non-finite"), "flag"],
                      title="output gradients, backward order")
    for i, row in enumerate(rows):
        flag = row.get("flag") or ""
        table.add_row(str(i), row["name"], row["type"], str(row["call"]),
                      format_shape(row["shape"]),
                      *(fmt_float(row[k]) for k in ("norm", "mean", "std", "max_abs")),
                      count_text(int(row.get("nonfinite") or 0)),
                      Text(flag, style=FLAG_STYLES.get(flag, "")), style=FLAG_STYLES.get(flag))
    return table


def params_table(rows: list[Mapping[str, Any]]) -> DataTable:
    """Parameter gradient norm, weight norm and their ratio."""
    table = DataTable(["parameter", num("grad norm"), num("weight norm"), num("ratio")],
                      title="parameters")
    for row in rows:
        table.add_row(row["name"], fmt_float(row["grad_norm"]), fmt_float(row["weight_norm"]),
                      fmt_float(row["ratio"]))
    return table


def objective_text(loss: str, targets: Iterable[int] | None) -> str:
    """What was differentiated: ``cross-entropy (class 3, 7)``, the first five classes."""
    classes = sorted(set(targets or []))
    shown = ", ".join(str(c) for c in classes[:5]) + (", ..." if len(classes) > 5 else "")
    return f"{'cross-entropy' if loss == 'ce' else 'target logit'} (class {shown})"


def grads_view(doc: Mapping[str, Any], *, params: bool = True) -> RenderableType:
    """The whole ``grads`` table output."""
    line = Text(f"gradient of: {objective_text(doc['loss'], doc.get('targets'))}, summed over "
                f"inputs = {fmt_float(doc.get('objective'))}; median layer norm "
                f"{fmt_float(doc.get('median_norm'))}")
    bad = doc.get("first_nonfinite")
    if bad:
        line.append(f"\nfirst non-finite gradient in backward order: {bad}", style="bold red")
    flagged = [r for r in doc["layers"] if r.get("flag") in ("vanish", "explode")]
    if flagged:
        line.append(f"\nflagged: {len(flagged)} call(s) (vanish/explode relative to the median)",
                    style="yellow")
    parts: list[RenderableType] = [header(doc, f"layer calls: {len(doc['layers'])}"), line,
                                   layers_table(doc["layers"])]
    if params and doc.get("params"):
        parts.append(params_table(doc["params"]))
    return Group(*parts)
