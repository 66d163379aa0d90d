"""Feature maps as pictures: capture layer outputs with forward hooks and tile their channels
into :class:`FeatureGrid` images, which :mod:`hookscope.render.features` writes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookscope.core.arguments import first_float
from hookscope.core.errors import HookscopeError, at_least_one, param
from hookscope.core.hooks import Call, first_tensor
from hookscope.core.run import Probe, Step, drive
from hookscope.core.select import Site, all_sites, find_site, select_sites
from hookscope.numerics.layout import Layout, TokenHint, extent, layout, token_hint

__all__ = ["ORDERS", "FeatureGrid", "FeaturesProbe", "FeaturesReport", "feature_grids",
           "feature_sites", "make_tiles"]

ORDERS = ("index", "mean", "max")


@dataclass(frozen=True)
class FeatureGrid:
    """One layer call's feature maps for one input, tiled into a grid image."""

    input: str
    stem: str
    index: int
    layer: str
    type: str
    call: int
    shape: list[int]
    channels: list[int]
    nonfinite: int
    image: torch.Tensor = field(repr=False, compare=False)
    values: torch.Tensor = field(repr=False, compare=False)

    @property
    def tag(self) -> str:
        """The TensorBoard tag: the layer name (``/callK`` for later calls)."""
        return self.layer if self.call == 0 else f"{self.layer}/call{self.call}"

    @property
    def filename(self) -> str:
        """``<stem>.<layer>.png`` (``.callK`` before ``.png`` for later calls)."""
        return output_name(self.stem, self.layer, self.call)

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input, "layer": self.layer, "type": self.type, "call": self.call,
                "shape": self.shape, "channels": self.channels, "nonfinite": self.nonfinite,
                "grid_size": [int(self.image.shape[2]), int(self.image.shape[1])]}


def output_name(stem: str, layer: str, call: int = 0) -> str:
    """The grid file name for an input stem and a layer call."""
    safe = layer.replace("/", "_") or "model"
    return f"{stem}.{safe}.png" if call == 0 else f"{stem}.{safe}.call{call}.png"


def feature_sites(model: nn.Module, layers: Sequence[str] | None = None,
                  types: Sequence[str] | None = None) -> list[Site]:
    """The union of ``layers`` (exact names or fnmatch patterns) and modules of ``types``;
    HookscopeError for nothing chosen, an unknown name, or a type that matches nothing."""
    if not layers and not types:
        raise HookscopeError(f"Choose layers with {param('layers')} (dotted names or patterns) "
                             f"or {param('types')} (class names, e.g. Conv2d).")
    chosen: dict[str, Site] = {}
    for name in layers or []:
        glob = any(ch in name for ch in "*?[")
        matched = select_sites(model, layers=[name], all_modules=True) if glob else [find_site(model, name)]
        chosen.update((s.name, s) for s in matched)
    if types:
        chosen.update((s.name, s) for s in select_sites(model, types=types, all_modules=True))
    order = {s.name: i for i, s in enumerate(all_sites(model))}
    return sorted(chosen.values(), key=lambda s: order.get(s.name, -1))


def _ranked(fmap: torch.Tensor, max_channels: int, order: str) -> list[int]:
    count = fmap.shape[0]
    k = min(max_channels, count)
    if order == "index":
        return list(range(k))
    clean = torch.nan_to_num(fmap.reshape(count, -1), nan=-math.inf)
    score = clean.mean(dim=1) if order == "mean" else clean.amax(dim=1)
    score = torch.nan_to_num(score, nan=-math.inf)
    return torch.sort(score, descending=True, stable=True).indices[:k].tolist()  # ties in order


def _check_tiling(max_channels: int, order: str) -> None:
    if order not in ORDERS:
        raise HookscopeError(f"{param('order')} {order!r}: choose one of {', '.join(ORDERS)}.")
    at_least_one("max_channels", max_channels)


