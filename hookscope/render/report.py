"""The HTML report: one self-contained page drawn from a :class:`hookscope.probes.report.Report`.

The page is the Jinja2 template ``templates/report.html.j2`` on the pages' base template
(:mod:`hookscope.render.html`): autoescape escapes every string that comes from the model,
the labels or the file names, and the base template brings the style, the script and the
Content-Security-Policy (no request can leave the page; only its own script runs). Tables
are plain HTML, so the page reads the same with JavaScript off; the script only adds sorting
and filtering. This module turns the report into the template's plain values.
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hookscope.core.output import dumps_json, format_shape, format_shapes
from hookscope.render import plots
from hookscope.render.html import cell, count, num, render
from hookscope.render.tables import ZERO_WARN, fmt_float

if TYPE_CHECKING:
    from PIL import Image

    from hookscope.probes.report import CamInput, Report

#: The long side of every image in the page, in pixels.
MAX_SIDE = 512
#: Findings of one kind listed before "and N more".
MAX_FINDINGS = 8


def image_uri(image: Image.Image, *, quality: int = 85) -> str:
    """A JPEG ``data:`` URI of ``image``, scaled down to :data:`MAX_SIDE` pixels at most."""
    from PIL import Image as PILImage

    small = image.convert("RGB")
    if max(small.size) > MAX_SIDE:
        small.thumbnail((MAX_SIDE, MAX_SIDE), PILImage.Resampling.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, format="JPEG", quality=quality, optimize=True)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(image: Image.Image, alt: str, **more: Any) -> dict[str, Any]:
    width, height = image.size
    scale = min(1.0, MAX_SIDE / max(width, height))
    return {"src": image_uri(image), "alt": alt, "width": round(width * scale),
            "height": round(height * scale)} | more


# ----------------------------------------------------------------------------- header


def _envelope_value(key: str, value: Any) -> dict[str, Any]:
    """One envelope entry as the template's ``fact`` draws it (unknown keys as JSON)."""
    if key == "weights" and isinstance(value, Mapping):
        classes = value.get("num_classes")
        return {"text": value.get("loaded"), "dim": f"(requested {value.get('requested')}"
                f"{f', {classes} classes' if classes else ''})"}
    if key == "preprocessing" and isinstance(value, Mapping):
        return _preprocessing(value)
    if key == "precision" and isinstance(value, Mapping):
        auto = value.get("autocast")
        return {"text": f"{value.get('dtype')}" + (f" (autocast {auto})" if auto else "")}
    if key == "inputs" and isinstance(value, list):
        return {"codes": [str(v) for v in value]}
    if isinstance(value, (Mapping, list)):
        return {"json": json.dumps(value, default=str)}
    return {"text": "" if value is None else str(value)}


def _preprocessing(pre: Mapping[str, Any]) -> dict[str, Any]:
    """``resize 256 → crop 224 (bilinear); mean ...; std ...; 3 channels``, then the rest."""
    size = " → ".join(f"{k} {pre[k]}" for k in ("resize", "crop") if pre.get(k) is not None)
    if pre.get("interpolation"):
        size += f" ({pre['interpolation']})"
    parts = [size.strip()] + [f"{k} {_short(pre[k])}" for k in ("mean", "std")
                              if pre.get(k) is not None]
    if pre.get("channels") is not None:
        parts.append(f"{pre['channels']} channels")
    known = {"resize", "crop", "interpolation", "mean", "std", "channels", "origin"}
    parts += [f"{k} {_short(v)}" for k, v in pre.items() if k not in known and v is not None]
    return {"text": "; ".join(p for p in parts if p),
            "dim": f"(from {pre['origin']})" if pre.get("origin") else None}


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


#: Envelope keys shown first, in this order; the rest follow; these last, full width.
_FIRST = ("weights", "source", "device", "precision", "labels")
_WIDE = ("preprocessing", "inputs")


def _envelope(report: Report) -> list[tuple[str, dict[str, Any], bool]]:
    """The header's facts: (name, value, full width)."""
    env = report.envelope
    keys = [k for k in env if k not in ("hookscope", "command", "model")]
    ordered = [k for k in _FIRST if k in keys] + [
        k for k in keys if k not in _FIRST and k not in _WIDE]
    rows = [(k, _envelope_value(k, env[k])) for k in ordered]
    shape = report.flops_shape
    flops = {"text": count(report.flops, "FLOPs")}
    if report.flops is not None and shape:
        flops["dim"] = (f"per input ({format_shape(shape)}; {count(report.flops // 2)} "
                        "MACs)")
    rows += [("input shape", {"text": format_shape(report.stats.input_shape)}),
             ("parameters", {"text": f"{report.params:,}", "dim": f"({count(report.params)})"}),
             ("FLOPs", flops), ("created", {"time": report.created})]
    rows += [(k, _envelope_value(k, env[k])) for k in _WIDE if k in keys]
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


# ----------------------------------------------------------------------------- findings


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


def _objective(report: Report) -> str:
    assert report.grads is not None
    classes = sorted(set(report.grads.targets))
    shown = ", ".join(str(c) for c in classes[:5]) + (", ..." if len(classes) > 5 else "")
    what = "cross-entropy" if report.grads.loss == "ce" else "target logit"
    return f"{what} (class {shown}) summed over the inputs"


# ----------------------------------------------------------------------------- tables

STATS_COLUMNS = (("#", "num"), ("layer", "text"), ("type", "text"), ("call", "num"),
                 ("input", "text"), ("output", "text"), ("mean", "num"), ("std", "num"),
                 ("min", "num"), ("max", "num"), ("zeros", "num"), ("non-finite", "num"))
