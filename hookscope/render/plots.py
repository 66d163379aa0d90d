"""The activation profile and the gradient flow, from a JSON document's rows, for ``--plot``
and the HTML report: matplotlib's object API on the Agg canvas (no pyplot, no global state),
imported inside the functions so ``hookscope --help`` never loads it."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from html import escape
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookscope.core.errors import HookscopeError
from hookscope.core.files import Output, atomic_path, resolve_output
from hookscope.render.tables import ZERO_WARN

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Rows = Sequence[Mapping[str, Any]]

#: The terminal table's red and yellow, as the page and the figures draw them.
RED = "#d1242f"
YELLOW = "#e3b341"
BLUE = "#2f6db5"
GREY = "#6e7781"
FORMATS = ("svg", "png")
_STYLE: dict[str, Any] = {
    "font.size": 9.5, "axes.titlesize": 10.5, "axes.labelsize": 9.5, "axes.edgecolor": "#8c959f",
    "axes.linewidth": 0.6, "xtick.color": "#57606a", "ytick.color": "#57606a",
    "axes.labelcolor": "#24292f", "legend.frameon": False, "legend.fontsize": 8.5,
    "svg.fonttype": "none", "svg.hashsalt": "hookscope", "font.family": "DejaVu Sans",
}


def plot_format(path: str | Path) -> str:
    """``svg`` or ``png``, from the file's suffix (any other: :class:`HookscopeError`)."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise HookscopeError(f"{path}: plots are written as .svg or .png; name the file "
                             "with one of these suffixes.")
    return suffix


def _floats(rows: Rows, key: str) -> Any:
    import numpy as np

    return np.array([r.get(key) for r in rows], dtype=np.float64)  # None: NaN


def _mark(ax: Axes, indices: Sequence[int], colour: str, alpha: float, label: str) -> None:
    """Shade the calls at ``indices`` (sorted) across the plot height, a span per run."""
    runs = groupby(enumerate(indices), lambda pair: pair[1] - pair[0])
    for k, (_, run) in enumerate(runs):
        found = [i for _, i in run]
        ax.axvspan(found[0] - 0.5, found[-1] + 0.5, color=colour, alpha=alpha, lw=0,
                   label=label if k == 0 else None, zorder=0)


def _groups(ax: Axes, rows: Rows) -> None:
    """Name the top-level modules (``layer1``, ``layer2``...) that span enough calls to
    label, with a thin line where each starts."""
    tops = [str(r.get("name", "")).split(".")[0] for r in rows]
    starts = [i for i, t in enumerate(tops) if i == 0 or t != tops[i - 1]]
    spans = list(zip(starts, [*starts[1:], len(tops)], strict=True))
    wide = [(a, b) for a, b in spans if b - a >= max(3, len(tops) / 30)]
    if not 2 <= len(wide) <= 16:
        return
    for first, _ in wide:
        if first:
            ax.axvline(first - 0.5, color="#d0d7de", lw=0.6, zorder=0)
        ax.text(first - 0.3, 1.0, tops[first][:14], transform=ax.get_xaxis_transform(),
                fontsize=7.5, color=GREY, va="bottom", ha="left", clip_on=False,
                parse_math=False)  # names are not mathtext


def _scale(ax: Axes, mean: Any, std: Any, lo: Any, hi: Any) -> None:
    """Symmetric log when the range dwarfs the typical spread, so the bands stay visible."""
    import numpy as np

    spread = np.nanmedian(np.abs(mean) + std) if np.isfinite(std).any() else math.nan
    extent = np.nanmax(np.abs(np.concatenate([lo, hi]))) if np.isfinite(lo).any() else math.nan
    if math.isfinite(spread) and spread > 0 and extent > 50 * spread:
        # A power of ten, so the linear part ends on a labelled tick (0, ±1, ±10...).
        ax.set_yscale("symlog", linthresh=10.0 ** math.floor(math.log10(spread)))


def _calls_axes(ax: Axes, layers: Rows, xlabel: str, ylabel: str) -> None:
    """One tick a module call, labelled, with the top-level modules named above."""
    ax.set_xlim(-0.5, max(len(layers) - 0.5, 0.5))
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(axis="y", color="#eaeef2", lw=0.6)
    _groups(ax, layers)


