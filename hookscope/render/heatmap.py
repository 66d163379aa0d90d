"""Heatmap PNGs: a matplotlib colormap, overlays at the original resolution, staged writes.

All image I/O is Pillow. Colouring uses a 256-entry lookup table taken from matplotlib, so
a large photo costs one table lookup per pixel. Files are written through
:class:`hookscope.render.output.Staging` (re-exported here): under temporary names, renamed
into place only when the whole run succeeded, so a failed run leaves no partial output.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from hookscope.errors import HookscopeError
from hookscope.render.output import Staging as Staging  # re-exported: callers use heatmap.Staging
from hookscope.render.output import check_folder
from hookscope.render.output import output_folder as output_folder

if TYPE_CHECKING:
    from hookscope.cam import CamBatch

Box = tuple[float, float, float, float]


@lru_cache(maxsize=16)
def colormap_lut(name: str) -> np.ndarray:
    """(256, 3) uint8 colours of a matplotlib colormap.

    Raises:
        HookscopeError: unknown colormap, with close names.
    """
    import matplotlib

    from hookscope.errors import suggest

    try:
        cmap = matplotlib.colormaps[name]
    except KeyError:
        names = sorted(matplotlib.colormaps)
        raise HookscopeError(
            f"--colormap {name!r} is not a matplotlib colormap.{suggest(name, names)} "
            "Common choices: jet, turbo, viridis, inferno, magma."
        ) from None
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


def _box_pixels(box: Box, size: tuple[int, int]) -> tuple[int, int, int, int]:
    width, height = size
    left, top, right, bottom = box
    x0, y0 = max(0, int(round(left))), max(0, int(round(top)))
    x1, y1 = min(width, int(round(right))), min(height, int(round(bottom)))
    return x0, y0, max(x1, x0 + 1), max(y1, y0 + 1)


def heatmap_images(
    values: np.ndarray,
    image: Image.Image,
    box: Box | None = None,
    *,
    cmap: str = "jet",
    alpha: float = 0.5,
) -> tuple[Image.Image, Image.Image]:
    """The overlay and the coloured map alone, both at ``image``'s size.

    Args:
        values: (h, w) map in [0, 1], at the model input's resolution.
        image: the original RGB image.
        box: where the model input lies in ``image`` (a centre crop); None for all of it.
            Outside the box the overlay shows the image untinted and the heatmap is
            transparent.
        cmap: matplotlib colormap name.
        alpha: weight of the heatmap in the overlay.
    """
    base = np.asarray(image.convert("RGB"), dtype=np.float32)
    height, width = base.shape[:2]
    x0, y0, x1, y1 = _box_pixels(box or (0, 0, width, height), (width, height))
    colours = colorize(resize_map(values, (x1 - x0, y1 - y0)), cmap).astype(np.float32)
    overlay = base.copy()
    overlay[y0:y1, x0:x1] = (1.0 - alpha) * base[y0:y1, x0:x1] + alpha * colours
    over = Image.fromarray(np.clip(np.rint(overlay), 0, 255).astype(np.uint8), "RGB")
    if (x0, y0, x1, y1) == (0, 0, width, height):
        heat = Image.fromarray(colours.astype(np.uint8), "RGB")
    else:
        rgba = np.zeros((height, width, 4), dtype=np.uint8)
        rgba[y0:y1, x0:x1, :3] = colours.astype(np.uint8)
        rgba[y0:y1, x0:x1, 3] = 255
        heat = Image.fromarray(rgba, "RGBA")
    return over, heat


def denormalize(
    tensor: Any, mean: Sequence[float] | None, std: Sequence[float] | None
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


def write_cam_files(
    staging: Staging,
    values: np.ndarray,
    image: Image.Image,
    box: Box | None,
    paths: dict[str, Path | None],
    *,
    raw: np.ndarray | None = None,
    cmap: str = "jet",
    alpha: float = 0.5,
) -> None:
    """Render and stage one input's overlay, heatmap and (optionally) raw ``.npy`` files."""
    over, heat = heatmap_images(values, image, box, cmap=cmap, alpha=alpha)
    staging.save_png(over, paths["overlay"])  # type: ignore[arg-type]
    staging.save_png(heat, paths["heatmap"])  # type: ignore[arg-type]
    if raw is not None and paths.get("raw") is not None:
        staging.save_npy(raw, paths["raw"])  # type: ignore[arg-type]


