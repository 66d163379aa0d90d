"""``hookscope watch`` drawn: what happened in a smoke training run, and its loss as CSV."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from hookscope.render.tables import DataTable, fmt_float, header
from hookscope.training.log_reader import listed

Doc = Mapping[str, Any]
#: Flagged layers listed in the table (JSON: all).
SHOWN = 10


def _flagged(rows: Sequence[Mapping[str, Any]]) -> str:
    return listed([f"{r['name']}: {r['detail']} ({r['steps']})" for r in rows], SHOWN) or "none"


def watch_view(doc: Doc) -> RenderableType:
    """One row per fact: steps, loss first and last, flagged layers, the first non-finite."""
    table = DataTable(["what", "found"])
    run = f"{doc['steps_run']} of {doc['steps']}" + (" (one batch, repeated)" if doc["overfit"]
                                                     else "")
    table.add_row("steps", run)
    table.add_row("loss, first step", fmt_float(doc.get("loss_first")))
    table.add_row("loss, last step", fmt_float(doc.get("loss_last")))
    table.add_row("flagged layers", _flagged(doc.get("flagged") or []))
    event = doc.get("nonfinite")
    table.add_row("first non-finite", Text(event["message"], style="bold red") if event
                  else Text("none", style="green"))
    check = doc.get("check")
    if check is not None:
        failed = [r for r in check["rules"] if not r["passed"]]
        table.add_row("rules", Text("; ".join(f"{r['rule']}: {r['detail']}" for r in failed),
                                    style="bold red") if failed
                      else Text(f"all {len(check['rules'])} passed", style="green"))
    if doc.get("log_dir"):
        table.add_row("log", str(doc["log_dir"]))
    verdict = Text(f"FAILED: {doc['failure']}", style="bold red") if doc.get("failure") else \
        Text("passed: the model trains" + (" (the loss fell)" if doc["overfit"] else ""),
             style="bold green")
    return Group(header(doc), table, verdict)


def watch_csv(doc: Doc) -> tuple[list[dict[str, Any]], Sequence[str]]:
    """The loss of each step run."""
    return [dict(row) for row in doc.get("loss") or []], ("step", "loss")