#: A strip's row height and least width in pixels (each value of a short signal widened).
STRIP_ROW, STRIP_WIDTH = 8, 256
MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _scaled(tiles: torch.Tensor) -> torch.Tensor:
    """Each channel of (k, 1, ...) min-max scaled to [0, 1] on its own (a constant one: 0)."""
    flat = tiles.flatten(1)
    lo, hi = flat.amin(1), flat.amax(1)
    span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    shape = (-1, *[1] * (tiles.dim() - 1))
    return ((tiles - lo.reshape(shape)) / span.reshape(shape)).clamp_(0, 1)


def _strip(tiles: torch.Tensor) -> torch.Tensor:
    """(k, 1, L) channels as a (3, k rows, L) strip image, one row per channel."""
    rows = _scaled(tiles)[:, 0]  # (k, L)
    widen = max(1, -(-STRIP_WIDTH // rows.shape[1]))
    image = rows.repeat_interleave(STRIP_ROW, 0).repeat_interleave(widen, 1)
    for r in range(1, len(rows)):  # a white line between channels
        image[r * STRIP_ROW] = 1.0
    return image.unsqueeze(0).expand(3, *image.shape).contiguous()


def _sheet(tiles: torch.Tensor) -> torch.Tensor:
    """(k, 1, D, H, W) channels as a contact sheet: one grid of the k channels per slice or
    frame, frames in order row by row; each channel scaled over its whole volume."""
    from torchvision.utils import make_grid

    scaled = _scaled(tiles)
    nrow = math.ceil(math.sqrt(len(tiles)))
    frames = [make_grid(scaled[:, :, d], nrow=nrow, padding=2, pad_value=1.0)
              for d in range(scaled.shape[2])]
    return make_grid(torch.stack(frames), nrow=math.ceil(math.sqrt(len(frames))), padding=6,
                     pad_value=0.5)


def make_tiles(fmap: torch.Tensor, *, max_channels: int = 64, order: str = "index",
               upsample: tuple[int, ...] | None = None) -> tuple[torch.Tensor, list[int]]:
    """Tile a (C, H, W) feature map into a (3, H', W') grid image in [0, 1], each tile normalised
    on its own; returns it and the channels shown, in order. A signal's (C, L) map is a strip
    (a row per channel), a volume's or clip's (C, D, H, W) a contact sheet of per-frame grids."""
    from torchvision.utils import make_grid

    _check_tiling(max_channels, order)
    channels = _ranked(fmap, max_channels, order)
    tiles = fmap[channels].float().unsqueeze(1).nan_to_num(0.0, posinf=0.0, neginf=0.0)  # (k, 1, H, W)
    if upsample is not None and len(upsample) == tiles.dim() - 2 and \
            tuple(tiles.shape[2:]) != tuple(upsample):
        tiles = torch.nn.functional.interpolate(tiles, size=upsample,
                                                mode=MODES[len(upsample)], align_corners=False)
    if tiles.dim() != 4:
        return (_strip(tiles) if tiles.dim() == 3 else _sheet(tiles)), channels
    nrow = math.ceil(math.sqrt(len(channels)))
    grid = make_grid(tiles, nrow=nrow, padding=2, normalize=True, scale_each=True, pad_value=1.0)
    return grid.clamp_(0, 1), channels


def _spatial(output: Any, site: Site, size: tuple[int, ...], hint: TokenHint) -> torch.Tensor:
    """The output as (N, C, h, w): channels-last and token outputs laid out on their grid; a
    signal's (N, C, l) and a volume's (N, C, d, h, w) as they are."""
    t = first_tensor(output)
    if t is None:
        found: Layout | str = "it returns no tensor"
    else:
        found = layout(list(t.shape), size, type_name=site.type, hint=hint)
        if isinstance(found, Layout):
            return found.to_nchw(t)
        if t.dim() == 4:
            return t  # any other (N, C, H, W), 1x1 squeeze-excite outputs too, as it is
    shape = list(t.shape) if t is not None else None
    raise HookscopeError(
        f"{site.name} ({site.type}) returns {shape if shape else 'no tensor'}; feature "
        f"grids need an image grid ((N, C, H, W), (N, H, W, C) or patch tokens), or the "
        f"channels-first layout of a signal or volume input: {found}. "
        "Choose another layer (see `hookscope layers MODEL`).")


@dataclass(frozen=True)
class FeaturesReport:
    """What :class:`FeaturesProbe` returns: one row per grid, in the order they were made."""

    grids: list[dict[str, Any]]

    def document(self, out: Path, tensorboard: Path | None = None) -> dict[str, Any]:
        """The ``features`` document after the envelope: the folder, the TensorBoard log, the
        files (each row's ``path``, from the sink) and the rows."""
        return {"out": str(out), "tensorboard": str(tensorboard) if tensorboard else None,
                "files": [row["path"] for row in self.grids], "grids": list(self.grids)}


class FeaturesProbe(Probe[FeaturesReport]):
    """Tile each selected call's feature maps, per input, and hand each grid to ``sink``, which
    writes it and returns extra fields for its row (``{"path": ...}``); without one the grids are
    kept in :attr:`kept`. ``order`` is ``index`` (the first channels), ``mean`` or ``max`` (the
    most active first); ``hint`` lays token outputs on their grid (default: the driven model's).
    Maps are copied in the forward hook, before a later in-place operation can change them.
    """

    def __init__(self, sites: Sequence[Site], *,
                 sink: Callable[[FeatureGrid], dict[str, Any] | None] | None = None,
                 max_channels: int = 64, order: str = "index", upsample: bool = False,
                 stems: Sequence[str] | None = None, hint: TokenHint | None = None) -> None:
        _check_tiling(max_channels, order)
        self.sites = list(sites)
        self.sink, self.stems, self.hint = sink, stems, hint
        self.max_channels, self.order, self.upsample = max_channels, order, upsample
        self.size: tuple[int, ...] = (0, 0)
        self.captured: list[tuple[Call, torch.Tensor]] = []
        self.rows: list[dict[str, Any]] = []
        self.kept: list[FeatureGrid] = []

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        fmap = _spatial(output, call.site, self.size, self.hint or TokenHint())
        self.captured.append((call, fmap.detach().float().cpu().clone()))

    def bind(self, tracer: Any) -> None:
        if self.hint is None:
            self.hint = token_hint(tracer.model)

    def step(self, step: Step) -> None:
        self.captured.clear()
        self.size = extent(first_float(step.x)) or (0, 0)
        step.forward()
        size = self.size if self.upsample else None
        items = step.batch.items if step.batch is not None else None
        for row in range(len(step)):
            index = step.start + row
            name = items[row].name if items else f"input[{index}]"
            stem = (self.stems[index] if self.stems else
                    items[row].stem if items else f"input_{index}")
            for call, maps in self.captured:
                grid = self._grid(name, stem, index, call, maps[row], size)
                extra = self.sink(grid) if self.sink is not None else None
                if self.sink is None:
                    self.kept.append(grid)
                self.rows.append(grid.to_dict() | (extra or {}))
        self.captured.clear()

    def _grid(self, name: str, stem: str, index: int, call: Call, fmap: torch.Tensor,
              size: tuple[int, ...] | None) -> FeatureGrid:
        grid, channels = make_tiles(fmap, max_channels=self.max_channels, order=self.order,
                                    upsample=size)
        nonfinite = int(fmap.numel() - torch.isfinite(fmap).sum())
        return FeatureGrid(input=name, stem=stem, index=index, layer=call.name,
                           type=call.site.type, call=call.index, shape=list(fmap.shape),
                           channels=channels, nonfinite=nonfinite, image=grid, values=fmap)

    def finish(self) -> FeaturesReport:
        return FeaturesReport(self.rows)


def feature_grids(model: nn.Module, inputs: Any, sites: Sequence[Site], **options: Any
                  ) -> list[FeatureGrid]:
    """Every grid for ``inputs`` (a batch or an iterable of batches) at ``sites``; ``options``
    are those of :class:`FeaturesProbe` (``max_channels``, ``order``, ...)."""
    probe = FeaturesProbe(sites, **options)
    drive(model, inputs, probe)
    return probe.kept