class CamWriter:
    """Sink for :class:`hookscope.cam.CamProbe`: stages each batch's PNGs (and ``.npy``
    maps) in worker threads and keeps one result row per input and method.

    Overlays are drawn on the original image, the map placed where the model's input lies
    in it; tensor inputs are drawn on their de-normalised tensor.

    Args:
        staging: where the files are written (all or nothing).
        plans: per input of the whole run, per method, the paths (see :func:`output_paths`).
        loaded: the model's labels and preprocessing (``label``, ``mean``, ``std``).
        save_raw: also write the raw ``.npy`` maps.
        cmap: matplotlib colormap name.
        alpha: weight of the heatmap in the overlay.
    """

    def __init__(self, staging: Staging, plans: Sequence[dict[str, dict[str, Path | None]]],
                 loaded: Any, *, save_raw: bool = False, cmap: str = "jet",
                 alpha: float = 0.5) -> None:
        self.staging, self.plans, self.loaded = staging, plans, loaded
        self.save_raw, self.cmap, self.alpha = save_raw, cmap, alpha
        self.rows: list[dict[str, Any]] = []

    def __call__(self, explained: CamBatch) -> None:
        batch = explained.batch
        if batch is None:
            raise ValueError("CamWriter needs batches from hookscope.inputs.iter_batches")
        for i, item in enumerate(batch.items):
            image = batch.images[i] or denormalize(batch.tensor[i], self.loaded.mean,
                                                   self.loaded.std)
            for name, res in explained.results.items():
                paths = self.plans[batch.start + i][name]
                self.staging.submit(write_cam_files, self.staging, res.maps[i], image,
                                    explained.boxes[i], paths,
                                    raw=res.raw[i] if self.save_raw else None,
                                    cmap=self.cmap, alpha=self.alpha)
                self.rows.append({
                    "input": item.name, "method": name, "layer": res.layer,
                    "target": res.targets[i], "label": self.loaded.label(res.targets[i]),
                    "score": res.scores[i], "prob": res.probs[i],
                    "overlay": str(paths["overlay"]), "heatmap": str(paths["heatmap"]),
                    "raw": str(paths["raw"]) if paths["raw"] is not None else None,
                    "peak": list(explained.peaks[name][i]),
                })

    @staticmethod
    def log_notes(notes: Sequence[str]) -> None:
        """The methods' notes, one warning line each."""
        for note in notes:
            logging.getLogger("hookscope").warning(note)


def output_paths(
    stems: Sequence[str], methods: Sequence[str], out: Path, *, save_raw: bool
) -> list[dict[str, dict[str, Path | None]]]:
    """Per input, per method: the ``overlay``, ``heatmap`` and ``raw`` paths in ``out``.

    Inputs with the same stem (``a/cat.jpg`` and ``b/cat.jpg``) get ``cat-2``, ``cat-3``...
    so no run ever writes one file twice.
    """
    seen: dict[str, int] = {}
    plans: list[dict[str, dict[str, Path | None]]] = []
    for stem in stems:
        count = seen.get(stem, 0) + 1
        seen[stem] = count
        unique = stem if count == 1 else f"{stem}-{count}"
        while count > 1 and unique in seen:
            count += 1
            unique = f"{stem}-{count}"
        if unique != stem:
            seen[unique] = 1
        plans.append({
            m: {
                "overlay": out / f"{unique}.{m}.png",
                "heatmap": out / f"{unique}.{m}.heatmap.png",
                "raw": out / f"{unique}.{m}.npy" if save_raw else None,
            }
            for m in methods
        })
    return plans


def check_outputs(out: Path, plans: Sequence[dict[str, dict[str, Path | None]]], *,
                  force: bool) -> None:
    """Fail before any work when ``out`` cannot be written to or a planned file exists.

    Raises:
        HookscopeError: see :func:`hookscope.render.output.check_folder`.
    """
    planned = [p for plan in plans for files in plan.values() for p in files.values()
               if p is not None]
    check_folder(out, planned=planned, force=force)
