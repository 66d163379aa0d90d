"""The training page (``hookscope report LOG_DIR``): a training log's envelope, the non-finite
event that stopped it, the layers flagged for drift, layers x steps heat maps, line plots of
the gradient norms and update ratios, and the last logging step's rows as sortable tables.
It is ``templates/training.html.j2`` on the model report's base template (autoescaped).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hookscope.core.output import dumps_json, format_shape
from hookscope.render import plots
from hookscope.render import training_plots as tp
from hookscope.render.html import cell, lead_cells, num, render, strong
from hookscope.render.tables import ZERO_WARN, fmt_float
from hookscope.training.logs import number

if TYPE_CHECKING:
    from hookscope.training.logs import TrainingLog

LAYER_COLUMNS = (("#", "num"), ("layer", "text"), ("type", "text"), ("call", "num"),
                 ("output", "text"), ("mean", "num"), ("std", "num"), ("min", "num"),
                 ("max", "num"), ("zeros", "num"), ("non-finite", "num"),
                 ("grad norm", "num"), ("grad non-finite", "num"))
PARAM_COLUMNS = (("#", "num"), ("parameter", "text"), ("norm", "num"), ("grad norm", "num"),
                 ("update ratio", "num"))
#: The classic rule of thumb for SGD: an update about 1e-3 of the weight per step.
RATIO_REFERENCE = 1e-3


def _layer_row(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    zero, bad = number(row.get("zero_fraction")), int(row.get("nonfinite") or 0)
    grad_bad = int(row.get("grad_nonfinite") or 0)
    cls = "bad" if bad or grad_bad else "dead" if zero is not None and zero >= ZERO_WARN else ""
    cells = [*lead_cells(i, row), cell(format_shape(row.get("output_shape")), None),
             *(num(row.get(k)) for k in ("mean", "std", "min", "max")),
             cell("-" if zero is None else f"{zero:.1%}", zero, "n"), strong(bad),
             num(row.get("grad_norm")), strong(grad_bad)]
    return {"name": row["name"], "cls": cls, "cells": cells}


def _param_row(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    cells = [cell(i, i, "n dim"), cell(row["name"], row["name"], code=True),
             *(num(row.get(k)) for k in ("norm", "grad_norm", "update_ratio"))]
    return {"name": row["name"], "cls": "", "cells": cells}


def _event(event: Mapping[str, Any] | None) -> dict[str, Any] | None:
    from hookscope.training.rules import event_text

    if event is None:
        return None
    keys = ("module", "type", "phase", "step", "call", "rank")
    facts = [(k, event[k]) for k in keys if event.get(k) is not None]
    inputs = [i for i in event.get("inputs") or () if isinstance(i, Mapping)]
    columns = list(dict.fromkeys(k for i in inputs for k in i))
    cells = [[_value(i.get(c)) for c in columns] for i in inputs]
    return {"text": event_text(event), "facts": facts, "inputs": cells, "columns": columns}


def _value(value: Any) -> str:
    if isinstance(value, float):
        return fmt_float(value)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return format_shape(value)
    return "-" if value is None else value if isinstance(value, str) else json.dumps(value)


def _figure(key: str, title: str, fig: Any, alt: str, caption: str) -> dict[str, Any]:
    from markupsafe import Markup

    return {"key": key, "title": title, "svg": Markup(plots.inline_svg(fig, alt)),
            "caption": caption}


def _figures(log: TrainingLog) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    heat, lines = [], []
    for key, title, log10, cmap in tp.QUANTITIES:
        steps, series = log.series("layers", key)
        if tp.has_values(series):
            heat.append(_figure(
                key, f"{title.capitalize()} over steps",
                tp.heatmap_figure(steps, series, key, title, log10, cmap), f"{title} heat map",
                "One row per layer call, one column per logging step"
                f"{'; log10 of the value' if log10 else ''}. Grey: not logged, or not finite."))
    losses = [(int(s["step"]), number(s.get("loss"))) for s in log.steps]
    if any(v is not None for _, v in losses):
        fig = tp.lines_figure([k for k, _ in losses], {"loss": [v for _, v in losses]},
                              "Loss at the logging steps", log10=False, ylabel="loss")
        lines.append(_figure("loss", "Loss", fig, "loss over steps",
                             "The loss given to watch.step() at each logging step."))
    steps, grads = log.series("layers", "grad_norm")
    if tp.has_values(grads):
        fig = tp.lines_figure(steps, grads, "Gradient norm at each layer call's output",
                              log10=True, ylabel="‖grad‖")
        lines.append(_figure("grad_norm", "Gradient norms", fig, "gradient norms over steps",
                             "One line per layer call, first layers dark; red: the median "
                             "over layers."))
    steps, ratios = log.series("params", "update_ratio")
    if tp.has_values(ratios):
        fig = tp.lines_figure(steps, ratios, "Update ratio ‖Δw‖/‖w‖ per parameter",
                              log10=True, ylabel="‖Δw‖/‖w‖", reference=RATIO_REFERENCE)
        lines.append(_figure("update_ratio", "Update ratios", fig, "update ratios over steps",
                             "One line per parameter since the previous logging step; "
                             f"dashed: {RATIO_REFERENCE:g}, the usual rule of thumb."))
    return heat, lines


def _chips(log: TrainingLog, flagged: list[Any]) -> list[dict[str, str]]:
    last = log.steps[-1] if log.steps else {}
    bad = sum(1 for r in last.get("layers") or () if r.get("nonfinite") or r.get("grad_nonfinite"))
    return [{"cls": "", "text": f"{len(log.steps)} logging steps"},
            {"cls": "", "text": f"{len(log.layer_keys())} layer calls"},
            {"cls": "error" if log.event else "ok",
             "text": "stopped on a non-finite value" if log.event else "no non-finite stop"},
            {"cls": "error" if bad else "ok", "text": f"{bad} non-finite at the last step"},
            {"cls": "warning" if flagged else "ok", "text": f"{len(flagged)} flagged layers"}]


def _fact(key: str, value: Any) -> str:
    """An envelope entry in words: the selection summarised, times as UTC, the rest JSON."""
    if key == "selection" and isinstance(value, Mapping):
        modules = value.get("modules")
        shown = {k: v for k, v in value.items() if k != "modules"}
        count = f"; {len(modules)} modules" if isinstance(modules, list) else ""
        return ", ".join(f"{k} {json.dumps(v)}" for k, v in shown.items()) + count
    if key == "started" and isinstance(value, (int, float)):
        from datetime import datetime, timezone

        return datetime.fromtimestamp(value, timezone.utc).isoformat(timespec="seconds")
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _facts(log: TrainingLog) -> list[tuple[str, str]]:
    steps = [s.get("step") for s in log.steps]
    facts = [("log", log.path), ("steps", f"{steps[0]} to {steps[-1]}" if steps else "-")]
    facts += [(key.replace("_", " "), _fact(key, value)) for key, value in log.envelope.items()
              if key not in ("hookscope", "model", "command")]
    return facts


def training_html(log: TrainingLog) -> str:
    """The whole training page as text."""
    from hookscope import __version__

    last = log.steps[-1] if log.steps else {}
    flagged = log.flagged()
    heat, lines = _figures(log)
    return render(
        "training.html.j2", model=str(log.envelope.get("model") or log.path),
        env={"hookscope": log.envelope.get("hookscope", __version__)},
        version=__version__, log_path=log.path, chip_items=_chips(log, flagged), facts=_facts(log),
        env_json=dumps_json(log.envelope), event=_event(log.event), flagged=flagged,
        heatmaps=heat, lines=lines, last_step=last.get("step", "-"),
        layer_columns=LAYER_COLUMNS, param_columns=PARAM_COLUMNS,
        layers=[_layer_row(i, r) for i, r in enumerate(last.get("layers") or ())],
        params=[_param_row(i, r) for i, r in enumerate(last.get("params") or ())])
