"""The HTML report: one self-contained page drawn from a :class:`hookscope.report.Report`.

Everything the page needs is inside it: CSS and a small script inline, images as ``data:``
URIs, plots as inline SVG. A Content-Security-Policy allows nothing else (no request can
leave the page) and only the page's own script, by its hash. Every string that comes from
the model, the labels or the file names is HTML-escaped. Tables are plain HTML, so the
page reads the same with JavaScript off; the script only adds sorting and filtering.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from hookscope.render import plots
from hookscope.render.output import Output, dumps_json, format_shape, format_shapes, write
from hookscope.render.tables import ZERO_WARN, fmt_float

if TYPE_CHECKING:
    from PIL import Image

    from hookscope.report import CamInput, Finding, Report

#: The long side of every image in the page, in pixels.
MAX_SIDE = 512
#: Findings of one kind listed before "and N more".
MAX_FINDINGS = 8


def e(value: Any) -> str:
    """HTML-escaped text (quotes too, so it is safe in attributes)."""
    return escape("" if value is None else str(value), quote=True)


def _raw(value: Any) -> str:
    """A cell's sort key for ``data-v``: numbers as ``repr``, non-finite and None empty."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return e(repr(float(value)) if isinstance(value, float) else value)


def _count(n: float | None, unit: str = "") -> str:
    if n is None:
        return "n/a"
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.2f} {suffix}{unit}"
    return f"{n:g} {unit}".strip()


def image_uri(image: Image.Image, *, quality: int = 85) -> str:
    """A JPEG ``data:`` URI of ``image``, scaled down to :data:`MAX_SIDE` pixels at most."""
    from PIL import Image as PILImage

    small = image.convert("RGB")
    if max(small.size) > MAX_SIDE:
        small.thumbnail((MAX_SIDE, MAX_SIDE), PILImage.Resampling.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, format="JPEG", quality=quality, optimize=True)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(image: Image.Image, alt: str) -> str:
    width, height = image.size
    scale = min(1.0, MAX_SIDE / max(width, height))
    return (f'<img src="{image_uri(image)}" alt="{e(alt)}" width="{round(width * scale)}" '
            f'height="{round(height * scale)}">')