@contextmanager
def styled_figure(title: str | None, width: float = 6.6, height: float = 3.0
                  ) -> Iterator[Figure]:
    """A new figure on the Agg canvas, drawn in the pages' style while the block runs."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_STYLE):  # type: ignore[arg-type]
        fig = Figure(figsize=(width, height + (0.3 if title else 0)), layout="constrained")
        FigureCanvasAgg(fig)
        if title:
            fig.suptitle(title, x=0.01, ha="left", fontsize=10, parse_math=False)
        yield fig


def profile_figure(layers: Rows, *, title: str | None = None) -> Figure:
    """The activation profile of the ``stats`` document's ``layers``: per call, the mean with
    ±std and min/max bands, the zero fraction on a second axis; non-finite calls shaded red,
    dead ones yellow."""
    import numpy as np

    x = np.arange(len(layers))
    mean, std = _floats(layers, "mean"), _floats(layers, "std")
    lo, hi, zeros = _floats(layers, "min"), _floats(layers, "max"), _floats(layers, "zero_fraction")
    with styled_figure(title) as fig:
        ax = fig.add_subplot()
        band = np.nan_to_num(std)
        ax.fill_between(x, lo, hi, color=BLUE, alpha=0.10, lw=0.4, label="min / max",
                        step=None, zorder=1)
        ax.fill_between(x, mean - band, mean + band, color=BLUE, alpha=0.28, lw=0,
                        label="mean ± std", zorder=2)
        ax.plot(x, mean, color=BLUE, lw=1.1, label="mean", zorder=3)
        _mark(ax, [i for i, r in enumerate(layers) if int(r.get("nonfinite") or 0)], RED,
              0.35, "non-finite")
        _mark(ax, [i for i, z in enumerate(zeros) if z >= ZERO_WARN], YELLOW, 0.35,
              f"dead (≥{ZERO_WARN:.0%} zeros)")
        _scale(ax, mean, std, lo, hi)
        _calls_axes(ax, layers, "module call, execution order (# in the table)", "output value")
        twin = ax.twinx()
        twin.plot(x, zeros, color=GREY, lw=0.8, ls=(0, (3, 2)), alpha=0.85,
                  label="zero fraction")
        twin.set_ylim(0, 1.02)
        twin.set_ylabel("zero fraction", color=GREY)
        handles = [h for a in (ax, twin) for h in a.get_legend_handles_labels()[0]]
        fig.legend(handles=handles, loc="outside lower left", ncols=min(len(handles), 4))
    return fig


def gradient_figure(layers: Rows, *, median: float | None, vanish: float = 1e-3,
                    explode: float = 1e3, title: str | None = None) -> Figure:
    """The gradient flow of the ``grads`` document's ``layers``: log10 of each call's output
    gradient norm, in backward order, with the ``median`` norm and the thresholds (``vanish``
    and ``explode`` times it)."""
    import numpy as np

    norms = _floats(layers, "norm")
    x = np.arange(len(layers))
    positive = norms[np.isfinite(norms) & (norms > 0)]
    floor = math.log10(positive.min()) - 0.5 if positive.size else -1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(norms > 0, np.log10(norms), floor)
    flags = [r.get("flag") for r in layers]
    with styled_figure(title) as fig:
        ax = fig.add_subplot()
        ax.plot(x, logs, color=BLUE, lw=1.0, marker="o", ms=2.2, label="log10 ‖grad‖",
                zorder=3)
        _thresholds(ax, median, vanish, explode)
        for flag, colour, marker in (("vanish", YELLOW, "v"), ("explode", RED, "^")):
            hit = [i for i, f in enumerate(flags) if f == flag]
            if hit:
                ax.scatter(x[hit], logs[hit], color=colour, marker=marker, s=22, zorder=4,
                           label=flag)
        _mark(ax, [i for i, f in enumerate(flags) if f == "nonfinite"], RED, 0.35,
              "non-finite")
        _calls_axes(ax, layers, "module call, backward order (output first)",
                    "log10 gradient norm")
        handles = ax.get_legend_handles_labels()[0]
        fig.legend(handles=handles, loc="outside lower left", ncols=min(len(handles), 4))
    return fig


def _thresholds(ax: Axes, median: float | None, vanish: float, explode: float) -> None:
    if median is None or not math.isfinite(median) or median <= 0:
        return
    level = math.log10(median)
    ax.axhline(level, color=GREY, lw=0.8, label="median")
    for factor, colour, name in ((explode, RED, "explode"), (vanish, YELLOW, "vanish")):
        ax.axhline(level + math.log10(factor), color=colour, lw=1.0, ls=(0, (4, 3)),
                   label=f"{name} ({factor:g}×)")


def figure_bytes(fig: Figure, fmt: str) -> bytes:
    """The figure as ``svg`` or ``png`` bytes (PNG at 150 dpi; no timestamps inside)."""
    import matplotlib

    buf = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    with matplotlib.rc_context(_STYLE):  # type: ignore[arg-type]
        fig.savefig(buf, format=fmt, dpi=150, metadata=metadata, facecolor="white")
    return buf.getvalue()


def inline_svg(fig: Figure, title: str) -> str:
    """The figure as an ``<svg>`` element for an HTML page, with an accessible title."""
    text = figure_bytes(fig, "svg").decode("utf-8")
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text[text.index("<svg"):], flags=re.S)
    head, rest = text.split(">", 1)
    text = re.sub(r'\s(width|height)="[^"]*"', "", head, count=2) + ">" + rest
    return text.replace("<svg", f'<svg role="img" aria-label="{escape(title)}"', 1)


def plot_output(path: str | Path | None, *, force: bool) -> Output | None:
    """Where a plot goes (None: no plot), checked before any work: a ``.svg`` or ``.png``
    name that can be written, else :class:`HookscopeError`."""
    if path is None:
        return None
    plot_format(path)
    return resolve_output(path, force=force)


def write_plot(fig: Figure, output: Output) -> None:
    """Write ``fig`` to ``output`` atomically, as SVG or PNG from its suffix."""
    data = figure_bytes(fig, plot_format(output.path if output.path is not None else ""))
    with atomic_path(output) as tmp:
        tmp.write_bytes(data)
