"""The module tree of a model: names, types, parameters, per-call shapes, FLOPs and bytes.

Parameters are counted once each: a shared module appears once, and a tied parameter is owned
by the first module that holds it. Shapes come from one forward pass under ``FlopCounterMode``
(2 FLOPs per multiply-add of matrix products, convolutions and attention); a call's FLOPs are
how much its total grew between the call's two hooks, so calls keep the ``named_modules``
names (the counter's module tracker names a module registered twice, or called outside its
parent's forward, otherwise). Recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` and their
cells), whose fused kernels (cuDNN's ``_cudnn_rnn``, oneDNN's) have no formula, are counted by
formula, the same on every device; a call that ran another multiply-add operation without a
formula (``nn.Bilinear``'s ``aten._trilinear``, FFTs, quantized kernels...) has no FLOPs
(None) rather than a silent zero. Scripted submodules are listed but not hooked; lazy
parameters are counted after the forward that materialises them (None without one).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.nn.utils.rnn import PackedSequence
from torch.utils.flop_counter import FlopCounterMode

from hookscope.core.errors import at_least_one
from hookscope.core.hooks import Call, tensor_shapes, tensors
from hookscope.core.run import Probe, Step, drive
from hookscope.core.select import depth_of, hooked_sites, is_scripted, scripted_names

__all__ = ["FlopCounter", "LayerCall", "LayerInfo", "ShapesProbe", "Structure", "count_flops",
           "does_multiply_adds", "model_structure", "recurrent_macs"]

#: Operations that do multiply-adds; ``FlopCounterMode`` has formulas for some (``aten.mm``,
#: ``aten.convolution``...), and an operation here without one is "not counted".
_MAC_NAMES = frozenset({"inner", "addr", "ger", "_trilinear",
                        "addbmm", "cdist", "_cdist_forward", "_int_mm", "conv_tbc", "lstm",
                        "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell",
                        "rnn_relu_cell", "cholesky", "triangular_solve", "stft", "istft"})
_MAC_PREFIXES = ("linalg_", "_linalg_", "_fft_", "fft_", "_cudnn_rnn", "miopen_", "mkldnn_rnn",
                 "mkldnn_linear", "_thnn_fused_", "slow_conv", "_slow_conv", "conv_depthwise",
                 "_conv_depthwise", "cudnn_convolution", "mkldnn_convolution", "_scaled_dot_product",
                 "_flash_attention", "_efficient_attention", "_native_multi_head_attention",
                 "_transformer_encoder_layer", "_weight_int", "fbgemm_linear", "_sparse_addmm",
                 "_sparse_mm", "sspaddmm")
_MAC_WORDS = ("linear", "conv", "matmul")  # within quantized kernels (quantized::linear)


def does_multiply_adds(packet: Any) -> bool:
    """Whether an operation (an ``OpOverloadPacket``) is one that does multiply-adds."""
    namespace, _, name = str(getattr(packet, "_qualified_op_name", packet)).replace(
        ".", "::", 1).rpartition("::")
    if namespace in ("quantized", "_quantized", "prepacked", "onednn", "mkldnn", "xnnpack"):
        return any(word in name for word in _MAC_WORDS)
    return name in _MAC_NAMES or name.startswith(_MAC_PREFIXES)


def _rows(x: Any) -> int:
    """How many input vectors a recurrent layer consumes: every time step of every sequence
    (a packed batch holds exactly those)."""
    if isinstance(x, PackedSequence):
        return int(x.data.shape[0])
    return math.prod(x.shape[:-1]) if isinstance(x, torch.Tensor) else 0


_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def recurrent_macs(module: nn.Module, args: tuple[Any, ...],
                   kwargs: dict[str, Any] | None = None) -> int | None:
    """Multiply-adds of one call of a recurrent layer (None: not one): the input and recurrent
    matrix products per input vector, layer and direction, and an LSTM's projection. As
    element-wise work is counted nowhere, gate products and biases are not counted (an LSTM
    counts what the same LSTM built from ``nn.Linear`` would)."""
    x = args[0] if args else (kwargs or {}).get("input")
    if x is None:
        return None
    if isinstance(module, nn.RNNBase) and module.mode in _GATES:
        gates, hidden, proj = _GATES[module.mode], module.hidden_size, module.proj_size
        out, dirs = proj or hidden, 2 if module.bidirectional else 1
        per_row = sum(dirs * (gates * hidden * ((module.input_size if layer == 0 else out * dirs)
                                                + out) + proj * hidden)
                      for layer in range(module.num_layers))
        return _rows(x) * per_row
    cells = {nn.LSTMCell: 4, nn.GRUCell: 3, nn.RNNCell: 1}
    gates_of = next((g for kind, g in cells.items() if isinstance(module, kind)), None)
    if gates_of is None:
        return None
    cell: nn.RNNCellBase = module  # type: ignore[assignment]
    return _rows(x) * gates_of * cell.hidden_size * (cell.input_size + cell.hidden_size)


def _sdpa_cpu_flop(query_shape: list[int], key_shape: list[int], value_shape: list[int],
                   *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """``softmax(q k^T) v``: two batched matmuls, 2 FLOPs per multiply-add, as FlopCounterMode
    counts its other attention kernels (the causal mask ignored)."""
    batch_heads, queries, dim = math.prod(query_shape[:-2]), query_shape[-2], query_shape[-1]
    keys, value_dim = key_shape[-2], value_shape[-1]
    return 2 * batch_heads * queries * keys * (dim + value_dim)


def _elements_flop(shape: list[int], *args: Any, **kwargs: Any) -> int:
    """A matrix-vector or dot product: one multiply-add per element of the first operand."""
    return 2 * math.prod(shape)


class _NoModuleTracker(nullcontext):
    """Stands in for ``FlopCounterMode``'s module tracker (every FLOP goes to ``Global``),
    whose table is never read and whose multi-grad hooks fail in inference mode on a
    parameter passed straight to a submodule, as timm's CaiT passes its class token."""

    parents = frozenset({"Global"})


