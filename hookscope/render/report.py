"""The HTML report: a :class:`hookscope.report.Report` turned into the plain values of
the template ``templates/report.html.j2`` (autoescaped, on :mod:`hookscope.render.html`'s
base template). Tables are plain HTML; the page's script only adds sorting and filtering.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hookscope.core.files import dumps_json, format_shape, format_shapes
from hookscope.render import html, plots
from hookscope.render.grads import objective_text
from hookscope.render.html import cell, fact, lead_cells, num, page_row, render, stats_cells
from hookscope.render.tables import ZERO_WARN, fmt_count, fmt_float, health, shape_text

if TYPE_CHECKING:
    from PIL import Image

    from hookscope.report import CamInput, Report

#: The long side of every image in the page, in pixels.
MAX_SIDE = 512
#: Findings of one kind listed before "and N more".
MAX_FINDINGS = 8


def _img(image: Image.Image, alt: str, **more: Any) -> dict[str, Any]:
    """A figure of the page: ``image`` as a JPEG ``data:`` URI, at most :data:`MAX_SIDE`
    pixels a side."""
    from PIL import Image as PILImage

    small = image.convert("RGB")
    small.thumbnail((MAX_SIDE, MAX_SIDE), PILImage.Resampling.LANCZOS)  # never enlarges
    buf = io.BytesIO()
    small.save(buf, format="JPEG", quality=85, optimize=True)
    return {"src": "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"),
            "alt": alt, "width": small.width, "height": small.height} | more


#: Envelope keys shown first, in this order; the rest follow; these last, full width.
_FIRST = ("weights", "source", "device", "precision", "labels")
_WIDE = ("preprocessing", "inputs")


def _envelope(report: Report) -> list[tuple[str, dict[str, Any], bool]]:
    """The header's facts: (name, value, full width)."""
    env = report.envelope
    keys = [k for k in env if k not in ("hookscope", "command", "model")]
    ordered = [k for k in _FIRST if k in keys] + [
        k for k in keys if k not in _FIRST and k not in _WIDE]
    rows = [(k, fact(k, env[k])) for k in ordered]
    shape = report.flops_shape
    flops = {"text": fmt_count(report.flops, "FLOPs")}
    if report.flops is not None and shape:
        flops["dim"] = (f"per input ({format_shape(shape)}; {fmt_count(report.flops // 2)} "
                        "MACs)")
    rows += [("input shape", {"text": format_shape(report.stats.input_shape)}),
             ("parameters", {"text": "uninitialised"} if report.params is None else
              {"text": f"{report.params:,}", "dim": f"({fmt_count(report.params)})"}),
             ("FLOPs", flops), ("created", {"time": report.created})]
    rows += [(k, fact(k, env[k])) for k in _WIDE if k in keys]
    return [(k.replace("_", " "), v, k in _WIDE) for k, v in rows]


def _summary(report: Report) -> list[dict[str, str]]:
    """Chips: calls, non-finite and dead calls, flagged gradients."""
    layers = report.stats.layers
    bad = sum(1 for r in layers if r.nonfinite)
    dead = sum(1 for r in layers if math.isfinite(r.zero_fraction) and r.zero_fraction >= ZERO_WARN)
    chips = [("", f"{len(layers)} module calls"), ("error" if bad else "ok", f"{bad} non-finite"),
             ("warning" if dead else "ok", f"{dead} dead")]
    if report.grads is not None:  # a segmentation model's or detector's page has none
        flags = [r.flag for r in report.grads.layers if r.flag]
        red = set(flags) - {"vanish"}
        chips.append(("error" if red else "warning" if flags else "ok",
                      f"{len(flags)} flagged gradients"))
    chips.append(("", f"{len(report.inputs)} inputs"))
    return [{"cls": cls, "text": text} for cls, text in chips]


def _findings(report: Report) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for kind in ("nonfinite", "grad_nonfinite", "explode", "dead", "vanish"):
        found = [f for f in report.findings if f.kind == kind]
        items += [{"severity": f.severity, "table": f.table, "row": f.row,
                   "where": f.name if f.call == 0 else f"{f.name} (call {f.call})",
                   "table_name": "activation table" if f.table == "stats" else "gradient table",
                   "detail": f.detail} for f in found[:MAX_FINDINGS]]
        if len(found) > MAX_FINDINGS:
            items.append({"more": len(found) - MAX_FINDINGS, "kind": kind.replace("_", " ")})
    return items


STATS_COLUMNS = (*html.LEAD_COLUMNS, ("input", "text"), ("output", "text"), *html.STATS_COLUMNS)
GRAD_COLUMNS = (*html.LEAD_COLUMNS, ("shape", "text"), ("norm", "num"), ("log10 norm", "num"),
                ("mean", "num"), ("std", "num"), ("max |g|", "num"), ("non-finite", "num"),
                ("flag", "text"))