GRAD_COLUMNS = (("#", "num"), ("layer", "text"), ("type", "text"), ("call", "num"),
                ("shape", "text"), ("norm", "num"), ("log10 norm", "num"), ("mean", "num"),
                ("std", "num"), ("max |g|", "num"), ("non-finite", "num"), ("flag", "text"))


def _row_class(nonfinite: int, zero: float | None) -> str:
    """The terminal table's colours: red for non-finite values, yellow for dead calls."""
    if nonfinite:
        return "bad"
    return "dead" if zero is not None and math.isfinite(zero) and zero >= ZERO_WARN else ""


def _stats_row(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    zero, bad = row.get("zero_fraction"), int(row.get("nonfinite") or 0)
    shapes = row.get("output_shapes") or []
    output = format_shapes(shapes) if len(shapes) > 1 else format_shape(row.get("output_shape"))
    cells = [
        cell(i, i, "n dim"), cell(row["name"], row["name"], code=True),
        cell(row["type"], row["type"], "dim"), cell(row["call"], row["call"], "n"),
        cell(format_shapes(row.get("input_shapes") or []), None), cell(output, None),
        *(num(row.get(k)) for k in ("mean", "std", "min", "max")),
        cell("-" if zero is None or not math.isfinite(zero) else f"{zero:.1%}", zero, "n"),
        cell(bad, bad, "n strong" if bad else "n"),
    ]
    return {"name": row["name"], "cls": _row_class(bad, zero), "cells": cells}


def _grad_row(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    norm, flag = row.get("norm"), row.get("flag") or ""
    log = math.log10(norm) if isinstance(norm, float) and math.isfinite(norm) and norm > 0 \
        else None
    cells = [
        cell(i, i, "n dim"), cell(row["name"], row["name"], code=True),
        cell(row["type"], row["type"], "dim"), cell(row["call"], row["call"], "n"),
        cell(format_shape(row.get("shape")), None), num(norm),
        cell("-" if log is None else f"{log:.2f}", log, "n"),
        *(num(row.get(k)) for k in ("mean", "std", "max_abs")),
        cell(row.get("nonfinite") or 0, row.get("nonfinite") or 0, "n"), cell(flag, flag),
    ]
    cls = {"nonfinite": "bad", "explode": "bad", "vanish": "dead"}.get(flag, "")
    return {"name": row["name"], "cls": cls, "cells": cells}


# ----------------------------------------------------------------------------- Grad-CAM


def _overlays(item: CamInput, loaded_mean: Sequence[float] | None,
              loaded_std: Sequence[float] | None, cmap: str, alpha: float
              ) -> tuple[Image.Image, dict[str, Image.Image]]:
    """The input's picture and, per method, its overlay."""
    from hookscope.render.heatmap import denormalize, heatmap_images

    base = item.image if item.image is not None else denormalize(item.tensor, loaded_mean,
                                                                 loaded_std)
    return base, {m: heatmap_images(values, base, item.box, cmap=cmap, alpha=alpha)[0]
                  for m, values in item.maps.items()}


def _cam_input(item: CamInput, report: Report, cmap: str, alpha: float) -> dict[str, Any]:
    pre = report.envelope.get("preprocessing") or {}
    base, overlays = _overlays(item, pre.get("mean"), pre.get("std"), cmap, alpha)
    figures = [_img(base, f"input {item.name}", method=None)]
    for method, image in overlays.items():
        t = item.targets[method]
        label = t.label if t.label is not None else f"class {t.index}"
        detail = f"{t.index}" + ("" if t.prob is None else f", {t.prob:.1%}")
        figures.append(_img(image, f"{method} for {label} on {item.name}", method=method,
                            label=label, detail=detail))
    predictions = None if item.predictions is None else [  # None: non-finite logits
        {"label": p.label if p.label is not None else p.index, "prob": f"{p.prob:.1%}"}
        for p in item.predictions]
    return {"name": item.name, "figures": figures, "skipped": item.skipped,
            "predictions": predictions}


def _cam(report: Report, cmap: str, alpha: float) -> dict[str, Any]:
    how = "chosen automatically (the last image-grid output)" if report.cam_layer_default else \
        "as asked"
    return {"layer": report.cam_layer, "how": how, "methods": ", ".join(report.methods),
            "inputs": [_cam_input(item, report, cmap, alpha) for item in report.inputs]}


# ----------------------------------------------------------------------------- the page


def report_html(report: Report, *, cmap: str = "jet", alpha: float = 0.5) -> str:
    """The whole page as text.

    Args:
        report: what :func:`hookscope.probes.report.build_report` returned.
        cmap: the matplotlib colormap of the Grad-CAM overlays.
        alpha: the heatmap's weight in the overlays.
    """
    from markupsafe import Markup

    doc, opts = report.to_dict(), report.options
    profile = plots.inline_svg(plots.profile_figure(doc["stats"]["layers"]),
                               "Activation profile")
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
        profile=Markup(profile), flow=flow, objective=None if grads is None else _objective(report),
        vanish=f"{opts.vanish:g}", explode=f"{opts.explode:g}",
        stats_columns=STATS_COLUMNS, grad_columns=GRAD_COLUMNS,
        stats_rows=[_stats_row(i, r) for i, r in enumerate(doc["stats"]["layers"])],
        grad_rows=None if grads is None else [_grad_row(i, r) for i, r in
                                              enumerate(doc["grads"]["layers"])],
        median=None if grads is None else fmt_float(grads.median_norm),
        cam=_cam(report, cmap, alpha))