class FlopCounter(FlopCounterMode):
    """A ``FlopCounterMode`` that calls ``on_uncounted(name)`` for every operation that
    does multiply-adds and has no formula (its FLOPs stay uncounted)."""

    def __init__(self, on_uncounted: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_uncounted = on_uncounted

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        if func_packet not in self.flop_registry and does_multiply_adds(func_packet):
            self.on_uncounted(str(func_packet))
        return super()._count_flops(func_packet, out, args, kwargs)


@contextmanager
def count_flops(on_uncounted: Callable[[str], None]) -> Iterator[FlopCounter]:
    """A FLOP counter that also sees attention: the fused kernels of
    ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` have no FLOP formula, so their
    fast path is off inside (then restored); CPU scaled dot-product attention gets one, and so
    do matrix-vector and dot products (``torch.mv``, ``a @ v`` with a 1-D ``v``)."""
    aten = torch.ops.aten
    mapping: dict[Any, Any] = {aten.mv: _elements_flop, aten.dot: _elements_flop,
                               aten.vdot: _elements_flop,
                               aten.addmv: lambda bias, mat, *a, **k: _elements_flop(mat)}
    kernel = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if kernel is not None:
        mapping[kernel] = _sdpa_cpu_flop
    counter = FlopCounter(on_uncounted, display=False, custom_mapping=mapping)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    counter.mod_tracker = _NoModuleTracker()  # type: ignore[assignment]
    try:
        with counter:
            yield counter
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


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
    of a module. ``uncounted_ops`` names the multiply-add operations without a FLOP formula
    that ran in the call; with any, ``flops`` is None and ``macs_counted`` False."""

    input_shapes: list[list[int]]
    output_shape: list[int] | None
    output_shapes: list[list[int]]
    flops: int | None = None
    macs: int | None = field(init=False)
    output_bytes: int = 0
    uncounted_ops: list[str] = field(default_factory=list)
    macs_counted: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "macs", _macs(self.flops))
        object.__setattr__(self, "macs_counted", not self.uncounted_ops)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LayerInfo:
    """One module: its own and subtree parameter counts, trainability and calls.

    ``trainable`` is True, False, ``"partial"``, or None when the subtree has no parameter.
    ``flops`` sums its calls, ``flops_own`` only what ran outside any submodule call (None: no
    forward pass ran, or an operation without a formula ran; ``macs_counted`` says which).
    Parameter bytes are by dtype name, owned and of the subtree (``_total``). Parameter counts
    are None while a lazy parameter is uninitialised; ``scripted`` modules are not hooked.
    """

    name: str
    type: str
    depth: int
    params: int | None
    params_total: int | None
    trainable_params: int | None
    trainable: bool | str | None
    calls: list[LayerCall] = field(default_factory=list)
    flops: int | None = None
    macs: int | None = field(init=False)
    flops_own: int | None = None
    macs_own: int | None = field(init=False)
    params_bytes: dict[str, int] = field(default_factory=dict)
    params_bytes_total: dict[str, int] = field(default_factory=dict)
    macs_counted: bool | None = None
    buffers: int | None = 0
    buffers_total: int | None = 0
    scripted: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "macs", _macs(self.flops))
        object.__setattr__(self, "macs_own", _macs(self.flops_own))

    def to_dict(self) -> dict[str, Any]:
        # The subtree's trainable count is in the totals only.
        return {k: v for k, v in asdict(self).items() if k != "trainable_params"}


@dataclass(frozen=True)
class Structure:
    """What :func:`model_structure` returns: the model itself (``root``, whose empty name
    cannot be selected) and every other module in definition order (``layers``, cut at
    ``max_depth``). Totals cover the whole model; ``flops``, ``activation_bytes`` (outputs of
    every leaf call) and ``input_bytes`` are for the example batch, None without one (and
    ``flops`` None when ``uncounted_ops`` names operations without a formula, each with the
    modules that ran it).
    """

    root: LayerInfo
    layers: list[LayerInfo]
    params: int | None
    trainable_params: int | None
    modules: int
    input_shape: list[int] | None
    flops: int | None = None
    params_bytes: dict[str, int] = field(default_factory=dict)
    activation_bytes: int | None = None
    input_bytes: int | None = None
    forward: bool = True
    train_mode: bool = False
    uncounted_ops: dict[str, list[str]] = field(default_factory=dict)
    scripted: list[str] = field(default_factory=list)
    uninitialised: list[str] = field(default_factory=list)
    buffers: int | None = 0
    buffers_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        counted = None if not self.forward else not self.uncounted_ops
        totals = {"params": self.params, "trainable_params": self.trainable_params, "modules": self.modules,
                  "flops": self.flops, "macs": _macs(self.flops), "params_bytes": self.params_bytes,
                  "activation_bytes": self.activation_bytes, "input_bytes": self.input_bytes,
                  "macs_counted": counted, "uncounted_ops": self.uncounted_ops,
                  "buffers": self.buffers, "buffers_bytes": self.buffers_bytes,
                  "scripted": self.scripted, "uninitialised": self.uninitialised}
        return {"input_shape": self.input_shape, "forward": self.forward,
                "train_mode": self.train_mode, "root": self.root.to_dict(),
                "layers": [layer.to_dict() for layer in self.layers], "totals": totals}


def _trainable(params: list[torch.Tensor]) -> bool | str | None:
    """Whether the parameters holding values require a gradient: True, False, ``"partial"``,
    or None for none (while one is lazy, all count: the flags are known before the sizes)."""
    lazy = any(is_lazy(p) for p in params)
    flags = {p.requires_grad for p in params if lazy or p.numel()}
    return None if not flags else flags.pop() if len(flags) == 1 else "partial"


Owned = dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]]


def _owned(model: nn.Module, buffers: bool = False) -> Owned:
    """Per module name: the parameters (or buffers) it owns and those of its subtree. The
    first module (in ``named_modules`` order) that holds one owns it, so shared ones are owned
    once."""
    seen: set[int] = set()
    found: Owned = {}
    for name, module in model.named_modules():
        mine = module.buffers(recurse=False) if buffers else module.parameters(recurse=False)
        own = [p for p in mine if id(p) not in seen]
        seen.update(id(p) for p in own)
        # module.parameters() deduplicates within the subtree, as model.parameters() does.
        found[name] = (own, list(module.buffers() if buffers else module.parameters()))
    return found


def _numel(params: Iterable[torch.Tensor]) -> int | None:
    """None while a parameter is lazy (not yet initialised)."""
    params = list(params)
    return None if any(is_lazy(p) for p in params) else sum(p.numel() for p in params)


def _dtype_bytes(params: Iterable[torch.Tensor]) -> dict[str, int]:
    found: Counter[str] = Counter()
    for p in params:
        if not is_lazy(p):
            found[str(p.dtype).removeprefix("torch.")] += p.numel() * p.element_size()
    return dict(sorted(found.items()))


class ShapesProbe(Probe[dict[str, list[LayerCall]]]):
    """Record each call's input and output shapes, output bytes and FLOPs, on every module
    and the model itself; ``flops_own`` holds per module what its calls ran outside any
    submodule call, ``uncounted`` per operation without a formula the modules that ran it
    (the innermost hooked module; ``""``: the model's own code)."""

    def __init__(self, model: nn.Module) -> None:
        self.sites = hooked_sites(model)
        self.calls: dict[str, list[LayerCall]] = {}
        self.flops_own: dict[str, int] = {}
        self.own_uncounted: set[str] = set()
        self.uncounted: dict[str, set[str]] = {}
        self.flops = 0
        self._inputs: dict[tuple[str, int], list[list[int]]] = {}
        self._total = lambda: 0
        self._extra = [0]  # what formulas add to the counter's total, in this pass
        # The pass's uncounted operations: (operation, innermost running call's name).
        self._ops: list[tuple[str, str]] = []
        # One entry per running call: counter total at entry, FLOPs of nested calls, the
        # number of uncounted operations at entry.
        self._open: list[list[int]] = []
        self._names: list[str] = []

    def step(self, step: Step) -> None:
        self._open.clear()
        self._names.clear()
        self._ops.clear()
        extra = self._extra = [0]
        with count_flops(self._uncounted) as counter:
            self._total = lambda: counter.get_total_flops() + extra[0]
            try:
                step.forward()
            finally:
                self._total = lambda: 0
        self.flops += counter.get_total_flops() + extra[0]
        for op, name in self._ops:
            self.uncounted.setdefault(op, set()).add(name)

    def _uncounted(self, op: str) -> None:
        self._ops.append((op, self._names[-1] if self._names else ""))

    def on_enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._inputs[call.key] = tensor_shapes((args, kwargs))
        self._open.append([self._total(), 0, len(self._ops)])
        self._names.append(call.name)

    def _call_flops(self, call: Call, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> tuple[int | None, list[str]]:
        """The call's FLOPs (None: not counted) and the uncounted operations it ran."""
        if not self._open:
            return None, []
        start, nested, first = self._open.pop()
        self._names.pop()
        spent = self._total() - start
        formula = recurrent_macs(call.site.module, args, kwargs)
        if formula is not None:  # replaces what the counter saw, if anything
            self._extra[0] += 2 * formula - spent
            spent = 2 * formula
            del self._ops[first:]
        if self._open:
            self._open[-1][1] += spent
        name = call.name
        self.flops_own[name] = self.flops_own.get(name, 0) + spent - nested
        if any(who == name for _, who in self._ops[first:]):
            self.own_uncounted.add(name)
        ops = sorted({op for op, _ in self._ops[first:]})
        return (None if ops else spent), ops

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        shapes = tensor_shapes(output)
        flops, ops = self._call_flops(call, args, kwargs)
        self.calls.setdefault(call.name, []).append(LayerCall(
            self._inputs.pop(call.key, []), shapes[0] if shapes else None, shapes,
            output_bytes=nbytes(output), flops=flops, uncounted_ops=ops))

    def finish(self) -> dict[str, list[LayerCall]]:
        return self.calls


def _leaf_bytes(model: nn.Module, calls: dict[str, list[LayerCall]]) -> int:
    leaves = [name for name, m in model.named_modules() if next(m.children(), None) is None]
    return sum(c.output_bytes for name in leaves for c in calls.get(name, []))


def _type_name(module: nn.Module) -> str:
    """The class name; a scripted module's is the class it was scripted from."""
    return str(getattr(module, "original_name", "") or type(module).__name__) \
        if is_scripted(module) else type(module).__name__


def model_structure(model: nn.Module, example: Any | None = None, *, max_depth: int | None = None,
                    autocast: torch.dtype | None = None, train_mode: bool = False) -> Structure:
    """The module tree of ``model`` with parameter counts and bytes and, given ``example`` (a
    batch: a tensor or a tuple of positional arguments), each call's shapes, output bytes and
    FLOPs from one forward pass (in train mode with ``train_mode``). ``max_depth`` lists
    modules down to that depth only (1 = the model's children); counts at the cut still
    include everything below. Parameters are counted after the forward, which materialises
    lazy ones; without ``example`` an uninitialised one makes the counts that hold it None."""
    at_least_one("max_depth", max_depth)
    ran = example is not None
    probe = ShapesProbe(model)
    calls = drive(model, example, probe, autocast=autocast, train_mode=train_mode) if ran else {}
    shapes = tensor_shapes(example) if ran else []
    owned, buffers = _owned(model), _owned(model, buffers=True)
    scripted = scripted_names(model)

    def info(name: str, module: nn.Module) -> LayerInfo:
        own, subtree = owned[name]
        mine = calls.get(name, [])
        counted = all(c.macs_counted for c in mine)
        flops = sum(c.flops or 0 for c in mine) if ran and counted else None
        own_flops = probe.flops_own.get(name, 0) if ran and name not in probe.own_uncounted else None
        return LayerInfo(
            name=name, type=_type_name(module), depth=depth_of(name), params=_numel(own),
            params_total=_numel(subtree), trainable_params=_numel(p for p in subtree if p.requires_grad),
            trainable=_trainable(subtree), calls=mine, flops=flops, flops_own=own_flops,
            params_bytes=_dtype_bytes(own), params_bytes_total=_dtype_bytes(subtree),
            macs_counted=counted if ran else None, buffers=_numel(buffers[name][0]),
            buffers_total=_numel(buffers[name][1]),
            scripted=any(name == s or name.startswith(s + ".") or not s for s in scripted))

    top, *rest = (info(n, m) for n, m in model.named_modules())
    return Structure(
        root=top, layers=[r for r in rest if max_depth is None or r.depth <= max_depth],
        params=top.params_total, trainable_params=top.trainable_params, modules=len(rest),
        # Per sample, without the batch dimension, as in the `stats` document.
        input_shape=shapes[0][1:] if shapes else None,
        flops=probe.flops if ran and not probe.uncounted else None,
        params_bytes=top.params_bytes_total, activation_bytes=_leaf_bytes(model, calls) if ran else None,
        input_bytes=nbytes(example) if ran else None, forward=ran, train_mode=train_mode and ran,
        uncounted_ops={op: sorted(names) for op, names in sorted(probe.uncounted.items())},
        scripted=scripted, uninitialised=[n for n, p in model.named_parameters() if is_lazy(p)],
        buffers=top.buffers_total, buffers_bytes=sum(_dtype_bytes(buffers[""][1]).values()))
