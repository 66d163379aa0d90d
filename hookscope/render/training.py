"""The training page (``hookscope report LOG_DIR``): a training log's envelope, the non-finite
event that stopped it, the layers flagged for drift, layers x steps heat maps, line plots of
the gradient norms and update ratios, and the last logging step's rows as sortable tables.
It is ``templates/training.html.j2`` on the model report's base template (autoescaped); the
figures are drawn in :mod:`hookscope.render.plots`' style.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hookscope import __version__
from hookscope.core.files import dumps_json, format_shape
from hookscope.numerics.drift import finite
from hookscope.numerics.health import SUSTAINED
from hookscope.render import html, plots
from hookscope.render.html import cell, fact, lead_cells, num, page_row, render, stats_cells, strong
from hookscope.render.plots import GREY, RED, styled_figure
from hookscope.render.tables import fmt_float, health
from hookscope.training.log_reader import call_key, listed

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from hookscope.training.log_reader import TrainingLog

LAYER_COLUMNS = (*html.LEAD_COLUMNS, ("output", "text"), *html.STATS_COLUMNS, ("grad norm", "num"),
                 ("grad non-finite", "num"))
PARAM_COLUMNS = (("#", "num"), ("parameter", "text"), ("norm", "num"), ("grad norm", "num"),
                 ("update ratio", "num"))
#: The classic rule of thumb for SGD: an update about 1e-3 of the weight per step.
RATIO_REFERENCE = 1e-3


def _layer_row(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    grad_bad = int(row.get("grad_nonfinite") or 0)
    cells = [*lead_cells(i, row), cell(format_shape(row.get("output_shape"))), *stats_cells(row),
             num(row.get("grad_norm")), strong(grad_bad)]
    return page_row(row, cells, "bad" if grad_bad else health(row))


def _param_row(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    return page_row(row, [cell(i, i, "n dim"), cell(row["name"], row["name"], code=True),
                          *(num(row.get(k)) for k in ("norm", "grad_norm", "update_ratio"))])


def _event(log: TrainingLog) -> dict[str, Any] | None:
    from hookscope.checks.log import event_text

    event = log.event
    if event is None:
        return None
    keys = ("module", "type", "phase", "step", "call", "rank")
    facts = [(k, fact(k, event[k]), False) for k in keys if event.get(k) is not None]
    inputs = [i for i in event.get("inputs") or () if isinstance(i, Mapping)]
    columns = list(dict.fromkeys(k for i in inputs for k in i))
    cells = [[_value(i.get(c)) for c in columns] for i in inputs]
    return {"text": f"{log.outcome()}: {event_text(event)}", "facts": facts, "inputs": cells,
            "columns": columns}


def _value(value: Any) -> str:
    if isinstance(value, float):
        return fmt_float(value)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return format_shape(value)
    return "-" if value is None else value if isinstance(value, str) else json.dumps(value)


Series = dict[Any, list[float | None]]

#: Each quantity drawn: the row key, its title, whether it is drawn as log10, its colormap.
QUANTITIES = (("mean", "mean", False, "RdBu_r"), ("std", "std", True, "viridis"),
              ("zero_fraction", "zero fraction", False, "magma"),
              ("grad_norm", "gradient norm", True, "viridis"))
#: Layer names longer than this are cut in the figures (the tables show them whole).
NAME_CHARS = 28


def cut_name(text: str) -> str:
    """A module name cut to :data:`NAME_CHARS`."""
    return text if len(text) <= NAME_CHARS else text[:NAME_CHARS - 1] + "…"


def matrix(series: Series, log10: bool) -> Any:
    """Rows of ``series`` as a float array (NaN where missing; log10 where asked)."""
    import numpy as np

    values = np.array(list(series.values()), dtype=np.float64).reshape(len(series), -1)
    if log10:
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(values > 0, np.log10(values), math.nan)
    return values


def _norm(values: Any, key: str) -> Any:
    """The colour scale of a heat map: robust, so that one outlier does not wash out the
    rest: clipped to Tukey's fences (1.5 interquartile ranges beyond the quartiles), and for
    the mean centred on 0."""
    import numpy as np
    from matplotlib.colors import Normalize, TwoSlopeNorm

    finite = values[np.isfinite(values)]
    if key == "zero_fraction" or not finite.size:
        return Normalize(0.0, 1.0)
    q1, q3 = np.percentile(finite, [25, 75])
    # Capped: a scale spanning -bound to bound must itself be finite (the colour bar).
    lo = max(float(finite.min()), q1 - 1.5 * (q3 - q1), -1e300)
    hi = min(float(finite.max()), q3 + 1.5 * (q3 - q1), 1e300)
    if key == "mean":
        bound = max(abs(lo), abs(hi)) or 1.0
        return TwoSlopeNorm(0.0, -bound, bound)
    return Normalize(lo, hi if hi > lo else lo + 1.0)


#: Heat-map cells: not logged or not finite; exactly 0 where that means dead (std, gradient).
MISSING, ZERO = "#d0d7de", "#e3b341"


def heatmap_figure(steps: Sequence[int], series: Series, key: str, title: str, log10: bool,
                   cmap: str) -> Figure:
    """One quantity as a layers x steps heat map: missing and non-finite cells grey; with
    ``log10``, cells exactly 0 (a dead layer's std, a zero gradient) yellow."""
    import matplotlib
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    values, raw = matrix(series, log10), matrix(series, False)
    names = [cut_name(name or "(model)") + (f" #{call}" if call else "") for name, call in series]
    height = min(max(1.6, 0.16 * len(names) + 1.0), 14.0)
    colours = matplotlib.colormaps[cmap].with_extremes(bad=MISSING)
    norm = _norm(values, key)
    finite = values[np.isfinite(values)]
    extend = ["neither", "min", "max", "both"][int(finite.size > 0 and finite.min() < norm.vmin)
                                                + 2 * int(finite.size > 0 and finite.max() > norm.vmax)]
    with styled_figure(None, width=6.4, height=height) as fig:
        ax = fig.add_subplot()
        image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap=colours, norm=norm)
        legend = [Patch(color=MISSING, label="not logged / not finite")]
        if log10 and (raw == 0).any():
            ax.imshow(np.where(raw == 0, 1.0, np.nan), aspect="auto", interpolation="nearest",
                      cmap=ListedColormap([ZERO]).with_extremes(bad=(0, 0, 0, 0)))
            legend.append(Patch(color=ZERO, label="exactly 0 (dead)"))
        ax.legend(handles=legend, loc="lower left", bbox_to_anchor=(0, 1), ncol=2, fontsize=7,
                  frameon=False, borderaxespad=0.2)
        fig.colorbar(image, ax=ax, label=f"log10 {title}" if log10 else title, shrink=0.9,
                     extend=extend)
        every = max(1, math.ceil(len(names) / 60))
        ax.set_yticks(range(0, len(names), every), names[::every],
                      fontsize=6.5 if len(names) > 24 else 8, parse_math=False)
        every = max(1, math.ceil(len(steps) / 8))
        ax.set_xticks(range(0, len(steps), every), [str(s) for s in steps[::every]])
        ax.set_xlabel("step")
    return fig


