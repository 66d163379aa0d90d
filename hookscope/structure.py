"""The module tree of a model: names, types, parameter counts and per-call shapes.

Parameters are counted once each, however they are shared: a module registered under two
names appears once (``named_modules`` deduplicates it, so its one name is the one every
other command accepts), and a parameter tied between two modules (weight tying) is owned
by the first module that holds it. The owned counts therefore add up to
``sum(p.numel() for p in model.parameters())``.

Output shapes come from one forward pass in inference mode with a pre-forward and a
forward hook on every module, through the one hook engine, so no hook is ever left behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from hookscope.errors import HookscopeError, param
from hookscope.hooks import Call, Site, all_sites, tensor_shapes
from hookscope.run import Probe, drive

__all__ = ["LayerCall", "LayerInfo", "ShapesProbe", "Structure", "model_structure",
           "parameter_counts"]

#: ``trainable`` when a module's parameters are partly trainable and partly frozen.
PARTIAL = "partial"


@dataclass(frozen=True)
class LayerCall:
    """The shapes seen by one call of a module."""

    input_shapes: list[list[int]]
    output_shape: list[int] | None
    output_shapes: list[list[int]]

    def to_dict(self) -> dict[str, Any]:
        return {"input_shapes": self.input_shapes, "output_shape": self.output_shape,
                "output_shapes": self.output_shapes}


@dataclass(frozen=True)
class LayerInfo:
    """One module: its own and subtree parameter counts, trainability and calls.

    ``trainable`` is True when every parameter of the subtree requires a gradient, False
    when none does, ``"partial"`` when some do, and None when the subtree has none.
    """

    name: str
    type: str
    depth: int
    params: int
    params_total: int
    trainable_params: int
    trainable: bool | str | None
    calls: list[LayerCall] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "depth": self.depth,
            "params": self.params,
            "params_total": self.params_total,
            "trainable": self.trainable,
            "calls": [c.to_dict() for c in self.calls],
        }


@dataclass(frozen=True)
class Structure:
    """What :func:`model_structure` returns.

    ``root`` is the model itself (name ``""``, depth 0), kept out of ``layers`` because its
    empty name cannot be selected; ``layers`` holds every other module in definition order,
    cut at ``max_depth`` when given. ``totals`` always cover the whole model.
    """

    root: LayerInfo
    layers: list[LayerInfo]
    params: int
    trainable_params: int
    modules: int
    input_shape: list[int] | None

    def totals(self) -> dict[str, int]:
        return {"params": self.params, "trainable_params": self.trainable_params,
                "modules": self.modules}

    def to_dict(self) -> dict[str, Any]:
        """The JSON document without its envelope: ``input_shape``, ``root``, ``layers``,
        ``totals``."""
        return {
            "input_shape": self.input_shape,
            "root": self.root.to_dict(),
            "layers": [layer.to_dict() for layer in self.layers],
            "totals": self.totals(),
        }


def _trainable(total: int, trainable: int) -> bool | str | None:
    if total == 0:
        return None
    if trainable == total:
        return True
    return False if trainable == 0 else PARTIAL


def parameter_counts(model: nn.Module) -> dict[str, tuple[int, int, int, int]]:
    """Per module name: (own, own trainable, subtree total, subtree trainable) parameters.

    Each parameter is owned by the first module (in ``named_modules`` order) that holds it,
    so shared modules and tied parameters are counted once, in the totals too.
    """
    seen: set[int] = set()
    counts: dict[str, tuple[int, int, int, int]] = {}
    for name, module in model.named_modules():
        own = own_train = 0
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            own += p.numel()
            own_train += p.numel() if p.requires_grad else 0
        # module.parameters() deduplicates within the subtree, as model.parameters() does.
        subtree = list(module.parameters())
        total = sum(p.numel() for p in subtree)
        total_train = sum(p.numel() for p in subtree if p.requires_grad)
        counts[name] = (own, own_train, total, total_train)
    return counts


class ShapesProbe(Probe[dict[str, list[LayerCall]]]):
    """Record each call's input and output shapes, on every module and the model itself."""

    def __init__(self, model: nn.Module) -> None:
        self.sites = [Site("", type(model).__name__, 0, model),
                      *(s for s in all_sites(model) if s.module is not model)]
        self.calls: dict[str, list[LayerCall]] = {}
        self._inputs: dict[tuple[str, int], list[list[int]]] = {}

    def on_enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._inputs[call.key] = tensor_shapes(args) + tensor_shapes(kwargs)

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        shapes = tensor_shapes(output)
        self.calls.setdefault(call.name, []).append(LayerCall(
            input_shapes=self._inputs.pop(call.key, []),
            output_shape=shapes[0] if shapes else None,
            output_shapes=shapes,
        ))

    def finish(self) -> dict[str, list[LayerCall]]:
        return self.calls


def model_structure(
    model: nn.Module,
    example: Any | None = None,
    *,
    max_depth: int | None = None,
) -> Structure:
    """The module tree of ``model`` with parameter counts and, given ``example``, shapes.

    Args:
        model: any ``nn.Module``; left with no hooks and its ``training`` flags intact.
        example: an input batch (a tensor, or a tuple of positional arguments) for one
            forward pass in eval and inference mode; without it no call shapes are recorded.
        max_depth: list modules down to this depth only (1 = the model's children); the
            parameter counts of a module at the cut still include everything below it.

    Raises:
        HookscopeError: ``max_depth`` below 1.
        ForwardError: the forward pass failed (it names the innermost running module).
    """
    if max_depth is not None and max_depth < 1:
        raise HookscopeError(f"{param('max_depth')} must be at least 1, not {max_depth}.")
    counts = parameter_counts(model)
    sites = [s for s in all_sites(model) if s.module is not model]
    root_site = Site("", type(model).__name__, 0, model)
    calls: dict[str, list[LayerCall]] = {}
    input_shape: list[int] | None = None
    if example is not None:
        found = tensor_shapes(example)
        # Per sample, without the batch dimension, as in the `stats` document.
        input_shape = found[0][1:] if found else None
        calls = drive(model, example, ShapesProbe(model))

    def info(site: Site) -> LayerInfo:
        own, _own_train, total, total_train = counts[site.name]
        return LayerInfo(
            name=site.name, type=site.type, depth=site.depth, params=own, params_total=total,
            trainable_params=total_train, trainable=_trainable(total, total_train),
            calls=calls.get(site.name, []),
        )

    shown = [s for s in sites if max_depth is None or s.depth <= max_depth]
    root_total = counts[""][2]
    root_train = counts[""][3]
    return Structure(
        root=info(root_site),
        layers=[info(s) for s in shown],
        params=root_total,
        trainable_params=root_train,
        modules=len(sites),
        input_shape=input_shape,
    )