def _table(table_id: str, columns: Sequence[tuple[str, str]], rows: Iterable[str],
           caption: str) -> str:
    """A sortable table: ``columns`` are (header, ``num`` or ``text``)."""
    head = "".join(f'<th scope="col" data-type="{kind}">{e(title)}</th>'
                   for title, kind in columns)
    return (f'<div class="table-wrap"><table id="{table_id}" class="data sortable">'
            f'<caption>{e(caption)}</caption><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _td(text: str, raw: Any = None, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f'<td data-v="{_raw(raw)}"{attr}>{text}</td>'


def _num(value: Any) -> str:
    return _td(e(fmt_float(value)), value, "n")


# ----------------------------------------------------------------------------- header


def _envelope_value(key: str, value: Any) -> str:
    """One envelope entry in words (unknown keys as compact JSON)."""
    if key == "weights" and isinstance(value, Mapping):
        classes = value.get("num_classes")
        return (f"{e(value.get('loaded'))} <span class=dim>(requested "
                f"{e(value.get('requested'))}{f', {e(classes)} classes' if classes else ''})"
                "</span>")
    if key == "preprocessing" and isinstance(value, Mapping):
        return _preprocessing(value)
    if key == "precision" and isinstance(value, Mapping):
        auto = value.get("autocast")
        return e(value.get("dtype")) + (f" (autocast {e(auto)})" if auto else "")
    if key == "inputs" and isinstance(value, list):
        names = [f"<code>{e(v)}</code>" for v in value]
        if len(names) <= 8:
            return f"{len(names)}: " + ", ".join(names)
        every = "".join(f"<li>{n}</li>" for n in names)
        return (f"{len(names)}: {', '.join(names[:8])} <details><summary>and "
                f"{len(names) - 8} more</summary><ul>{every}</ul></details>")
    if isinstance(value, (Mapping, list)):
        return f"<code>{e(json.dumps(value, default=str))}</code>"
    return e(value)


def _preprocessing(pre: Mapping[str, Any]) -> str:
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
    origin = f' <span class="dim">(from {e(pre["origin"])})</span>' if pre.get("origin") else ""
    return e("; ".join(p for p in parts if p)) + origin


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


#: Envelope keys shown first, in this order; the rest follow; these last, full width.
_FIRST = ("weights", "source", "device", "precision", "labels")
_WIDE = ("preprocessing", "inputs")


def _header(report: Report) -> str:
    env = report.envelope
    keys = [k for k in env if k not in ("hookscope", "command", "model")]
    ordered = [k for k in _FIRST if k in keys] + [
        k for k in keys if k not in _FIRST and k not in _WIDE]
    rows = [(k, _envelope_value(k, env[k])) for k in ordered]
    shape = report.flops_shape
    rows += [
        ("input shape", e(format_shape(report.stats.input_shape))),
        ("parameters", e(f"{report.params:,}") + f" <span class=dim>({_count(report.params)})"
                                                  "</span>"),
        ("FLOPs", e(_count(report.flops, "FLOPs")) + (
            f" <span class=dim>per input ({e(format_shape(shape))}; {_count(report.flops // 2)}"
            " MACs)</span>" if report.flops is not None and shape else "")),
        ("created", f'<time datetime="{e(report.created)}">{e(report.created)}</time>'),
    ]
    rows += [(k, _envelope_value(k, env[k])) for k in _WIDE if k in keys]
    items = "".join(f'<div{" class=wide" if k in _WIDE else ""}><dt>{e(k.replace("_", " "))}'
                    f"</dt><dd>{v}</dd></div>" for k, v in rows)
    return (f'<header><p class="kicker">hookscope {e(env.get("hookscope"))} report</p>'
            f'<h1>{e(env.get("model"))}</h1>{_summary(report)}<dl class="envelope">{items}</dl>'
            f'<details class="json"><summary>JSON envelope</summary><pre>{e(dumps_json(env))}'
            "</pre></details></header>")


def _summary(report: Report) -> str:
    """Chips: calls, non-finite and dead calls, flagged gradients."""
    layers = report.stats.layers
    bad = sum(1 for r in layers if r.nonfinite)
    dead = sum(1 for r in layers if math.isfinite(r.zero_fraction) and r.zero_fraction >= ZERO_WARN)
    flagged = sum(1 for r in report.grads.layers if r.flag)
    chips = [("", f"{len(layers)} module calls"),
             ("error" if bad else "ok", f"{bad} non-finite"),
             ("warning" if dead else "ok", f"{dead} dead"),
             (_flag_class(report), f"{flagged} flagged gradients"),
             ("", f"{len(report.inputs)} inputs")]
    return '<p class="chips">' + "".join(
        f'<span class="chip {cls}">{e(text)}</span>' for cls, text in chips) + "</p>"


def _flag_class(report: Report) -> str:
    """Red for exploding or non-finite gradients, yellow for vanishing ones only."""
    flags = {r.flag for r in report.grads.layers if r.flag}
    return "error" if flags - {"vanish"} else "warning" if flags else "ok"


# ----------------------------------------------------------------------------- findings


def _finding(f: Finding) -> str:
    where = f.name if f.call == 0 else f"{f.name} (call {f.call})"
    table = "activation table" if f.table == "stats" else "gradient table"
    return (f'<li class="{e(f.severity)}"><a href="#{e(f.table)}-{f.row}">{e(where)}</a> '
            f'<span class="dim">({e(table)}, row {f.row})</span>: {e(f.detail)}</li>')


def _findings(report: Report) -> str:
    items: list[str] = []
    for kind in ("nonfinite", "grad_nonfinite", "explode", "dead", "vanish"):
        found = [f for f in report.findings if f.kind == kind]
        items += [_finding(f) for f in found[:MAX_FINDINGS]]
        if len(found) > MAX_FINDINGS:
            items.append(f'<li class="more">and {len(found) - MAX_FINDINGS} more '
                         f"{e(kind.replace('_', ' '))} calls (see the table)</li>")
    items += [f'<li class="note">{e(note)}</li>' for note in report.notes]
    body = f'<ul class="findings">{"".join(items)}</ul>' if items else (
        '<p class="ok-line">Nothing flagged: every output is finite, no call is dead, and no '
        "gradient vanishes or explodes.</p>")
    return f'<section id="findings"><h2>Findings</h2>{body}</section>'


# ----------------------------------------------------------------------------- plots


def _plots(report: Report) -> str:
    doc = report.to_dict()
    opts = report.options
    profile = plots.inline_svg(plots.profile_figure(doc["stats"]["layers"]),
                               "Activation profile")
    flow = plots.inline_svg(plots.gradient_figure(
        doc["grads"]["layers"], median=report.grads.median_norm, vanish=opts.vanish,
        explode=opts.explode), "Gradient flow")
    return (
        '<section id="plots" class="plots">'
        f'<figure id="profile"><h2>Activation profile</h2>{profile}<figcaption>Each module '
        "call's output in execution order: mean ± std (band), min/max (light band), zero "
        "fraction (dashed, right axis). Red: non-finite values; yellow: dead (≥99% zeros)."
        "</figcaption></figure>"
        f'<figure id="gradient-flow"><h2>Gradient flow</h2>{flow}<figcaption>log10 of the '
        f"gradient norm at each call's output, backward order, for the "
        f"{e(_objective(report))}. Dashed: vanish ({opts.vanish:g}×) and explode "
        f"({opts.explode:g}×) thresholds around the median.</figcaption></figure></section>")


def _objective(report: Report) -> str:
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


def _stats_row(i: int, row: Mapping[str, Any]) -> str:
    zero, bad = row.get("zero_fraction"), int(row.get("nonfinite") or 0)
    shapes = row.get("output_shapes") or []
    output = format_shapes(shapes) if len(shapes) > 1 else format_shape(row.get("output_shape"))
    cells = [
        _td(str(i), i, "n dim"), _td(f"<code>{e(row['name'])}</code>", row["name"]),
        _td(e(row["type"]), row["type"], "dim"), _td(str(row["call"]), row["call"], "n"),
        _td(e(format_shapes(row.get("input_shapes") or [])), None),
        _td(e(output), None),
        *(_num(row.get(k)) for k in ("mean", "std", "min", "max")),
        _td("-" if zero is None or not math.isfinite(zero) else f"{zero:.1%}", zero, "n"),
        _td(str(bad), bad, "n strong" if bad else "n"),
    ]
    cls = _row_class(bad, zero)
    return (f'<tr id="stats-{i}" data-name="{e(row["name"])}"'
            f'{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>{"".join(cells)}</tr>')


def _grad_row(i: int, row: Mapping[str, Any]) -> str:
    norm, flag = row.get("norm"), row.get("flag") or ""
    log = math.log10(norm) if isinstance(norm, float) and math.isfinite(norm) and norm > 0 \
        else None
    cells = [
        _td(str(i), i, "n dim"), _td(f"<code>{e(row['name'])}</code>", row["name"]),
        _td(e(row["type"]), row["type"], "dim"), _td(str(row["call"]), row["call"], "n"),
        _td(e(format_shape(row.get("shape"))), None), _num(norm),
        _td("-" if log is None else f"{log:.2f}", log, "n"),
        *(_num(row.get(k)) for k in ("mean", "std", "max_abs")),
        _td(str(row.get("nonfinite") or 0), row.get("nonfinite") or 0, "n"),
        _td(e(flag), flag),
    ]
    cls = {"nonfinite": "bad", "explode": "bad", "vanish": "dead"}.get(flag, "")
    return (f'<tr id="grads-{i}" data-name="{e(row["name"])}"'
            f'{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>{"".join(cells)}</tr>')


def _filter(table_id: str, total: int) -> str:
    """The name filter: hidden until the script runs (it does nothing without it)."""
    return (f'<p class="filter" hidden><label>Filter by name <input type="search" '
            f'data-filter="{table_id}" placeholder="e.g. layer3 or relu" autocomplete="off">'
            f'</label> <output data-count="{table_id}">{total} of {total}</output></p>')


def _tables(report: Report) -> str:
    doc = report.to_dict()
    stats_rows, grad_rows = doc["stats"]["layers"], doc["grads"]["layers"]
    stats = _table("stats", STATS_COLUMNS, (_stats_row(i, r) for i, r in enumerate(stats_rows)),
                   "Output statistics per module call, execution order")
    grads = _table("grads", GRAD_COLUMNS, (_grad_row(i, r) for i, r in enumerate(grad_rows)),
                   "Gradient at each module call's output, backward order")
    return (f'<section id="activations"><h2>Activation statistics</h2>{_filter("stats", len(stats_rows))}'
            f"{stats}</section>"
            f'<section id="gradients"><details id="grads-details"><summary><h2>Gradients'
            f'</h2> <span class="dim">{len(grad_rows)} calls, median norm '
            f"{e(fmt_float(report.grads.median_norm))}</span></summary>"
            f'{_filter("grads", len(grad_rows))}{grads}</details></section>')


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


def _predictions(item: CamInput) -> str:
    if item.predictions is None:
        return '<p class="chip error">non-finite logits (NaN or Inf): no prediction</p>'
    if not item.predictions:
        return ""
    rows = "".join(
        f'<tr><td class="n dim">{k}</td><td>{e(p.label if p.label is not None else p.index)}'
        f'</td><td class="n">{p.prob:.1%}</td></tr>'
        for k, p in enumerate(item.predictions, 1))
    return (f'<table class="preds"><caption>top-{len(item.predictions)} predictions</caption>'
            f"<thead><tr><th>#</th><th>class</th><th>prob</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _cam_input(item: CamInput, report: Report, cmap: str, alpha: float) -> str:
    pre = report.envelope.get("preprocessing") or {}
    base, overlays = _overlays(item, pre.get("mean"), pre.get("std"), cmap, alpha)
    figures = [f'<figure>{_img(base, f"input {item.name}")}<figcaption>input</figcaption>'
               "</figure>"]
    for method, image in overlays.items():
        t = item.targets[method]
        label = t.label if t.label is not None else f"class {t.index}"
        figures.append(
            f'<figure>{_img(image, f"{method} for {label} on {item.name}")}<figcaption>'
            f"<b>{e(method)}</b> · {e(label)} <span class=dim>({t.index}"
            f"{'' if t.prob is None else f', {t.prob:.1%}'})</span></figcaption></figure>")
    if item.skipped:
        figures.append(f'<p class="dim">not explained: {e(item.skipped)}</p>')
    return (f'<article class="cam-input"><h3><code>{e(item.name)}</code></h3>'
            f'<div class="cam-row" style="--n:{len(figures)}">{"".join(figures)}'
            f"{_predictions(item)}</div></article>")


def _cam(report: Report, cmap: str, alpha: float) -> str:
    how = "chosen automatically (the last spatial output)" if report.cam_layer_default else \
        "as asked"
    return (f'<section id="gradcam"><h2>Grad-CAM</h2><p class="dim">layer '
            f"<code>{e(report.cam_layer)}</code> ({e(how)}); methods "
            f'{e(", ".join(report.methods))}; each map is drawn over the part of the image '
            "the model saw.</p>"
            + "".join(_cam_input(item, report, cmap, alpha) for item in report.inputs)
            + "</section>")


# ----------------------------------------------------------------------------- the page

CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d0d7de;--soft:#f6f8fa;--red:#d1242f;
--red-bg:#ffebe9;--yellow:#7d4e00;--yellow-bg:#fff8c5;--blue:#2f6db5;--green:#1a7f37}
*{box-sizing:border-box}
body{margin:0;color:var(--fg);background:#fff;font:14px/1.45 system-ui,-apple-system,
"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1240px;margin:0 auto;padding:20px 24px 48px}
h1{font-size:26px;margin:0 0 6px}h2{font-size:17px;margin:0 0 8px}
h3{font-size:14px;margin:0 0 6px;font-weight:600}
section{margin-top:26px}code{font:12.5px/1.3 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.dim{color:var(--muted)}.kicker{margin:0;color:var(--muted);text-transform:uppercase;
letter-spacing:.06em;font-size:11.5px}
header{border-bottom:1px solid var(--line);padding-bottom:14px}
.chips{margin:4px 0 12px;display:flex;flex-wrap:wrap;gap:6px}
.chip{border:1px solid var(--line);border-radius:12px;padding:1px 10px;font-size:12.5px;
background:var(--soft)}
.chip.ok{color:var(--green)}.chip.error{color:var(--red);background:var(--red-bg);
border-color:#ffcecb}.chip.warning{color:var(--yellow);background:var(--yellow-bg);
border-color:#eed888}
dl.envelope{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));
gap:6px 22px;margin:0}
dl.envelope div{display:flex;gap:10px;min-width:0;border-bottom:1px dotted #e4e8ec;
padding:2px 0}dl.envelope div.wide{grid-column:1/-1}
dt{flex:0 0 92px;color:var(--muted)}dd{margin:0;min-width:0;overflow-wrap:anywhere}
dd details{display:inline}dd ul{margin:4px 0;padding-left:18px}
details.json{margin-top:10px}details.json pre{background:var(--soft);padding:10px;
border-radius:6px;overflow:auto;max-height:300px;font-size:12px}
summary{cursor:pointer}summary h2{display:inline}
ul.findings{margin:0;padding:0;list-style:none}
ul.findings li{padding:4px 10px;border-left:3px solid var(--line);margin:3px 0;
background:var(--soft)}
ul.findings li.error{border-color:var(--red);background:var(--red-bg)}
ul.findings li.warning{border-color:#d4a72c;background:var(--yellow-bg)}
ul.findings a{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
font-size:12.5px;color:inherit;font-weight:600}
.ok-line{color:var(--green);margin:0}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:20px}
.plots figure{margin:0;min-width:0}.plots svg{display:block;width:100%;height:auto}
figcaption{color:var(--muted);font-size:12.5px;margin-top:4px}
.table-wrap{max-height:28rem;overflow:auto;border:1px solid var(--line);border-radius:6px}
table.data{border-collapse:collapse;width:100%;font-size:12.5px}
table.data caption{text-align:left;padding:6px 10px;color:var(--muted);caption-side:top}
table.data th{position:sticky;top:0;background:var(--soft);text-align:left;font-weight:600;
border-bottom:1px solid var(--line);padding:0;white-space:nowrap;z-index:1}
table.data th button,table.data th span.h{all:unset;display:block;padding:5px 8px;
cursor:pointer}
table.data th[data-type=num] button{text-align:right}
table.data th[aria-sort=ascending] button::after{content:" \\25B2";font-size:9px}
table.data th[aria-sort=descending] button::after{content:" \\25BC";font-size:9px}
table.data td{padding:3px 8px;border-bottom:1px solid #eef1f4;white-space:nowrap}
table.data td.n{text-align:right;font-variant-numeric:tabular-nums}
table.data tr:hover td{background:#f3f6f9}
tr.bad td{color:var(--red);background:var(--red-bg)}tr.bad td.strong{font-weight:700}
tr.dead td{color:var(--yellow);background:var(--yellow-bg)}
tr:target td{outline:2px solid var(--blue);outline-offset:-2px}
.filter{margin:0 0 8px}.filter input{font:inherit;padding:3px 8px;border:1px solid var(--line);
border-radius:6px;width:260px}.filter output{color:var(--muted);margin-left:6px}
.cam-input{border-top:1px solid var(--line);padding:12px 0}
.cam-row{display:grid;gap:14px;align-items:start;
grid-template-columns:repeat(var(--n),minmax(0,300px)) minmax(220px,360px)}
.cam-row figure{margin:0;min-width:0}.cam-row img{display:block;width:100%;height:auto;
max-height:320px;object-fit:contain;object-position:left top;border-radius:4px}
.cam-row p{margin:0}
table.preds{border-collapse:collapse;font-size:12.5px;width:100%;min-width:0}
table.preds caption{text-align:left;color:var(--muted);padding-bottom:4px}
table.preds th{text-align:left;color:var(--muted);font-weight:600;
border-bottom:1px solid var(--line);padding:2px 8px}
table.preds td{padding:2px 8px;border-bottom:1px solid #eef1f4;overflow-wrap:anywhere}
table.preds td.n{text-align:right;white-space:nowrap;overflow-wrap:normal}
footer{margin-top:30px;color:var(--muted);font-size:12px}
@media print{.table-wrap{max-height:none;overflow:visible}details{display:block}}
"""

SCRIPT = """
(() => {
  "use strict";
  const key = (td, num) => {
    const v = td.dataset.v ?? td.textContent;
    if (!num) return v.toLowerCase();
    const n = v === "" ? NaN : Number(v);
    return Number.isNaN(n) ? null : n;
  };
  const sort = (table, col, th) => {
    const num = th.dataset.type === "num";
    const dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    const body = table.tBodies[0];
    const rows = Array.from(body.rows, (tr) => [key(tr.cells[col], num), +tr.dataset.order, tr]);
    rows.sort((a, b) => {
      if (a[0] === null || b[0] === null) {
        return a[0] === b[0] ? a[1] - b[1] : (a[0] === null ? 1 : -1);
      }
      return a[0] < b[0] ? -dir : a[0] > b[0] ? dir : a[1] - b[1];
    });
    for (const h of table.tHead.rows[0].cells) h.removeAttribute("aria-sort");
    th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
    body.append(...rows.map((r) => r[2]));
  };
  for (const table of document.querySelectorAll("table.sortable")) {
    Array.from(table.tBodies[0].rows).forEach((tr, i) => { tr.dataset.order = i; });
    Array.from(table.tHead.rows[0].cells).forEach((th, col) => {
      const button = document.createElement("button");
      button.type = "button";
      button.title = "Sort by " + th.textContent;
      button.append(...th.childNodes);
      th.append(button);
      th.addEventListener("click", () => sort(table, col, th));
    });
  }
  for (const input of document.querySelectorAll("input[data-filter]")) {
    const id = input.dataset.filter;
    const rows = Array.from(document.getElementById(id).tBodies[0].rows);
    const count = document.querySelector(`output[data-count="${id}"]`);
    input.closest(".filter").hidden = false;
    input.addEventListener("input", () => {
      const q = input.value.trim().toLowerCase();
      let shown = 0;
      for (const tr of rows) {
        tr.hidden = q !== "" && !tr.dataset.name.toLowerCase().includes(q);
        shown += tr.hidden ? 0 : 1;
      }
      count.value = `${shown} of ${rows.length}`;
    });
  }
  const reveal = () => {
    const target = location.hash && document.getElementById(location.hash.slice(1));
    const details = target && target.closest("details");
    if (details && !details.open) {
      details.open = true;
      target.scrollIntoView({block: "center"});
    }
  };
  window.addEventListener("hashchange", reveal);
  reveal();
})();
"""


def _policy(script: str) -> str:
    """Nothing loads from anywhere; images only from ``data:``; only this script runs."""
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
            f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'")


def report_html(report: Report, *, cmap: str = "jet", alpha: float = 0.5) -> str:
    """The whole page as text.

    Args:
        report: what :func:`hookscope.report.build_report` returned.
        cmap: the matplotlib colormap of the Grad-CAM overlays.
        alpha: the heatmap's weight in the overlays.
    """
    model = report.envelope.get("model")
    body = (_header(report) + _findings(report) + _plots(report) + _tables(report)
            + _cam(report, cmap, alpha))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{_policy(SCRIPT)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light">'
        f'<link rel="icon" href="data:,"><title>hookscope report: {e(model)}</title>'
        f"<style>{CSS}</style></head><body><main>{body}"
        f'<footer>Written by hookscope {e(report.envelope.get("hookscope"))} on '
        f"{e(report.created)}. This page is self-contained: it loads nothing.</footer>"
        f"</main><script>{SCRIPT}</script></body></html>\n")


def write_report(report: Report, output: Output, *, cmap: str = "jet",
                 alpha: float = 0.5) -> int:
    """Draw the page and write it to ``output`` (a file atomically); return its size.

    Its size and the time taken to draw and write it are one note on stderr.

    Raises:
        HookscopeError: the output cannot be written (a file is then left as it was).
    """
    start = time.perf_counter()
    text = report_html(report, cmap=cmap, alpha=alpha)
    write(output, text)
    size = len(text.encode("utf-8", "surrogateescape"))
    logging.getLogger("hookscope").info("wrote %s (%s) in %.2f s", output, _count(size, "B"),
                                        time.perf_counter() - start)
    return size
