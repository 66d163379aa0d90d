"""Figures of a training log's series (one value per logging step for each layer call or
parameter): layers x steps heat maps and line plots, in :mod:`hookscope.render.plots`' style.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hookscope.render.plots import GREY, RED, styled_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Series = dict[Any, list[float | None]]

#: Each quantity drawn: the row key, its title, whether it is drawn as log10, its colormap.
QUANTITIES = (("mean", "mean", False, "RdBu_r"), ("std", "std", True, "viridis"),
              ("zero_fraction", "zero fraction", False, "magma"),
              ("grad_norm", "gradient norm", True, "viridis"))
#: Layer names longer than this are cut in the figures (the tables show them whole).
NAME_CHARS = 28


def plain(text: str) -> str:
    """A module name as matplotlib text: no mathtext, cut to :data:`NAME_CHARS`."""
    text = text if len(text) <= NAME_CHARS else text[:NAME_CHARS - 1] + "…"
    return text.replace("\\", "\\\\").replace("$", r"\$")


def matrix(series: Series, log10: bool) -> Any:
    """Rows of ``series`` as a float array (NaN where missing; log10 where asked)."""
    import numpy as np

    values = np.array([[math.nan if v is None else v for v in row] for row in series.values()],
                      dtype=np.float64).reshape(len(series), -1)
    if log10:
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(values > 0, np.log10(values), math.nan)
    return values


def _norm(values: Any, key: str) -> Any:
    import numpy as np
    from matplotlib.colors import Normalize, TwoSlopeNorm

    finite = values[np.isfinite(values)]
    if key == "zero_fraction" or not finite.size:
        return Normalize(0.0, 1.0)
    if key == "mean":
        bound = float(np.percentile(np.abs(finite), 99)) or 1.0
        return TwoSlopeNorm(0.0, -bound, bound)
    lo, hi = float(finite.min()), float(finite.max())
    return Normalize(lo, hi if hi > lo else lo + 1.0)


def heatmap_figure(steps: Sequence[int], series: Series, key: str, title: str, log10: bool,
                   cmap: str) -> Figure:
    """One quantity as a layers x steps heat map; missing and non-finite cells grey."""
    import matplotlib

    values = matrix(series, log10)
    names = [plain(name or "(model)") + (f" #{call}" if call else "") for name, call in series]
    height = min(max(1.6, 0.16 * len(names) + 1.0), 14.0)
    colours = matplotlib.colormaps[cmap].with_extremes(bad="#d0d7de")
    with styled_figure(None, width=6.4, height=height) as fig:
        ax = fig.add_subplot()
        image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap=colours,
                          norm=_norm(values, key))
        fig.colorbar(image, ax=ax, label=f"log10 {title}" if log10 else title, shrink=0.9)
        every = max(1, math.ceil(len(names) / 60))
        ax.set_yticks(range(0, len(names), every), names[::every],
                      fontsize=6.5 if len(names) > 24 else 8)
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