def lines_figure(steps: Sequence[int], series: Series, title: str, *, log10: bool,
                 ylabel: str, reference: float | None = None) -> Figure:
    """Each row of ``series`` as a thin line over the logging steps, coloured from the
    first (dark) to the last (light); with several rows, their median in bold red."""
    import matplotlib
    import numpy as np

    values = matrix(series, False)
    x = np.array(steps, dtype=np.float64)
    shades = matplotlib.colormaps["viridis"]
    with styled_figure(None, width=6.4, height=2.8) as fig:
        ax = fig.add_subplot()
        n = max(len(values) - 1, 1)
        for i, row in enumerate(values):
            ax.plot(x, row, color=shades(0.9 * i / n), lw=0.7, alpha=0.7)
        if len(values) > 1:
            with warnings.catch_warnings():  # a step where nothing is finite: no median
                warnings.simplefilter("ignore", RuntimeWarning)
                middle = np.nanmedian(np.where(np.isfinite(values), values, np.nan), axis=0)
            ax.plot(x, middle, color=RED, lw=1.6, label="median")
        if reference is not None:
            ax.axhline(reference, color=GREY, lw=0.9, ls=(0, (4, 3)),
                       label=f"{reference:g}")
        if log10 and np.nanmax(np.where(values > 0, values, np.nan), initial=0) > 0:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", color="#eaeef2", lw=0.6)
        ax.set_title(title, loc="left")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
    return fig


def has_values(series: Series) -> bool:
    """Whether any value was logged at all (a figure of nothing is left out)."""
    return any(v is not None for row in series.values() for v in row)


