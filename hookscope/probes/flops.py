"""FLOP counting for ``layers``: PyTorch's ``FlopCounterMode`` plus what it cannot see.

The counter counts matrix products, convolutions and attention at 2 FLOPs per multiply-add.
Added here: a formula for recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` and their
cells), whose fused kernels (cuDNN's ``_cudnn_rnn``, oneDNN's) have none, so the count is the
same on every device; and a record of each operation that does multiply-adds but has no
formula (``nn.Bilinear``'s ``aten._trilinear``, FFTs, quantized kernels...), so
a call that ran one is reported as not counted instead of a silent zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["FlopCounter", "count_flops", "does_multiply_adds", "recurrent_macs"]

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
