"""Which dimension of a module's output holds its channels, which outputs are image grids,
and how to bring those to (N, C, h, w).

For an H x W input, a grid is ``(N, C, h, w)`` or ``(N, h, w, C)`` with the input's aspect,
or ``(N, tokens, C)``: a few prefix tokens (CLS, registers) then an h x w patch grid for an
integer stride. Anything else, attention matrices included, is refused with a reason.

For a 1-D signal ``(N, C, L)`` or a volume or clip ``(N, C, D, H, W)`` input, a map is an
output of the same rank with its channels first: ``(N, C, l)`` or ``(N, C, d, h, w)``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Layout", "TokenHint", "channel_dim", "extent", "layout", "signal_model", "token_hint"]

#: Parameters that add prefix tokens before the patch grid (their dimension 1 counts them).
PREFIX_PARAMS = frozenset({"cls_token", "class_token", "dist_token", "distillation_token",
                           "register_tokens", "reg_token"})
#: Modules whose output keeps its channels (features) last at any rank, by the end of the
#: class name (``LazyLinear``, ``Bilinear``, ``NonDynamicallyQuantizableLinear``, ...).
CHANNELS_LAST = ("Linear", "Embedding", "LayerNorm", "RMSNorm", "MultiheadAttention")
#: 3-D outputs of these are (N, C, L), not tokens (``ConvTranspose1d``, ``MaxPool1d``, ...).
CHANNELS_FIRST_1D = ("Conv1d", "BatchNorm1d", "InstanceNorm1d", "Pool1d", "Pad1d", "Upsample")


@dataclass(frozen=True)
class TokenHint:
    """What the model says about its tokens: ``prefix`` tokens before the patch grid (None:
    no token parameters), its ``patch`` size, and whether its 4-D outputs are
    ``channels_last`` where both readings fit (torchvision's Swin)."""

    prefix: int | None = None
    patch: int | None = None
    channels_last: bool = False


def _patch(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for value in (getattr(config, "patch_size", None), getattr(model, "patch_size", None),
                  getattr(getattr(model, "patch_embed", None), "patch_size", None)):
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, int) and value > 0:
            return value
    return None


def token_hint(model: nn.Module) -> TokenHint:
    """The prefix tokens and patch size of ``model``, from its parameters and config."""
    prefix = None
    for name, param in model.named_parameters():
        if name.rsplit(".", 1)[-1] in PREFIX_PARAMS and param.dim() == 3:
            prefix = (prefix or 0) + int(param.shape[1])
    kind = type(model)
    last = kind.__module__.startswith("torchvision.") and "Swin" in kind.__name__
    return TokenHint(prefix, _patch(model), last)


@dataclass(frozen=True)
class Layout:
    """How an output lies on the h x w image grid: ``kind`` is ``nchw``, ``nhwc`` or
    ``tokens`` (``(N, prefix + h*w, C)``); or on a signal's or volume's grid: ``ncl``
    (``(N, C, l)``, ``h`` 1 and ``w`` l) or ``ncdhw`` (``(N, C, d, h, w)``); ``extent`` is the
    grid's own size, (h, w), (l,) or (d, h, w)."""

    kind: str
    h: int
    w: int
    prefix: int = 0
    extent: tuple[int, ...] = ()

    @property
    def channel_dim(self) -> int:
        """The dimension holding the channels, in the module's own output."""
        return {"nchw": 1, "nhwc": 3, "tokens": 2, "ncl": 1, "ncdhw": 1}[self.kind]

    @property
    def grid(self) -> tuple[int, ...]:
        """The map's size: (h, w), (l,) or (d, h, w)."""
        return self.extent or (self.h, self.w)

    def to_nchw(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (this layout, or its gradient) with its channels first: (N, C, h, w) (the
        prefix tokens dropped), or as it is for ``ncl`` and ``ncdhw``."""
        if self.kind in ("ncl", "ncdhw"):
            return t
        if self.kind == "tokens":
            t = t[:, self.prefix:].reshape(t.shape[0], self.h, self.w, t.shape[2])
        return t if self.kind == "nchw" else t.permute(0, 3, 1, 2)


def signal_model(model: nn.Module) -> bool:
    """Whether ``model`` has a 1-d convolution (a class name ending in ``Conv1d`` or
    ``ConvTranspose1d``): its 3-D float inputs are signals (N, C, L), not tokens (N, T, F)."""
    return any(type(m).__name__.endswith(("Conv1d", "ConvTranspose1d")) for m in model.modules())


def extent(x: torch.Tensor | None) -> tuple[int, ...]:
    """The grid a batch's maps lie on: (L,) of a signal batch (N, C, L), (D, H, W) of a volume
    or clip (N, C, D, H, W), (H, W) of an image batch; () for no tensor of three dimensions."""
    if x is None or x.dim() < 3:
        return ()
    return tuple(int(v) for v in x.shape[2:]) if x.dim() in (3, 5) else \
        (int(x.shape[-2]), int(x.shape[-1]))


def _grid_nd(shape: Sequence[int], size: Sequence[int], type_name: str,
             force: str) -> Layout | str:
    """An output on the grid of a signal (``size`` (L,)) or volume (``size`` (D, H, W))."""
    names = "(N, C, L)" if len(size) == 1 else "(N, C, D, H, W)"
    if len(shape) != len(size) + 2:
        return f"it is {len(shape)}-D {list(shape)}, not {names} as the input is"
    if type_name.endswith(CHANNELS_LAST) or force in ("vit", "swin"):
        return (f"it has its channels last ({type_name or force} output), not the input's "
                f"channels-first {names}")
    grid = tuple(int(v) for v in shape[2:])
    if math.prod(grid) <= 1:
        return "its spatial size is 1, so there is nowhere to point at"
    if len(grid) == 1:
        return Layout("ncl", 1, grid[0], extent=grid)
    return Layout("ncdhw", grid[1], grid[2], extent=grid)


def _fits(h: int, w: int, size: tuple[int, int]) -> bool:
    """An h x w map has the aspect of a ``size`` input (rounding allowed)."""
    big_h, big_w = size
    if h * w <= 1 or min(size) <= 0:
        return False
    return abs(w - h * big_w / big_h) <= 1 + 0.15 * w and abs(h - w * big_h / big_w) <= 1 + 0.15 * h


def _token_grid(count: int, size: tuple[int, int]) -> tuple[int, int] | None:
    """(h, w) with h*w == count for an integer stride of the input, or None."""
    big_h, big_w = size
    for stride in range(1, max(big_h, big_w) + 1):
        for h, w in ((big_h // stride, big_w // stride),
                     (-(-big_h // stride), -(-big_w // stride))):
            if h * w == count and h * w > 1:
                return h, w
        if (big_h // stride) * (big_w // stride) < count:
            break
    return None


def _tokens(shape: Sequence[int], size: tuple[int, int], hint: TokenHint) -> Layout | str:
    count = shape[1]
    prefixes = dict.fromkeys([hint.prefix, 0] if hint.prefix is not None else [0, 1])
    for prefix in prefixes:
        grid = _token_grid(count - prefix, size)
        if grid is not None:
            return Layout("tokens", grid[0], grid[1], prefix)
    if min(size) <= 0:  # token ids, a signal: no image whose patches they could be
        return f"its {count} tokens are not image patches (the input has no image grid)"
    tried = " or ".join(map(str, prefixes))
    return (f"its {count} tokens are not the patch grid of a {size[0]}x{size[1]} input after "
            f"{tried} prefix token(s)")


def _attention(shape: Sequence[int], size: tuple[int, int], hint: TokenHint) -> bool:
    """Whether ``shape`` is (N, heads, tokens, tokens) for the model's token count."""
    if hint.prefix is None or not hint.patch:
        return False
    grid = (size[0] // hint.patch) * (size[1] // hint.patch)
    return shape[2] == shape[3] and shape[2] in (grid, grid + hint.prefix) and \
        shape[2] != size[0] // hint.patch


def layout(shape: Sequence[int], size: Sequence[int], *, type_name: str = "",
           hint: TokenHint | None = None, force: str = "auto") -> Layout | str:
    """How an output of ``shape`` lies on the grid of an input of ``size`` (H, W), or why
    it does not. ``type_name`` is the module's class (channels-last ones prefer ``nhwc``);
    ``force`` is ``auto``, ``none`` (only nchw), ``vit`` (only tokens) or ``swin`` (only nhwc).
    A ``size`` (L,) or (D, H, W) (:func:`extent` of a signal or volume batch) places it by
    the channels-first rule of that input."""
    if len(size) in (1, 3):
        return _grid_nd(shape, size, type_name, force)
    size = (int(size[0]), int(size[1]))
    hint = hint or TokenHint()
    dims = len(shape)
    if dims == 3 and force in ("auto", "vit") and not type_name.endswith(CHANNELS_FIRST_1D):
        return _tokens(shape, size, hint)
    if dims == 3:
        return ("it is a token sequence (N, tokens, C); read it as tokens (reshape vit)"
                if force == "none" else f"it is 3-D {list(shape)}, not (N, tokens, C)")
    if dims < 3:
        return "it has no spatial dimensions"
    if dims != 4 or force == "vit":
        return (f"it is {dims}-D; a map needs (N, C, H, W), (N, H, W, C) or tokens "
                "(N, tokens, C)")
    if force == "auto" and _attention(shape, size, hint):
        return "it is an attention matrix (N, heads, tokens, tokens), not an image grid"
    nchw = force in ("auto", "none") and _fits(shape[2], shape[3], size)
    nhwc = force in ("auto", "swin") and _fits(shape[1], shape[2], size)
    last = hint.channels_last or type_name.endswith(CHANNELS_LAST)
    if nhwc and (last or not nchw):
        return Layout("nhwc", shape[1], shape[2])
    if nchw:
        return Layout("nchw", shape[2], shape[3])
    if math.prod(shape[2:]) <= 1 or (force == "swin" and shape[1] * shape[2] <= 1):
        return "its spatial size is 1x1, so there is nowhere to point at"
    return (f"neither {shape[2]}x{shape[3]} (N, C, H, W) nor {shape[1]}x{shape[2]} "
            f"(N, H, W, C) is a grid of the {size[0]}x{size[1]} input (heads x tokens?)")


def channel_dim(shape: Sequence[int], type_name: str, size: Sequence[int] | None = None,
                hint: TokenHint | None = None) -> int | None:
    """The dimension holding the channels of an output (None: the output is one channel).

    The rules are in docs/stats.md. With the input's ``size`` (H, W), a 4-D output is placed
    by :func:`layout`, so a channels-last (N, H, W, C) output of any module has its channels last.
    With a signal's ``size`` (L,) or a volume's (D, H, W), an output of the input's rank has
    its channels first (an activation after a Conv1d too), unless its module keeps them last.
    """
    rank = len(shape)
    if rank < 2:
        return None
    if size is not None and len(size) in (1, 3) and rank == len(size) + 2:
        return rank - 1 if type_name.endswith(CHANNELS_LAST) else 1
    if rank == 3:
        return 1 if type_name.endswith(CHANNELS_FIRST_1D) else 2
    if rank == 4 and size is not None and min(size) > 0:
        found = layout(list(shape), size, type_name=type_name, hint=hint)
        if isinstance(found, Layout):
            return found.channel_dim
    return rank - 1 if type_name.endswith(CHANNELS_LAST) else 1