def _figure(key: str, title: str, fig: Any, alt: str, caption: str) -> dict[str, Any]:
    from markupsafe import Markup

    return {"key": key, "title": title, "svg": Markup(plots.inline_svg(fig, alt)),
            "caption": caption}


def _figures(log: TrainingLog) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    steps = [int(s.get("step") or 0) for s in log.steps]
    heat = [_figure(key, f"{title.capitalize()} over steps",
                    heatmap_figure(steps, series, key, title, log10, cmap), f"{title} heat map",
                    "One row per layer call, one column per logging step"
                    f"{'; log10 of the value' if log10 else ''}. Grey: not logged, or not finite"
                    f"{'; yellow: exactly 0' if log10 else ''}. The colours are clipped to the "
                    "values' Tukey fences, so that an outlier takes the scale's end.")
            for key, title, log10, cmap in QUANTITIES
            if has_values(series := log.series("layers", key)[1])]
    spans = [log.span(step) for step in steps]
    ratios = {k: [None if v is None else v / n for v, n in zip(row, spans, strict=True)]
              for k, row in log.series("params", "update_ratio")[1].items()}
    lines: list[tuple[str, str, Series, str, dict[str, Any], str]] = [
        ("loss", "Loss", {"loss": [finite(s.get("loss")) for s in log.steps]},
         "Loss at the logging steps", {"log10": False, "ylabel": "loss"},
         "The loss given to watch.step() at each logging step."),
        ("grad_norm", "Gradient norms", log.series("layers", "grad_norm")[1],
         "Gradient norm at each layer call's output", {"log10": True, "ylabel": "‖grad‖"},
         "One line per layer call, first layers dark; red: the median over layers."),
        ("update_ratio", "Update ratios", ratios,
         "Update ratio ‖Δw‖/‖w‖ per step, per parameter",
         {"log10": True, "ylabel": "‖Δw‖/‖w‖ per step", "reference": RATIO_REFERENCE},
         "One line per parameter: the update since the previous logging step over the steps it "
         "spans (at most the mean step's ratio, equal when the steps point one way); dashed: "
         f"{RATIO_REFERENCE:g} per step, the usual rule of thumb.")]
    return heat, [_figure(key, name, lines_figure(steps, series, title, **style),
                          f"{name.lower()} over steps", caption)
                  for key, name, series, title, style, caption in lines if has_values(series)]


def _chips(log: TrainingLog, findings: list[Any]) -> list[dict[str, str]]:
    """The summary: one verdict on non-finite values (the watch's, else the rows')."""
    said, bad = log.outcome(), log.nonfinite_steps()
    if said is not None:
        verdict = {"cls": "warning" if said.startswith("warned") else "error", "text": said}
    elif bad:
        verdict = {"cls": "error", "text": f"non-finite values at logging steps {listed(bad)}"}
    else:
        verdict = {"cls": "ok", "text": "no non-finite value"}
    return [{"cls": "", "text": f"{len(log.steps)} logging steps"},
            {"cls": "", "text": f"{len(log.layer_keys())} layer calls"}, verdict,
            {"cls": "warning" if findings else "ok", "text": f"{len(findings)} flagged layers"}]


#: The findings' order and class, by their most serious flag (docs/watch.md, Layer flags).
RANKS = {"nonfinite": (0, "error"), "zero_grad": (1, "warning"), "dead": (1, "warning"),
         "vanish": (1, "warning"), "explode": (1, "warning"), "drift": (2, "")}


def _sustained(log: TrainingLog, key: tuple[str, int]) -> bool:
    """Whether the call was flagged ``drift`` at each of the last :data:`SUSTAINED` logging steps."""
    last = log.steps[-SUSTAINED:]
    return len(last) == SUSTAINED and all(any(
        call_key(r) == key and "drift" in (r.get("flags") or ()) for r in step.get("layers") or ())
        for step in last)


def _findings(log: TrainingLog) -> tuple[list[dict[str, Any]], str | None]:
    """The flagged calls, most serious first; a drift only when it matters: from a
    ``reference`` (the first logging step's drift is training itself) and sustained. The
    other drifts are one line."""
    found: list[tuple[int, int, dict[str, Any]]] = []
    brief: list[str] = []
    reference = log.envelope.get("reference")
    for entry in log.flagged():
        rank, cls = min(RANKS.get(f, (1, "warning")) for f in entry["flags"])
        if rank == 2 and not (reference and _sustained(log, (entry["layer"], entry["call"]))):
            brief.append(entry["name"])
        else:
            found.append((rank, len(found), entry | {"cls": cls}))
    limit = log.envelope.get("max_drift")
    past = f"past max_drift{f' ({limit:g})' if isinstance(limit, (int, float)) else ''}"
    why = f"not at each of the last {SUSTAINED} logging steps" if reference else \
        "from the first logging step, as training does (a drift from a reference is a finding)"
    line = f"{len(brief)} layer call{'s' * (len(brief) != 1)} drifted {past} {why}: " \
        f"{listed(brief, 5)}." if brief else None
    return [entry for _, _, entry in sorted(found, key=lambda f: f[:2])], line


