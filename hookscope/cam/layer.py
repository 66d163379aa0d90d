"""The layer a CAM explains when none is given (see :func:`default_layer`); what counts as an
image grid is :mod:`hookscope.numerics.layout`'s rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookscope.cam.methods import PLAIN
from hookscope.cam.passes import output_tensor
from hookscope.core.arguments import placement
from hookscope.core.errors import HookscopeError, param
from hookscope.core.hooks import Call, first_tensor
from hookscope.core.run import Probe, Step, drive
from hookscope.core.select import all_sites
from hookscope.numerics.layout import Layout, extent, layout, token_hint

__all__ = ["default_layer", "why_chosen"]


@dataclass(frozen=True)
class _Grid:
    """A module call whose output is an image grid."""

    name: str
    type: str
    shape: list[int]  # as (N, C, h, w), (N, C, l) or (N, C, d, h, w)
    kind: str


class _Spatial(Probe[list[_Grid]]):
    """Every module (in execution order of their ends) whose output is an image grid, except
    one whose 4-D input is 1x1: a map repeated from one cell carries no localisation."""

    grad = PLAIN

    def __init__(self, model: nn.Module, overlay: int | str | None) -> None:
        self.overlay = overlay
        self.sites = [s for s in all_sites(model) if s.name]
        self.found: list[_Grid] = []
        self.ran: set[str] = set()
        self.hint = token_hint(model)
        self.size: tuple[int, ...] = (0, 0)

    def step(self, step: Step) -> None:
        self.size = extent(placement(step.x, self.overlay).shown) or (0, 0)
        step.forward()

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        self.ran.add(call.name)
        t = output_tensor(output)
        if t is None:
            return  # a layer must return a tensor, or a tuple starting with one
        source = first_tensor(args)
        if source is not None and source.dim() == 4 and source.shape[2] * source.shape[3] == 1:
            return  # repeated from a 1x1 input (AlexNet's avgpool, small inputs): constant
        found = layout(list(t.shape), self.size, type_name=call.site.type, hint=self.hint)
        if isinstance(found, Layout):
            c = t.shape[found.channel_dim]
            self.found.append(_Grid(call.name, call.site.type,
                                    [int(t.shape[0]), int(c), *found.grid], found.kind))

    def finish(self) -> list[_Grid]:
        return self.found


def _stage(found: Sequence[_Grid], ran: set[str], model: nn.Module) -> _Grid | None:
    """The last spatial stage of a backbone: a module under ``backbone.body`` (FPN) or
    ``backbone`` whose parent there did not run itself (so ModuleList entries count)."""
    names = dict(model.named_modules())
    prefix = "backbone.body" if "backbone.body" in names else "backbone"
    if prefix not in names:
        return None
    stages = [g for g in found if g.name.startswith(prefix + ".")
              and (g.name.rsplit(".", 1)[0] == prefix or g.name.rsplit(".", 1)[0] not in ran)]
    return stages[-1] if stages else None


def _block(name: str, containers: set[str]) -> str | None:
    """The nearest enclosing block of ``name``: an ancestor held by a ModuleList or
    Sequential (``blocks.11``, ``encoder.layer.1``, ``encoder.layers.encoder_layer_11``)."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:end - 1]) in containers:
            return ".".join(parts[:end])
    return None


def _token_layer(found: Sequence[_Grid], model: nn.Module) -> _Grid | None:
    """A token model's layer: the last block's first norm (``norm1``, ``ln_1``...), as
    pytorch-grad-cam advises: after the last block, a classifier reading only the class
    token gives the patch tokens no gradient."""
    containers = {n for n, m in model.named_modules() if isinstance(m, (nn.ModuleList,
                                                                          nn.Sequential))}
    norms = [(g, _block(g.name, containers)) for g in found
             if g.kind == "tokens" and "Norm" in g.type]
    inside = [(g, b) for g, b in norms if b is not None]
    return next((g for g, b in inside if b == inside[-1][1]), None)


def default_layer(model: nn.Module, sample: Any, *, autocast: torch.dtype | None = None,
                  task: str = "classification", overlay: int | str | None = None
                  ) -> tuple[str, list[int]]:
    """The layer to explain when none is given, and its (N, C, h, w), from one forward pass
    of ``sample`` (the forward's arguments; ``overlay`` picks the input the grid is measured
    on, as in :func:`~hookscope.core.arguments.placement`): the last module whose output is an
    image grid (for a token transformer, its last block's first norm); for a segmentation
    model or detector, the last such stage of its backbone if there is one. HookscopeError if
    no module has a spatial output.
    """
    probe = _Spatial(model, overlay)
    found = drive(model, sample, probe, autocast=autocast)
    chosen = _stage(found, probe.ran, model) if task != "classification" else None
    if chosen is None and found and found[-1].kind == "tokens":
        chosen = _token_layer(found, model)
    if chosen is None and found:
        chosen = found[-1]
    if chosen is None:
        raise HookscopeError(
            f"{type(model).__name__} has no module with a spatial output larger than 1x1 "
            f"(N, C, H, W), (N, H, W, C) or patch tokens; choose {param('layer')}."
        )
    return chosen.name, chosen.shape


def why_chosen(layer: str, task: str) -> str:
    """How a note says why :func:`default_layer` chose ``layer`` for a ``task`` model."""
    if task == "classification":
        return "the default for this model"
    return "the backbone's last stage" if layer.startswith("backbone.") else \
        "the last module with an image-grid output"
