"""Grad-CAM files: overlays at the original resolution (a region's outline or a detector's
boxes drawn on), heatmaps, guided images and raw maps, staged through
:class:`hookscope.core.files.Staging`. Colouring is a 256-entry lookup table from matplotlib.

A signal's map is drawn as a curve over its channels (:func:`signal_images`), a volume's or
clip's as one overlay per slice or frame in a contact sheet (:func:`volume_images`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from hookscope.cam.result import Box, CamBatch, CamRows, deprocess
from hookscope.core.errors import HookscopeError, suggest
from hookscope.core.files import Staging
from hookscope.inputs.resolve import unique_stems


@lru_cache(maxsize=16)
def colormap_lut(name: str) -> np.ndarray:
    """(256, 3) uint8 colours of a matplotlib colormap (an unknown name: a
    :class:`HookscopeError` with the close ones)."""
    try:
        cmap = matplotlib.colormaps[name]
    except KeyError:
        raise HookscopeError(
            f"--colormap {name!r} is not a matplotlib colormap."
            f"{suggest(name, sorted(matplotlib.colormaps))} "
            "Common choices: jet, turbo, viridis, inferno, magma.") from None
    rgba = cmap(np.linspace(0.0, 1.0, 256))
    return np.clip(np.round(rgba[:, :3] * 255.0), 0, 255).astype(np.uint8)


def check_colormap(name: str) -> None:
    """Fail early on an unknown colormap name."""
    colormap_lut(name)


def colorize(values: np.ndarray, cmap: str = "jet") -> np.ndarray:
    """(H, W) values in [0, 1] to (H, W, 3) uint8 colours."""
    index = np.clip(np.rint(np.nan_to_num(values) * 255.0), 0, 255).astype(np.uint8)
    return colormap_lut(cmap)[index]


def resize_map(values: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear resize of a float (h, w) map to ``size`` = (width, height), clipped to [0, 1]."""
    img = Image.fromarray(np.ascontiguousarray(values, dtype=np.float32), mode="F")
    if img.size != size:
        img = img.resize(size, Image.Resampling.BILINEAR)
    return np.clip(np.asarray(img, dtype=np.float32), 0.0, 1.0)