def _reading(value: Any) -> str | None:
    """A recorded min or max: a number, the writer's word for a non-finite one, or None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return fmt_float(float(value))
    return value if isinstance(value, str) else None


def _recorded(row: Mapping[str, Any], flags: Sequence[str]) -> dict[str, Any]:
    """One call at one recorded step: its output's range, the largest |gradient| at it."""
    lo, hi = _reading(row.get("min")), _reading(row.get("max"))
    grads = [abs(float(v)) for v in (row.get("grad_min"), row.get("grad_max"))
             if isinstance(v, (int, float)) and math.isfinite(v)]
    kind, grad_kind = (word if isinstance(word := row.get(k), str) and word != "finite" else None
                       for k in ("values", "grad_values"))  # "nan", "+inf", ... (or None)
    shown = kind if kind is not None else f"{lo or 'null'} … {hi or 'null'}"
    grad = grad_kind if grad_kind is not None else fmt_float(max(grads)) if grads else "-"
    bad = lo is None or hi is None or kind is not None or grad_kind is not None or any(
        isinstance(row.get(k), str) for k in ("min", "max", "grad_min", "grad_max"))
    return {"text": f"{shown}; ∇ {grad}" + "".join(f" [{f}]" for f in flags),
            "cls": "bad" if bad else ""}


def _recorder(log: TrainingLog) -> dict[str, Any] | None:
    """The flight recorder of ``nonfinite.json`` as a calls x steps table, up to the event."""
    steps = [s for s in log.recorder if isinstance(s.get("step"), int)]
    if not steps:
        return None
    cells: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for i, step in enumerate(steps):
        flags = {call_key(r): r.get("flags") or [] for r in step.get("rows") or ()
                 if isinstance(r, Mapping)}
        for row in step.get("layers") or ():
            if isinstance(row, Mapping):
                key = call_key(row)
                cells.setdefault(key, {})[i] = _recorded(row, flags.get(key, []))
    event = log.event or {}
    blamed = (event.get("module"), event.get("call"))
    return {"steps": [f"{s['step']}{' (event)' if s['step'] == event.get('step') else ''}"
                      for s in steps],
            "rows": [{"name": (name or "(the model)") + (f" #{call}" if call else ""),
                      "cls": "bad" if (name, call) == blamed else "",
                      "cells": [by.get(i, {"text": "-", "cls": ""}) for i in range(len(steps))]}
                     for (name, call), by in cells.items()]}


def _facts(log: TrainingLog) -> list[tuple[str, dict[str, Any], bool]]:
    steps = [s.get("step") for s in log.steps]
    span = f"{steps[0]} to {steps[-1]}" if steps else "-"
    return [("log", {"text": log.path}, False), ("steps", {"text": span}, False)] + [
        (key.replace("_", " "), fact(key, value), False) for key, value in log.envelope.items()
        if key not in ("hookscope", "model", "command")]


def training_html(log: TrainingLog) -> str:
    """The whole training page as text."""
    last = log.steps[-1] if log.steps else {}
    flagged, drifted = _findings(log)
    heat, lines = _figures(log)
    return render(
        "training.html.j2", model=str(log.envelope.get("model") or log.path),
        env={"hookscope": log.envelope.get("hookscope", __version__)},
        version=__version__, log_path=log.path, chip_items=_chips(log, flagged), envelope=_facts(log),
        env_json=dumps_json(log.envelope), event=_event(log), flagged=flagged, drifted=drifted,
        recorder=_recorder(log),
        heatmaps=heat, lines=lines, last_step=last.get("step", "-"),
        layer_columns=LAYER_COLUMNS, param_columns=PARAM_COLUMNS,
        layers=[_layer_row(i, r) for i, r in enumerate(last.get("layers") or ())],
        params=[_param_row(i, r) for i, r in enumerate(last.get("params") or ())])
