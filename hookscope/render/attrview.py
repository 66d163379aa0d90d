"""``hookscope attribute``'s files, document and table: overlays drawn as Grad-CAM's
(:func:`hookscope.render.heatmap.heatmap_images`), raw attributions as float32 ``.npy``,
staged through :class:`hookscope.core.files.Staging`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.text import Text

from hookscope.core.files import Staging
from hookscope.render.camview import metric_columns, metrics_table, results_table
from hookscope.render.tables import fmt_float, header, num

if TYPE_CHECKING:  # views are imported before torch is: `hookscope report LOG` stays torch-free
    from hookscope.cam.attribution import AttrBatch, AttrOptions, AttrResult

#: The CSV columns (a contract).
ATTR_COLUMNS = ("input", "method", "target", "label", "score", "sum", "baseline_score",
                "completeness_gap", "overlay", "heatmap", "raw")
#: The document's ``options``, in this order.
OPTION_KEYS = ("steps", "baseline", "samples", "noise", "window", "stride", "value", "batch_cap",
               "seed")


class AttrWriter:
    """Sink for :class:`hookscope.cam.attribution.AttributionProbe`: stages each input's
    overlay, heatmap and (``save_raw``) raw attribution, and keeps the document's rows.
    ``plans`` are :func:`hookscope.render.heatmap.output_paths`'."""

    def __init__(self, staging: Staging, plans: Sequence[dict[str, dict[str, Path | None]]],
                 loaded: Any, *, save_raw: bool = False, cmap: str = "jet",
                 alpha: float = 0.5) -> None:
        self.staging, self.plans, self.loaded = staging, plans, loaded
        self.save_raw, self.cmap, self.alpha = save_raw, cmap, alpha
        self.rows: list[dict[str, Any]] = []

    def __call__(self, explained: AttrBatch) -> None:
        from hookscope.render.heatmap import denormalize

        batch = explained.batch
        assert batch is not None  # the probe's batches come from iter_batches
        for i, item in enumerate(batch.items):
            image = batch.images[i] or denormalize(batch.tensor[i], self.loaded.mean,
                                                   self.loaded.std)
            for name, res in explained.results.items():
                paths = self.plans[batch.start + i][name]
                self.rows.append(self._row(item.name, res, i, paths))
                self.staging.submit(self._write, res, i, image, explained.boxes[i], paths)

    def _row(self, input_name: str, res: AttrResult, i: int, paths: Mapping[str, Path | None]
             ) -> dict[str, Any]:
        target = res.targets[i] if res.targets[i] >= 0 else None
        return {"input": input_name, "method": res.method, "target": target,
                "label": self.loaded.label(target) if target is not None else None,
                "score": res.scores[i], "sum": res.sums[i],
                "baseline_score": res.baseline_scores[i], "completeness_gap": res.gaps[i],
                "overlay": str(paths["overlay"]), "heatmap": str(paths["heatmap"]),
                "raw": str(paths["raw"]) if paths["raw"] is not None else None} | (
                    {"metrics": {k: float(v[i]) for k, v in res.metrics.items()}}
                    if res.metrics else {}) | (
                    {"detections": [d | {"label_name": self.loaded.label(d["label"])}
                                    for d in res.detections[i]]}
                    if res.detections is not None else {})

    def _write(self, res: AttrResult, i: int, image: Any, box: Any,
               paths: Mapping[str, Any]) -> None:
        from hookscope.cam.attribution import overlay_map
        from hookscope.render.heatmap import draw_boxes, heatmap_images

        over, heat = heatmap_images(overlay_map(res.attributions[i]), image, box,
                                    cmap=self.cmap, alpha=self.alpha)
        if res.detections is not None and res.detections[i]:
            size = res.attributions.shape[-1], res.attributions.shape[-2]
            over = draw_boxes(over, res.detections[i], size, box, self.loaded.label)
        self.staging.save_png(over, paths["overlay"])
        self.staging.save_png(heat, paths["heatmap"])
        if self.save_raw:
            self.staging.save_npy(res.attributions[i], paths["raw"])

    def document(self, methods: Sequence[str], options: AttrOptions, out: Path
                 ) -> dict[str, Any]:
        """The ``attribute`` document after the envelope."""
        from hookscope.cam.result import metric_means

        shown = {k: getattr(options, k) for k in OPTION_KEYS}
        if not isinstance(options.baseline, str):
            shown["baseline"] = "tensor"
        return {"methods": list(methods), "out": str(out),
                "options": shown | {k: list(shown[k]) for k in ("window", "stride")},
                "results": self.rows, "metrics": metric_means(self.rows)}


def attr_view(doc: Mapping[str, Any]) -> RenderableType:
    """Header, the files written, one row per input and method."""
    results = doc.get("results", [])
    table = results_table(results, [num("score"), num("sum"), num("gap")], lambda row: [
        fmt_float(row.get("score")), fmt_float(row.get("sum")),
        fmt_float(row.get("completeness_gap"))])
    wrote = Text(f"wrote {len(results)} overlay(s) to {doc.get('out')}", style="green")
    means = [metrics_table(doc["metrics"])] if doc.get("metrics") else []
    return Group(header(doc), wrote, table, *means)


def attr_csv(doc: Mapping[str, Any]) -> tuple[list[dict[str, Any]], Sequence[str]]:
    """The contract's columns, then one per metric."""
    rows, present = metric_columns(doc["results"])
    return rows, (*ATTR_COLUMNS, *present)
