"""Tables for ``hookscope ablate``: predictions before and after, and sweep rankings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from hookscope.render.tables import data_table, fmt_float, header


def _channels(channels: list[int]) -> str:
    if len(channels) > 8:
        return f"{len(channels)} channels ({', '.join(map(str, channels[:6]))}, ...)"
    return ", ".join(map(str, channels))


def _top_table(result: Mapping[str, Any]) -> Table:
    table = data_table()
    table.add_column("rank", justify="right")
    table.add_column("before")
    table.add_column("prob", justify="right")
    table.add_column("after")
    table.add_column("prob", justify="right")
    before, after = result["before"], result["after"]
    for rank in range(max(len(before), len(after))):
        cells: list[RenderableType] = [str(rank + 1)]
        for preds in (before, after):
            if rank < len(preds):
                p = preds[rank]
                name = f"{p['index']} {p.get('label') or ''}".strip()
                style = "bold" if p["index"] == result["target"] else None
                cells += [Text(name, style=style or ""), f"{p['prob']:.2%}"]
            else:
                cells += ["", ""]
        table.add_row(*cells)
    return table


def _ranking_table(ranking: list[Mapping[str, Any]], limit: int) -> Table:
    table = data_table(
                  title=f"channels by target-logit drop (top {min(limit, len(ranking))} of "
                  f"{len(ranking)})", title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("channel", justify="right")
    table.add_column("logit drop", justify="right")
    table.add_column("Δ prob", justify="right")
    table.add_column("KL", justify="right")
    for i, row in enumerate(ranking[:limit], 1):
        table.add_row(str(i), str(row["channel"]), fmt_float(row["drop"]),
                      fmt_float(row["delta_prob"]), fmt_float(row["kl"]))
    return table


def ablate_view(doc: Mapping[str, Any], *, top: int = 10) -> RenderableType:
    """The whole ``ablate`` table output: one block per input."""
    parts: list[RenderableType] = [header(doc)]
    for result in doc["results"]:
        target = f"{result['target']} {result.get('target_label') or ''}".strip()
        what = "sweep, after = the top-ranked channel" if "ranking" in result else \
            _channels(result["channels"])
        line = Text()
        line.append(f"\n{result['input']}", style="bold")
        line.append(f"  {result['layer']} [{what}]  mode {result['mode']}  target {target}\n")
        line.append(f"Δ logit {fmt_float(result['delta_logit'])}  Δ prob "
                    f"{fmt_float(result['delta_prob'])}  KL {fmt_float(result['kl'])}")
        parts += [line, _top_table(result)]
        if "ranking" in result:
            parts.append(_ranking_table(result["ranking"], top))
    return Group(*parts)