def _stats_row(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    """A row in the terminal table's colours: red for non-finite values, yellow for dead."""
    return page_row(row, [*lead_cells(i, row), cell(format_shapes(row.get("input_shapes") or [])),
                          cell(shape_text(row)), *stats_cells(row)], health(row))


def _grad_row(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    norm, flag = row.get("norm"), row.get("flag") or ""
    log = math.log10(norm) if isinstance(norm, float) and math.isfinite(norm) and norm > 0 \
        else None
    bad = row.get("nonfinite") or 0
    cells = [*lead_cells(i, row), cell(format_shape(row.get("shape"))), num(norm),
             cell("-" if log is None else f"{log:.2f}", log, "n"),
             *(num(row.get(k)) for k in ("mean", "std", "max_abs")), cell(bad, bad, "n"),
             cell(flag, flag)]
    return page_row(row, cells, {"nonfinite": "bad", "explode": "bad", "vanish": "dead"}.get(flag, ""))


def _cam_input(item: CamInput, report: Report, cmap: str, alpha: float, index: int
               ) -> dict[str, Any]:
    """The input's picture, per method its overlay (a signal's curve, a volume's contact
    sheet: the map drawn over the input, so no picture of the input alone), and its
    attribution's (an image's)."""
    from hookscope.render.heatmap import denormalize, overlay_images

    pre = report.envelope.get("preprocessing") or {}
    mean, std = pre.get("mean"), pre.get("std")
    shown = item.tensor  # None for an image file
    base = item.image if shown is None or shown.dim() != 3 else denormalize(shown, mean, std)
    figures = [] if base is None else [_img(base, f"input {item.name}", method=None)]
    overlays = []  # (method, map, label, detail)
    for method, values in item.maps.items():
        t = item.targets[method]
        overlays.append((method, values, t.label if t.label is not None else f"class {t.index}",
                         f"{t.index}" + ("" if t.prob is None else f", {t.prob:.1%}")))
    attr = report.attribution
    if attr is not None and not item.skipped and base is not None:  # an image's
        t = attr.targets[index]
        label = t.label if t.label is not None else "its boxes" if t.index < 0 else f"class {t.index}"
        overlays.append((attr.method, attr.maps[index], label, f"sum {fmt_float(attr.sums[index])}"))
    for method, values, label, detail in overlays:
        image = overlay_images(values, shown, base, item.box, mean, std, cmap=cmap, alpha=alpha)[0]
        figures.append(_img(image, f"{method} for {label} on {item.name}", method=method,
                            label=label, detail=detail))
    predictions = None if item.predictions is None else [  # None: non-finite logits
        {"label": p.label if p.label is not None else p.index, "prob": f"{p.prob:.1%}"}
        for p in item.predictions]
    return {"name": item.name, "figures": figures, "skipped": item.skipped,
            "predictions": predictions}


def report_html(report: Report, *, cmap: str = "jet", alpha: float = 0.5) -> str:
    """The whole page of :func:`hookscope.report.build_report`'s report as text;
    ``cmap`` and ``alpha`` draw the Grad-CAM overlays."""
    from markupsafe import Markup

    doc, opts = report.to_dict(), report.options
    profile = Markup(plots.inline_svg(plots.profile_figure(doc["stats"]["layers"]),
                                      "Activation profile"))
    grads = report.grads
    flow = None if grads is None else Markup(plots.inline_svg(plots.gradient_figure(
        doc["grads"]["layers"], median=grads.median_norm, vanish=opts.vanish,
        explode=opts.explode), "Gradient flow"))
    env = report.envelope
    return render(
        "report.html.j2", model=env.get("model"), version=env.get("hookscope"),
        created=report.created, summary=_summary(report), envelope=_envelope(report),
        envelope_json=dumps_json(env), findings=_findings(report), notes=report.notes,
        left_out=list(report.left_out.items()),
        profile=profile, flow=flow,
        objective=None if grads is None else
        f"{objective_text(grads.loss, grads.targets)} summed over the inputs",
        vanish=f"{opts.vanish:g}", explode=f"{opts.explode:g}",
        stats_columns=STATS_COLUMNS, grad_columns=GRAD_COLUMNS,
        stats_rows=[_stats_row(i, r) for i, r in enumerate(doc["stats"]["layers"])],
        grad_rows=None if grads is None else [_grad_row(i, r) for i, r in
                                              enumerate(doc["grads"]["layers"])],
        median=None if grads is None else fmt_float(grads.median_norm),
        cam=None if "gradcam" in report.left_out else {
             "layer": report.cam_layer, "methods": ", ".join(report.methods),
             "attribution": report.attribution.method if report.attribution else None,
             "how": "chosen automatically (the last image-grid output)"
             if report.cam_layer_default else "as asked",
             "inputs": [_cam_input(item, report, cmap, alpha, i)
                        for i, item in enumerate(report.inputs)]})
