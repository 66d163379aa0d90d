"""Tables for ``hookscope ablate``: predictions before and after, and sweep rankings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from hookscope.render.tables import NONFINITE_LOGITS, DataTable, fmt_float, fmt_pct, header, num


def _channels(channels: list[int]) -> str:
    if len(channels) > 8:
        return f"{len(channels)} channels ({', '.join(map(str, channels[:6]))}, ...)"
    return ", ".join(map(str, channels))


def _top_table(result: Mapping[str, Any]) -> DataTable:
    table = DataTable([num("rank"), "before", num("prob"), "after", num("prob")])
    before, after = result["before"], result["after"]
    if before is None or after is None:
        flags = [Text(NONFINITE_LOGITS if p is None else "", style="red") for p in (before, after)]
        table.add_row("", flags[0], "", flags[1], "")
    for rank in range(max(len(before or ()), len(after or ()))):
        cells: list[RenderableType] = [str(rank + 1)]
        for preds in (before, after):
            if preds is not None and rank < len(preds):
                p = preds[rank]
                name = f"{p['index']} {p.get('label') or ''}".strip()
                style = "bold" if p["index"] == result["target"] else ""
                cells += [Text(name, style=style), fmt_pct(p["prob"])]
            else:
                cells += ["", ""]
        table.add_row(*cells)
    return table


def _ranking_table(ranking: list[Mapping[str, Any]], limit: int) -> DataTable:
    title = f"channels by target-logit drop (top {min(limit, len(ranking))} of {len(ranking)})"
    table = DataTable([num("rank"), num("channel"), num("logit drop"), num("Δ prob"),
                       num("KL")], title=title)
    for i, row in enumerate(ranking[:limit], 1):
        table.add_row(str(i), str(row["channel"]), fmt_float(row["drop"]),
                      fmt_float(row["delta_prob"]), fmt_float(row["kl"]))
    return table


def ablate_view(doc: Mapping[str, Any], *, top: int = 10, sweep: bool = False
                ) -> RenderableType:
    """The whole ``ablate`` table output: one block per input (with ``sweep``, its
    channel ranking too)."""
    parts: list[RenderableType] = [header(doc)]
    for result in doc["results"]:
        target = f"{result['target']} {result.get('target_label') or ''}".strip()
        what = "sweep, after = the top-ranked channel" if sweep else \
            _channels(result["channels"])
        line = Text()
        line.append(f"\n{result['input']}", style="bold")
        line.append(f"  {result['layer']} [{what}]  mode {result['mode']}  target {target}\n")
        line.append(f"Δ logit {fmt_float(result['delta_logit'])}  Δ prob "
                    f"{fmt_float(result['delta_prob'])}  KL {fmt_float(result['kl'])}")
        parts += [line, _top_table(result)]
        if sweep:
            parts.append(_ranking_table(result["ranking"], top))
    return Group(*parts)
