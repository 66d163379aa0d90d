"""The one output path: every command's document drawn as a table or written as JSON, CSV or
an HTML page, through the views registered once here (:data:`VIEWS`), each with its CSV
columns (a contract). The one exception is ``debug``'s live trace, which streams
(:class:`hookscope.render.tree.TraceWriter`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import RenderableType

from hookscope.core.errors import HookscopeError
from hookscope.core.files import Output, dumps_csv, dumps_json, dumps_ndjson, write
from hookscope.render import (
    ablate,
    attrview,
    camview,
    check,
    console,
    diff,
    features,
    grads,
    plots,
    report,
    tables,
    training,
    tree,
    watchview,
)

Doc = Mapping[str, Any]
Rows = tuple[list[dict[str, Any]], Sequence[str]]


@dataclass(frozen=True)
class View:
    """How one command's document is shown: a Rich renderable, and optionally CSV, a
    matplotlib figure (``--plot``) and formats of its own, each the document as text (such
    as ``check``'s GitHub annotations, or a report's HTML page)."""

    table: Callable[..., RenderableType]
    csv: Callable[..., Rows] | None = None
    plot: Callable[..., Any] | None = None
    texts: Mapping[str, Callable[..., str]] = field(default_factory=dict)


STATS_COLUMNS = ("name", "type", "call", "input_shapes", "output_shape", "mean", "std", "min",
                 "max", "zero_fraction", "nonfinite", "output_shapes")
INPUT_STATS_COLUMNS = ("input_mean", "input_std", "input_min", "input_max",
                       "input_zero_fraction", "input_nonfinite")
LAYERS_COLUMNS = ("name", "type", "depth", "params", "params_total", "trainable", "call",
                  "input_shapes", "output_shape", "output_shapes", "flops", "macs",
                  "output_bytes", "params_bytes", "params_bytes_total")
MODELS_COLUMNS = ("name", "task", "default", "weights")
CAM_COLUMNS = ("input", "method", "layer", "target", "label", "score", "prob", "peak_y",
               "peak_x", "overlay", "heatmap", "raw")
FEATURE_COLUMNS = ("input", "layer", "type", "call", "shape", "channels", "nonfinite", "path")
ABLATE_COLUMNS = ("input", "layer", "mode", "channels", "target", "target_label", "delta_logit",
                  "delta_prob", "kl")
SWEEP_COLUMNS = ("input", "layer", "mode", "target", "target_label", "rank", "channel", "drop",
                 "delta_prob", "kl")


def _joined(values: list[Any]) -> str:
    return ",".join(map(str, values))


CHANNEL_COLUMNS = ("channel_dim", "channel", "channel_count", "channel_mean", "channel_std", "channel_min",
                   "channel_max", "channel_zero_fraction", "channel_nonfinite")


def stats_plot(doc: Doc, **options: Any) -> Any:
    """The activation profile (``stats --plot``)."""
    return plots.profile_figure(doc["layers"], title=f"{doc['model']}: activation profile")


def stats_csv(doc: Doc, *, input_stats: bool = False, per_channel: bool = False,
              percentiles: tuple[str, ...] = ()) -> Rows:
    """One row per call; with ``per_channel``, one per (call, channel), the call's columns
    repeated. New columns come last: ``p<P>`` per percentile (the call's), then
    ``CHANNEL_COLUMNS`` and ``channel_p<P>`` (the channel's)."""
    rows = []
    for row in doc["layers"]:
        row = row | {f"input_{k}": v for k, v in (row.get("input_stats") or {}).items()}
        row |= {f"p{k}": v for k, v in (row.get("percentiles") or {}).items()}
        if not per_channel:
            rows.append(row)
            continue
        for channel in row.get("channels") or [{}]:
            own = {f"channel_p{k}": v for k, v in (channel.get("percentiles") or {}).items()}
            rows.append(row | own | {("channel" if k == "channel" else f"channel_{k}"): v
                                     for k, v in channel.items() if k != "percentiles"})
    columns = STATS_COLUMNS + (INPUT_STATS_COLUMNS if input_stats else ())
    columns += tuple(f"p{k}" for k in percentiles)
    if per_channel:
        columns += CHANNEL_COLUMNS + tuple(f"channel_p{k}" for k in percentiles)
    return rows, columns


def models_csv(doc: Doc) -> Rows:
    return [m | {"weights": _joined(m["weights"])} for m in doc["models"]], MODELS_COLUMNS


def layers_csv(doc: Doc) -> Rows:
    """One row per call, as in ``stats``; a module that never ran gets one row, no call.

    ``flops``, ``macs`` and ``output_bytes`` are the call's own (the JSON layer's ``flops``
    sums its calls); ``params_bytes`` and ``params_bytes_total`` are summed over dtypes.
    """
    rows = []
    for row in doc["layers"]:
        calls = row["calls"] or [{}]
        sizes = {key: sum(row[key].values()) for key in ("params_bytes", "params_bytes_total")
                 if key in row}
        rows += [row | call | sizes | {"call": i if call else None}
                 for i, call in enumerate(calls)]
    return rows, LAYERS_COLUMNS


def cam_csv(doc: Doc) -> Rows:
    """The contract's columns, then ``layers`` (joined with ``+``), one column per metric and a
    volume's ``peak_d``; the peak's last coordinate is ``peak_x`` (a signal's position too)."""
    rows, present = camview.metric_columns(doc["results"])
    volume = ("peak_d",) if any(len(r.get("peak") or ()) == 3 for r in rows) else ()
    last_first = ("peak_x", "peak_y", "peak_d")
    rows = [r | dict(zip(last_first, reversed(r.get("peak") or ()), strict=False))
            | {"layers": "+".join(r.get("layers") or [r["layer"]])} for r in rows]
    return rows, CAM_COLUMNS + ("layers", *present, *volume)


def grads_plot(doc: Doc, *, vanish: float = 1e-3, explode: float = 1e3, **options: Any) -> Any:
    """The gradient flow (``grads --plot``)."""
    return plots.gradient_figure(doc["layers"], median=doc.get("median_norm"), vanish=vanish,
                                 explode=explode, title=f"{doc['model']}: gradient flow")


def features_csv(doc: Doc) -> Rows:
    return [r | {"channels": _joined(r["channels"])} for r in doc["grids"]], FEATURE_COLUMNS


def ablate_csv(doc: Doc, *, top: int = 10, sweep: bool = False) -> Rows:
    if sweep:
        return [r | {"rank": i} | ranked for r in doc["results"]
                for i, ranked in enumerate(r["ranking"], 1)], SWEEP_COLUMNS
    return [r | {"channels": _joined(r["channels"])} for r in doc["results"]], ABLATE_COLUMNS


def _page(doc: Any) -> RenderableType:
    raise HookscopeError("a report is a page: write it as html.")


VIEWS: dict[str, View] = {
    "stats": View(tables.stats_view, stats_csv, stats_plot),
    "models": View(tree.models_table, models_csv),
    "layers": View(tree.layers_view, layers_csv),
    "gradcam": View(camview.cam_view, cam_csv),
    "attribute": View(attrview.attr_view, attrview.attr_csv),
    "grads": View(grads.grads_view, grads.grads_csv, grads_plot),
    "features": View(features.features_view, features_csv),
    "ablate": View(ablate.ablate_view, ablate_csv),
    "check": View(check.check_view, texts={"github": check.github_annotations,
                                           "junit": check.junit_xml}),
    "diff": View(diff.diff_view, diff.diff_csv),
    "watch": View(watchview.watch_view, watchview.watch_csv),
    # debug's live trace streams instead (render.tree.TraceWriter); this is its whole document
    "debug": View(tree.debug_view, texts={"ndjson": tree.debug_ndjson}),
    # HTML pages: doc is a report.Report, or a training.log_reader.TrainingLog
    "report": View(_page, texts={"html": report.report_html}),
    "training": View(_page, texts={"html": training.training_html}),
}


def emit(command: str, doc: Any, fmt: str, output: Output, **options: Any) -> None:
    """Write ``doc`` as ``fmt`` (table, json, ndjson, csv, or a text format of the command's
    own, such as ``html``) to ``output``; ``options`` go to the view.

    ``doc`` is the command's JSON document, or for a page the report it draws. A table goes
    to the terminal with colour, or as plain text into a file or a pipe. A format the command
    lacks, or an output that cannot be written, is a :class:`HookscopeError`.
    """
    view, start = VIEWS[command], time.perf_counter()
    if fmt in view.texts:
        text = view.texts[fmt](doc, **options)
        write(output, text)
        if fmt == "html":
            size = len(text.encode("utf-8", "surrogateescape"))
            logging.getLogger("hookscope").info("wrote %s (%s) in %.2f s", output,
                                                tables.fmt_count(size, "B"), time.perf_counter() - start)
    elif fmt in ("json", "ndjson"):
        write(output, (dumps_json if fmt == "json" else dumps_ndjson)(doc))
    elif fmt == "csv":
        if view.csv is None:
            raise HookscopeError(f"{command} has no CSV output; use --format table or json.")
        rows, columns = view.csv(doc, **options)
        write(output, dumps_csv(rows, columns))
    elif output.is_stdout and console.stdout().is_terminal:
        console.stdout().print(view.table(doc, **options))
    else:  # a file or a pipe: plain text, at the width a pipe gets
        width = console.stdout().width if output.is_stdout else 160
        write(output, console.render_text(view.table(doc, **options), width))


def emit_plot(command: str, doc: Mapping[str, Any], output: Output | None, **options: Any) -> None:
    """Draw ``command``'s figure of ``doc`` and write it to ``output`` (SVG or PNG, from its
    suffix; atomically). Nothing happens without an output."""
    if output is None:
        return
    figure = VIEWS[command].plot
    if figure is None:
        raise HookscopeError(f"{command} has no plot.")
    plots.write_plot(figure(doc, **options), output)
