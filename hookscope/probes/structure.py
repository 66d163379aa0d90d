"""The module tree of a model: names, types, parameters, per-call shapes, FLOPs and bytes.

Parameters are counted once each: a shared module appears once, and a tied parameter is owned
by the first module that holds it. Shapes come from one forward pass under ``FlopCounterMode``;
a call's FLOPs are how much its total grew between the call's two hooks, so calls keep the
``named_modules`` names (the counter's module tracker names a module registered twice, or
called outside its parent's forward, otherwise).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hookscope.core.errors import at_least_one
from hookscope.core.hooks import Call, tensor_shapes, tensors
from hookscope.core.run import Probe, Step, drive
from hookscope.core.select import Site, depth_of

__all__ = ["LayerCall", "LayerInfo", "ShapesProbe", "Structure", "count_flops", "model_structure"]


def _macs(flops: int | None) -> int | None:
    # Every formula FlopCounterMode has (matmul, convolution, attention) counts 2 per MAC.
    return None if flops is None else flops // 2


def nbytes(obj: Any) -> int:
    """Bytes of every tensor in a (nested) tensor, tuple, list or dict, each tensor once."""
    found = {id(t): t for t in tensors(obj)}
    return sum(t.numel() * t.element_size() for t in found.values())


@dataclass(frozen=True)
class LayerCall:
    """The shapes, FLOPs (submodules included; None: not counted) and output bytes of one call
    of a module."""

    input_shapes: list[list[int]]
    output_shape: list[int] | None
    output_shapes: list[list[int]]
    flops: int | None = None
    macs: int | None = field(init=False)
    output_bytes: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "macs", _macs(self.flops))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LayerInfo:
    """One module: its own and subtree parameter counts, trainability and calls.

    ``trainable`` is True, False, ``"partial"``, or None when the subtree has no parameter.
    ``flops`` sums its calls, ``flops_own`` only what ran outside any submodule call (None: no
    forward pass ran). Parameter bytes are by dtype name, owned and of the subtree (``_total``).
    """

    name: str
    type: str
    depth: int
    params: int
    params_total: int
    trainable_params: int
    trainable: bool | str | None
    calls: list[LayerCall] = field(default_factory=list)
    flops: int | None = None
    macs: int | None = field(init=False)
    flops_own: int | None = None
    macs_own: int | None = field(init=False)
    params_bytes: dict[str, int] = field(default_factory=dict)
    params_bytes_total: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "macs", _macs(self.flops))
        object.__setattr__(self, "macs_own", _macs(self.flops_own))

    def to_dict(self) -> dict[str, Any]:
        """The JSON row (the subtree's trainable count is in the totals only)."""
        return {k: v for k, v in asdict(self).items() if k != "trainable_params"}


@dataclass(frozen=True)
class Structure:
    """What :func:`model_structure` returns: the model itself (``root``, whose empty name
    cannot be selected) and every other module in definition order (``layers``, cut at
    ``max_depth``). Totals cover the whole model; ``flops``, ``activation_bytes`` (outputs of
    every leaf call) and ``input_bytes`` are for the example batch, None without one.
    """

    root: LayerInfo
    layers: list[LayerInfo]
    params: int
    trainable_params: int
    modules: int
    input_shape: list[int] | None
    flops: int | None = None
    params_bytes: dict[str, int] = field(default_factory=dict)
    activation_bytes: int | None = None
    input_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document without its envelope."""
        totals = {"params": self.params, "trainable_params": self.trainable_params, "modules": self.modules,
                  "flops": self.flops, "macs": _macs(self.flops), "params_bytes": self.params_bytes,
                  "activation_bytes": self.activation_bytes, "input_bytes": self.input_bytes}
        return {"input_shape": self.input_shape, "root": self.root.to_dict(),
                "layers": [layer.to_dict() for layer in self.layers], "totals": totals}


def _trainable(total: int, trainable: int) -> bool | str | None:
    if total == 0:
        return None
    if trainable == total:
        return True
    return False if trainable == 0 else "partial"


def _owned(model: nn.Module) -> dict[str, tuple[list[nn.Parameter], list[nn.Parameter]]]:
    """Per module name: the parameters it owns and those of its subtree. The first module (in
    ``named_modules`` order) that holds a parameter owns it, so shared ones are owned once."""
    seen: set[int] = set()
    found = {}
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        # module.parameters() deduplicates within the subtree, as model.parameters() does.
        found[name] = (own, list(module.parameters()))
    return found


def _numel(params: Iterable[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


def _dtype_bytes(params: Iterable[nn.Parameter]) -> dict[str, int]:
    found: Counter[str] = Counter()
    for p in params:
        found[str(p.dtype).removeprefix("torch.")] += p.numel() * p.element_size()
    return dict(sorted(found.items()))


def _sdpa_cpu_flop(query_shape: list[int], key_shape: list[int], value_shape: list[int],
                   *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """``softmax(q k^T) v``: two batched matmuls, 2 FLOPs per multiply-add, as FlopCounterMode
    counts its other attention kernels (the causal mask ignored)."""
    batch_heads, queries, dim = math.prod(query_shape[:-2]), query_shape[-2], query_shape[-1]
    keys, value_dim = key_shape[-2], value_shape[-1]
    return 2 * batch_heads * queries * keys * (dim + value_dim)


class _NoModuleTracker(nullcontext):
    """Stands in for ``FlopCounterMode``'s module tracker (every FLOP goes to ``Global``),
    whose table is never read and whose multi-grad hooks fail in inference mode on a
    parameter passed straight to a submodule, as timm's CaiT passes its class token."""

    parents = frozenset({"Global"})


@contextmanager
def count_flops() -> Iterator[FlopCounterMode]:
    """A ``FlopCounterMode`` that also sees attention: the fused kernels of
    ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` have no FLOP formula, so their
    fast path is off inside (then restored); CPU scaled dot-product attention gets one."""
    kernel = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    counter = FlopCounterMode(display=False,
                              custom_mapping={} if kernel is None else {kernel: _sdpa_cpu_flop})
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    counter.mod_tracker = _NoModuleTracker()  # type: ignore[assignment]
    try:
        with counter:
            yield counter
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


class ShapesProbe(Probe[dict[str, list[LayerCall]]]):
    """Record each call's input and output shapes, output bytes and, with ``flops``, FLOPs, on
    every module and the model itself; ``flops_own`` holds per module what its calls ran
    outside any submodule call."""

    def __init__(self, model: nn.Module, *, flops: bool = True) -> None:
        self.sites = [Site(n, type(m).__name__, depth_of(n), m) for n, m in model.named_modules()]
        self.calls: dict[str, list[LayerCall]] = {}
        self.flops_own: dict[str, int] = {}
        self.flops: int | None = 0 if flops else None
        self._inputs: dict[tuple[str, int], list[list[int]]] = {}
        self._counter: FlopCounterMode | None = None
        # One entry per running call: the counter's total at entry, FLOPs of nested calls.
        self._open: list[list[int]] = []

    def step(self, step: Step) -> None:
        """One forward pass, under a FLOP counter when FLOPs are counted."""
        if self.flops is None:
            step.forward()
            return
        self._open.clear()
        with count_flops() as counter:
            self._counter = counter
            try:
                step.forward()
            finally:
                self._counter = None
        self.flops += counter.get_total_flops()

    def on_enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._inputs[call.key] = tensor_shapes((args, kwargs))
        if self._counter is not None:
            self._open.append([self._counter.get_total_flops(), 0])

    def _call_flops(self, name: str) -> int | None:
        if self._counter is None or not self._open:
            return None
        start, nested = self._open.pop()
        spent = self._counter.get_total_flops() - start
        if self._open:
            self._open[-1][1] += spent
        self.flops_own[name] = self.flops_own.get(name, 0) + spent - nested
        return spent

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        shapes = tensor_shapes(output)
        self.calls.setdefault(call.name, []).append(LayerCall(
            self._inputs.pop(call.key, []), shapes[0] if shapes else None, shapes,
            output_bytes=nbytes(output), flops=self._call_flops(call.name)))

    def finish(self) -> dict[str, list[LayerCall]]:
        return self.calls


def _leaf_bytes(model: nn.Module, calls: dict[str, list[LayerCall]]) -> int:
    """Output bytes of every call of every leaf module (one without children)."""
    leaves = [name for name, m in model.named_modules() if next(m.children(), None) is None]
    return sum(c.output_bytes for name in leaves for c in calls.get(name, []))


def model_structure(model: nn.Module, example: Any | None = None, *, max_depth: int | None = None,
                    autocast: torch.dtype | None = None) -> Structure:
    """The module tree of ``model`` with parameter counts and bytes and, given ``example`` (a
    batch: a tensor or a tuple of positional arguments), each call's shapes, output bytes and
    FLOPs from one forward pass. ``max_depth`` lists modules down to that depth only (1 = the
    model's children); counts at the cut still include everything below."""
    at_least_one("max_depth", max_depth)
    owned = _owned(model)
    ran = example is not None
    probe = ShapesProbe(model, flops=ran)
    root, *sites = probe.sites
    calls = drive(model, example, probe, autocast=autocast) if ran else {}
    shapes = tensor_shapes(example) if ran else []

    def info(site: Site) -> LayerInfo:
        own, subtree = owned[site.name]
        total, trainable = _numel(subtree), _numel(p for p in subtree if p.requires_grad)
        mine = calls.get(site.name, [])
        flops = sum(c.flops or 0 for c in mine) if ran else None
        return LayerInfo(
            name=site.name, type=site.type, depth=site.depth, params=_numel(own), params_total=total,
            trainable_params=trainable, trainable=_trainable(total, trainable), calls=mine,
            flops=flops, flops_own=probe.flops_own.get(site.name, 0) if ran else None,
            params_bytes=_dtype_bytes(own), params_bytes_total=_dtype_bytes(subtree))

    top = info(root)
    return Structure(
        root=top, layers=[info(s) for s in sites if max_depth is None or s.depth <= max_depth],
        params=top.params_total, trainable_params=top.trainable_params, modules=len(sites),
        # Per sample, without the batch dimension, as in the `stats` document.
        input_shape=shapes[0][1:] if shapes else None, flops=probe.flops,
        params_bytes=top.params_bytes_total, activation_bytes=_leaf_bytes(model, calls) if ran else None,
        input_bytes=nbytes(example) if ran else None)
