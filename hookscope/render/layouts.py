"""Each command's view, registered once: its table and its CSV columns (a contract)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import RenderableType

from hookscope.core.errors import HookscopeError
from hookscope.render import ablate, camview, grads, grid, report, tables, training, tree

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


VIEWS: dict[str, View] = {}


def register(command: str, *, csv: Callable[..., Rows] | None = None,
             plot: Callable[..., Any] | None = None,
             texts: Mapping[str, Callable[..., str]] | None = None,
             ) -> Callable[[Callable[..., RenderableType]], Callable[..., RenderableType]]:
    """Register ``command``'s table view (the decorated function), its CSV layout, its
    figure and its own text formats."""

    def wrap(table: Callable[..., RenderableType]) -> Callable[..., RenderableType]:
        if command in VIEWS:
            raise ValueError(f"a view for {command!r} is already registered")
        VIEWS[command] = View(table, csv, plot, dict(texts or {}))
        return table

    return wrap


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
    from hookscope.render.plots import profile_figure

    return profile_figure(doc["layers"], title=f"{doc['model']}: activation profile")


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


@register("stats", csv=stats_csv, plot=stats_plot)
def stats_table(doc: Doc, *, input_stats: bool = False, per_channel: bool = False,
                percentiles: tuple[str, ...] = ()) -> RenderableType:
    return tables.stats_view(doc, input_stats=input_stats, per_channel=per_channel,
                             percentiles=percentiles)


def models_csv(doc: Doc) -> Rows:
    return [m | {"weights": _joined(m["weights"])} for m in doc["models"]], MODELS_COLUMNS


@register("models", csv=models_csv)
def models_table(doc: Doc) -> RenderableType:
    return tree.models_table(doc)


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


@register("layers", csv=layers_csv)
def layers_table(doc: Doc) -> RenderableType:
    return tree.layers_view(doc)


def cam_csv(doc: Doc) -> Rows:
    """The contract's columns, then ``layers`` (joined with ``+``) and one column per metric."""
    from hookscope.render.camview import METRIC_ORDER

    present = [m for m in METRIC_ORDER if any(m in (r.get("metrics") or {})
                                              for r in doc["results"])]
    rows = [r | dict(zip(("peak_y", "peak_x"), r.get("peak") or [None, None], strict=True))
            | {"layers": "+".join(r.get("layers") or [r["layer"]])}
            | {m: (r.get("metrics") or {}).get(m) for m in present}
            for r in doc["results"]]
    return rows, CAM_COLUMNS + ("layers", *present)


@register("gradcam", csv=cam_csv)
def cam_table(doc: Doc) -> RenderableType:
    return camview.cam_view(doc)


def grads_plot(doc: Doc, *, vanish: float = 1e-3, explode: float = 1e3, **options: Any) -> Any:
    """The gradient flow (``grads --plot``)."""
    from hookscope.render.plots import gradient_figure

    return gradient_figure(doc["layers"], median=doc.get("median_norm"), vanish=vanish,
                           explode=explode, title=f"{doc['model']}: gradient flow")


def grads_csv(doc: Doc, *, params: bool = True) -> Rows:
    return grads.csv_rows(doc), grads.CSV_COLUMNS


@register("grads", csv=grads_csv, plot=grads_plot)
def grads_table(doc: Doc, *, params: bool = True) -> RenderableType:
    return grads.grads_view(doc, params=params)


def features_csv(doc: Doc) -> Rows:
    return [r | {"channels": _joined(r["channels"])} for r in doc["grids"]], FEATURE_COLUMNS


@register("features", csv=features_csv)
def features_table(doc: Doc) -> RenderableType:
    return grid.features_view(doc)


def ablate_csv(doc: Doc, *, top: int = 10, sweep: bool = False) -> Rows:
    if sweep:
        return [r | {"rank": i} | ranked for r in doc["results"]
                for i, ranked in enumerate(r["ranking"], 1)], SWEEP_COLUMNS
    return [r | {"channels": _joined(r["channels"])} for r in doc["results"]], ABLATE_COLUMNS


@register("ablate", csv=ablate_csv)
def ablate_table(doc: Doc, *, top: int = 10, sweep: bool = False) -> RenderableType:
    return ablate.ablate_view(doc, top=top)


# ----------------------------------------------------------------- check


def _github(doc: Doc) -> str:
    from hookscope.render.check import github_annotations

    return github_annotations(doc)


@register("check", texts={"github": _github})
def check_table(doc: Doc) -> RenderableType:
    from hookscope.render.check import check_view

    return check_view(doc)


# ----------------------------------------------------------------- diff

from hookscope.render import diff as _diff  # noqa: E402  (one block per command, appended)

register("diff", csv=_diff.diff_csv)(_diff.diff_view)


# ----------------------------------------------------------------- watch

from hookscope.render import watchview as _watch  # noqa: E402

register("watch", csv=_watch.watch_csv)(_watch.watch_view)


# ----------------------------------------------------------------- debug (stdout streams instead)

register("debug", texts={"ndjson": tree.debug_ndjson})(tree.debug_view)


# ----------------------------------------------------------------- report: HTML pages


def _page(doc: Any) -> RenderableType:
    raise HookscopeError("a report is a page: write it as html.")


register("report", texts={"html": report.report_html})(_page)  # doc: a probes.report.Report
register("training", texts={"html": training.training_html})(_page)  # doc: a TrainingLog