def _box_pixels(box: Box | None, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Where the model input lies in an image of ``size``, in whole pixels (None: all of it)."""
    width, height = size
    left, top, right, bottom = box or (0, 0, width, height)
    x0, y0 = max(0, int(round(left))), max(0, int(round(top)))
    x1, y1 = min(width, int(round(right))), min(height, int(round(bottom)))
    return x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)


def heatmap_images(values: np.ndarray, image: Image.Image, box: Box | None = None, *,
                   cmap: str = "jet", alpha: float = 0.5) -> tuple[Image.Image, Image.Image]:
    """The overlay and the coloured map alone, both at ``image``'s size.

    ``values`` is the (h, w) map in [0, 1] at the model input's resolution, placed at ``box``
    (a centre crop; None: all of ``image``); outside it the overlay is untinted and the
    heatmap transparent. ``alpha`` is the heatmap's weight in the overlay.
    """
    over = image.convert("RGB")  # a copy
    crop = _box_pixels(box, over.size)
    x0, y0, x1, y1 = crop
    colours = Image.fromarray(colorize(resize_map(values, (x1 - x0, y1 - y0)), cmap), "RGB")
    over.paste(Image.blend(over.crop(crop), colours, alpha), (x0, y0))
    if crop == (0, 0, *over.size):
        return over, colours
    heat = Image.new("RGBA", over.size)  # transparent
    heat.paste(colours, (x0, y0))
    return over, heat


def draw_region(overlay: Image.Image, region: np.ndarray, box: Box | None) -> Image.Image:
    """Outline ``region`` ((h, w) bool at the model input's resolution) in white, about two
    pixels wide, on ``overlay``, placed where the model's input lies in it."""
    x0, y0, x1, y1 = _box_pixels(box, overlay.size)
    mask = Image.fromarray(region.astype(np.uint8) * 255, "L").resize(
        (x1 - x0, y1 - y0), Image.Resampling.NEAREST)
    grown = np.asarray(mask.filter(ImageFilter.MaxFilter(3))) > 0
    edge = grown & ~(np.asarray(mask.filter(ImageFilter.MinFilter(3))) > 0)
    arr = np.asarray(overlay).copy()
    arr[y0:y1, x0:x1][edge] = (255, 255, 255)
    return Image.fromarray(arr, "RGB")


def draw_boxes(overlay: Image.Image, detections: Sequence[dict[str, Any]],
               input_size: tuple[int, int], box: Box | None,
               label: Any = None) -> Image.Image:
    """Draw detections (boxes in the model input's pixels, ``input_size`` = (w, h)) with
    their label and score."""
    width, height = overlay.size
    x0, y0, x1, y1 = _box_pixels(box, overlay.size)
    sx, sy = (x1 - x0) / input_size[0], (y1 - y0) / input_size[1]
    out = overlay.copy()
    draw = ImageDraw.Draw(out)
    line = max(2, round(min(width, height) / 200))
    for det in detections:
        bx0, by0, bx1, by1 = det["box"]
        rect = (x0 + bx0 * sx, y0 + by0 * sy, x0 + bx1 * sx, y0 + by1 * sy)
        draw.rectangle(rect, outline=(255, 255, 255), width=line)
        name = (label(det["label"]) if label is not None else None) or str(det["label"])
        text = f"{name} {det['score']:.2f}"
        left, top = rect[0], max(0.0, rect[1] - 12)
        draw.rectangle(draw.textbbox((left, top), text), fill=(0, 0, 0))
        draw.text((left, top), text, fill=(255, 255, 255))
    return out


def denormalize(tensor: Any, mean: Sequence[float] | None, std: Sequence[float] | None
                ) -> Image.Image:
    """An RGB image from a preprocessed (C, H, W) tensor or array, undoing mean/std."""
    arr = np.asarray(tensor.detach().cpu() if hasattr(tensor, "detach") else tensor,
                     dtype=np.float32)
    if arr.shape[0] == 1:
        arr = np.repeat(arr, 3, axis=0)
    arr = arr[:3]
    if mean is not None and std is not None and len(mean) >= 3 and len(std) >= 3:
        arr = arr * np.asarray(std[:3], np.float32)[:, None, None] + np.asarray(
            mean[:3], np.float32)[:, None, None]
    else:
        lo, hi = float(np.nanmin(arr)), float(np.nanmax(arr))
        arr = (arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr)
    pixels = np.clip(np.rint(np.nan_to_num(arr) * 255.0), 0, 255).astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(pixels.transpose(1, 2, 0)), "RGB")


#: The smallest side of a frame in a volume's contact sheet, in pixels.
MIN_FRAME = 96


def signal_images(values: np.ndarray, signal: Any, *, cmap: str = "jet",
                  alpha: float = 0.5) -> tuple[Image.Image, Image.Image]:
    """A signal's map ((L,) in [0, 1]) drawn over its ``signal`` ((C, L)): the channels as
    faint lines, the map as a filled curve on its own 0-1 axis and a colour band under them;
    and the colour band alone (the heatmap). ``alpha`` is the filled curve's opacity."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    arr = np.asarray(signal.detach().cpu() if hasattr(signal, "detach") else signal,
                     dtype=np.float32)
    length = len(values)
    t = np.arange(length)
    fig = Figure(figsize=(8, 3), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes((0.07, 0.22, 0.86, 0.72))
    for channel in arr[:16]:
        ax.plot(t, channel, color="0.45", linewidth=0.8, alpha=0.45)
    ax.set_xlim(0, max(1, length - 1))
    ax.set_yticks([])
    curve = ax.twinx()
    lut = colormap_lut(cmap) / 255.0
    curve.fill_between(t, values, color=lut[200], alpha=alpha, linewidth=0)
    curve.plot(t, values, color=lut[230], linewidth=1.2)
    curve.set_ylim(0, 1.05)
    band = fig.add_axes((0.07, 0.06, 0.86, 0.08))
    band.imshow(values[None, :], cmap=cmap, vmin=0, vmax=1, aspect="auto",
                interpolation="nearest")
    band.set_axis_off()
    canvas.draw()
    over = Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy(), "RGB")
    grid = np.linspace(0, length - 1, max(256, length))  # the band, linearly resampled, 24 high
    heat = np.repeat(colorize(np.interp(grid, t, values), cmap)[None], 24, axis=0)
    return over, Image.fromarray(heat, "RGB")


def volume_images(values: np.ndarray, volume: Any, mean: Sequence[float] | None,
                  std: Sequence[float] | None, *, cmap: str = "jet", alpha: float = 0.5
                  ) -> tuple[Image.Image, Image.Image]:
    """A volume's or clip's map ((D, H, W) in [0, 1]) over each slice or frame of ``volume``
    ((C, D, H, W), de-normalised as an image), in a contact sheet (torchvision's
    ``make_grid``, frames in order, row by row); and the coloured maps alone in one."""
    from torchvision.transforms.functional import pil_to_tensor, to_pil_image
    from torchvision.utils import make_grid

    height, width = values.shape[1:]
    scale = max(1, -(-MIN_FRAME // min(height, width)))  # small frames drawn larger
    pairs = [heatmap_images(values[d], denormalize(volume[:, d], mean, std).resize(
        (width * scale, height * scale), Image.Resampling.NEAREST), cmap=cmap, alpha=alpha)
        for d in range(len(values))]
    nrow = math.ceil(math.sqrt(len(values)))
    over, heat = (to_pil_image(make_grid([pil_to_tensor(i) for i in images], nrow=nrow, padding=2,
                                         pad_value=255)) for images in zip(*pairs, strict=True))
    return over, heat


def overlay_images(values: np.ndarray, x: Any, image: Image.Image | None, box: Box | None,
                   mean: Sequence[float] | None, std: Sequence[float] | None, *,
                   cmap: str = "jet", alpha: float = 0.5) -> tuple[Image.Image, Image.Image]:
    """A map over its input, by the input ``x``'s rank: a signal's (C, L) curve
    (:func:`signal_images`), a volume's (C, D, H, W) contact sheet (:func:`volume_images`),
    else over ``image`` (:func:`heatmap_images`, ``box`` its crop)."""
    if x is not None and x.dim() == 2:
        return signal_images(values, x, cmap=cmap, alpha=alpha)
    if x is not None and x.dim() == 4:
        return volume_images(values, x, mean, std, cmap=cmap, alpha=alpha)
    assert image is not None  # an image's
    return heatmap_images(values, image, box, cmap=cmap, alpha=alpha)


class CamWriter(CamRows):
    """Sink for :class:`hookscope.cam.probe.CamProbe`: stages each batch's files in worker
    threads and keeps the document's rows (:class:`CamRows`).

    Overlays are drawn on the original image (a tensor input: on its de-normalised tensor).
    Inputs the probe skipped get no file and no row. ``plans`` are :func:`output_paths`';
    ``loaded`` gives the labels and the preprocessing's ``mean`` and ``std``.
    """

    def __init__(self, staging: Staging, plans: Sequence[dict[str, dict[str, Path | None]]],
                 loaded: Any, *, save_raw: bool = False, cmap: str = "jet",
                 alpha: float = 0.5) -> None:
        super().__init__(plans, loaded.label, save_raw=save_raw)
        self.staging, self.loaded, self.cmap, self.alpha = staging, loaded, cmap, alpha

    def __call__(self, explained: CamBatch) -> None:
        super().__call__(explained)
        batch, x = explained.batch, explained.shown
        assert batch is not None and x is not None  # CamRows refused it; the probe sets it
        size = (int(x.shape[-1]), int(x.shape[-2]))
        for i in range(len(batch.items)):
            if explained.skipped and explained.skipped[i] is not None:
                continue
            image = None if x.dim() != 4 else \
                batch.images[i] or denormalize(x[i], self.loaded.mean, self.loaded.std)
            for name, res in explained.results.items():
                self.staging.submit(self._write, res, i, x[i], image, explained.boxes[i],
                                    self.plans[batch.start + i][name], size)

    def _write(self, res: Any, i: int, x: Any, image: Image.Image | None, box: Box | None,
               paths: dict[str, Any], size: tuple[int, int]) -> None:
        """Render and stage input ``i``'s overlay, heatmap, raw ``.npy`` (with ``save_raw``:
        the layer's own shape) and guided files; ``x`` is the input drawn on (a signal's or
        volume's regions, boxes and guided image are None: the probe refuses them)."""
        over, heat = overlay_images(res.maps[i], x, image, box, self.loaded.mean, self.loaded.std,
                                    cmap=self.cmap, alpha=self.alpha)
        if res.regions is not None:
            over = draw_region(over, res.regions[i], box)
        if res.detections is not None and res.detections[i]:
            over = draw_boxes(over, res.detections[i], size, box, self.loaded.label)
        self.staging.save_png(over, paths["overlay"])
        self.staging.save_png(heat, paths["heatmap"])
        if self.save_raw:
            raws = zip([f"raw.{layer}" for layer in res.layers], res.raws, strict=True) \
                if len(res.layers) > 1 else [("raw", res.raw)]
            for key, raw in raws:
                self.staging.save_npy(raw[i], paths[key])
        if res.guided is not None and paths.get("guided") is not None:
            self.staging.save_png(Image.fromarray(deprocess(res.guided[i]), "RGB"),
                                  paths["guided"])

    @staticmethod
    def log_notes(notes: Sequence[str]) -> None:
        """The methods' notes, one warning line each."""
        for note in notes:
            logging.getLogger("hookscope").warning(note)


def output_paths(stems: Sequence[str], methods: Sequence[str], out: Path, *, save_raw: bool,
                 layers: Sequence[str] = (), guided: bool = False
                 ) -> list[dict[str, dict[str, Path | None]]]:
    """Per input, per method: the ``overlay``, ``heatmap``, ``raw`` (and ``guided``) paths.

    With several ``layers``, each layer's raw map is ``raw.<layer>``
    (``<stem>.<method>.<layer>.npy``) and ``raw`` is the first layer's. Same stems get
    ``cat-2``, ``cat-3``... (:func:`unique_stems`).
    """
    def paths(base: str) -> dict[str, Path | None]:
        raws = {f"raw.{layer}": f"{base}.{layer}.npy" for layer in layers} if len(layers) > 1 else {}
        raws["raw"] = raws[f"raw.{layers[0]}"] if raws else f"{base}.npy"
        files: dict[str, Path | None] = {"overlay": out / f"{base}.png",
                                         "heatmap": out / f"{base}.heatmap.png"}
        files |= {key: out / name if save_raw else None for key, name in raws.items()}
        if guided:
            files["guided"] = out / f"{base}.guided.png"
        return files

    return [{m: paths(f"{unique}.{m}") for m in methods} for unique in unique_stems(stems)]
