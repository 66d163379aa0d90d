"""A vision transformer's attention probabilities, captured by hooks, and the two maps made
from them: attention rollout and gradient-weighted attention relevance.

The probabilities are timm's ``attn_drop`` output (``fused_attn`` off for the pass), torch
``nn.MultiheadAttention``'s second output (asked for per head by a pre-hook), or a Hugging
Face ``*Attention``'s second output (the config set to ``eager`` for the pass): fused SDPA
returns none. The model is left as it was found. Either map is the class token's row over
the patch tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hookscope.cam.methods import PLAIN
from hookscope.cam.passes import Pass, Switch, or_zeros
from hookscope.cam.targets import Focus, Objective
from hookscope.core.errors import HookscopeError, param
from hookscope.core.hooks import Call
from hookscope.core.run import Step
from hookscope.core.select import Site, all_sites
from hookscope.numerics.layout import Layout, layout

__all__ = ["FUSIONS", "AttentionPass", "Attentions", "attention_sites", "eager_attention"]

#: ``head_fusion``'s choices, each a reduction over the heads.
FUSIONS = {"mean": "mean", "max": "amax", "min": "amin"}
#: Hugging Face attention modules hold their query projection under one of these names.
_HF_QUERY = ("q_proj", "query")


def _kind(module: nn.Module) -> str | None:
    """``timm``, ``torch`` or ``hf`` for a module whose probabilities can be captured."""
    if isinstance(module, nn.MultiheadAttention):
        return "torch"
    if hasattr(module, "fused_attn") and isinstance(getattr(module, "attn_drop", None),
                                                    nn.Module):
        return "timm"
    if hasattr(module, "config") and type(module).__name__.endswith("Attention") and \
            any(isinstance(getattr(module, q, None), nn.Linear) for q in _HF_QUERY):
        return "hf"
    return None


def attention_sites(model: nn.Module) -> list[tuple[Site, str]]:
    """The site whose output holds each attention module's probabilities, with its kind
    (HookscopeError if there is none)."""
    sites = {s.name: s for s in all_sites(model)}
    found = []
    for name, module in model.named_modules():
        kind = _kind(module)
        if kind == "timm":
            found.append((sites[f"{name}.attn_drop"], kind))
        elif kind is not None and name in sites:
            found.append((sites[name], kind))
    if not found:
        raise HookscopeError(
            f"{type(model).__name__} has no attention module hookscope can read (timm's "
            "Attention, torch's MultiheadAttention or a Hugging Face *Attention); rollout and "
            "attention-grad are for vision transformers.")
    return found


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Every attention module on its path that computes the probabilities, for a while."""
    modules: list[Any] = list(model.modules())
    fused = [m for m in modules if _kind(m) == "timm" and m.fused_attn]
    configs = list({id(m.config): m.config for m in modules if _kind(m) == "hf"}.values())
    before = [c._attn_implementation for c in configs]
    try:
        for m in fused:
            m.fused_attn = False
        for c in configs:
            c._attn_implementation = "eager"
        yield
    finally:
        for m in fused:
            m.fused_attn = True
        for c, value in zip(configs, before, strict=True):
            c._attn_implementation = value


@dataclass(frozen=True)
class Attentions:
    """One pass's attention probabilities per layer, (N, heads, T, T), with the gradients of
    the summed target scores (attention-grad only); ``prefix`` tokens (the class token
    first) come before the patch ``grid`` (h, w)."""

    probs: list[torch.Tensor]
    grads: list[torch.Tensor] | None
    prefix: int
    grid: tuple[int, int]
    fusion: str = "mean"
    discard: float = 0.0

    def to_map(self, matrix: torch.Tensor) -> torch.Tensor:
        """The class token's row of ``matrix`` over the patch tokens, (N, h, w)."""
        row = matrix[:, 0, self.prefix:]
        return row.reshape(row.shape[0], *self.grid)

    def rollout(self) -> torch.Tensor:
        """Attention rollout (Abnar & Zuidema, 2020): the fused heads, their lowest ``discard``
        fraction dropped, 0.5 A + 0.5 I with rows normalised, multiplied through: (N, h, w)."""
        result: torch.Tensor | None = None
        for probs in self.probs:
            fused = getattr(probs.double(), FUSIONS[self.fusion])(dim=1)
            if self.discard > 0:
                flat = fused.flatten(1)
                lowest = flat.topk(int(flat.shape[1] * self.discard), dim=1, largest=False)
                drop = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, lowest.indices, True)
                drop[:, 0] = False  # the class token's attention to itself stays
                fused = flat.masked_fill(drop, 0.0).reshape(fused.shape)
            eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
            step = 0.5 * fused + 0.5 * eye
            step = step / step.sum(dim=-1, keepdim=True)
            result = step if result is None else step @ result
        assert result is not None
        return self.to_map(result).float()

    def relevance(self) -> torch.Tensor:
        """Chefer, Gur & Wolf (2021): R = I, plus ``mean_heads((grad A * A)+) @ R`` per layer:
        (N, h, w)."""
        assert self.grads is not None
        first = self.probs[0]
        eye = torch.eye(first.shape[-1], dtype=torch.float64, device=first.device)
        r = eye.expand(first.shape[0], -1, -1).clone()
        for probs, grads in zip(self.probs, self.grads, strict=True):
            cam = (grads.double() * probs.double()).clamp(min=0).mean(dim=1)
            r = r + cam @ r
        return self.to_map(r).float()


class AttentionPass(Pass):
    """The rollout's pass: every attention module's probabilities, asked for and kept
    (HookscopeError for bad rollout options or a model without a known attention module)."""

    def __init__(self, switch: Switch[Any], objective: Objective, model: nn.Module, hint: Any,
                 fusion: str, discard: float) -> None:
        if fusion not in FUSIONS:
            raise HookscopeError(f"{param('head_fusion')} {fusion!r}: choose one of "
                                 f"{', '.join(FUSIONS)}.")
        if not 0.0 <= discard < 1.0:
            raise HookscopeError(f"{param('discard_ratio')} must be in [0, 1), not {discard}.")
        super().__init__(switch, objective)
        self.model, self.hint, self.rollout = model, hint, (fusion, discard)
        found = attention_sites(model)
        self.kinds = {id(site.module): kind for site, kind in found}
        self.sites = [site for site, _ in found]
        self.probs: list[torch.Tensor] = []

    def on_enter(self, call: Call, kwargs: dict[str, Any]) -> None:
        if self.kinds.get(id(call.site.module)) == "torch":  # its per-head probabilities
            kwargs["need_weights"] = True
            kwargs["average_attn_weights"] = False

    def on_exit(self, call: Call, output: Any) -> Any:
        kind = self.kinds.get(id(call.site.module))
        if kind is None:
            return None
        found = output if kind == "timm" else output[1] if isinstance(output, (tuple, list)) \
            and len(output) > 1 else None
        if isinstance(found, torch.Tensor) and found.dim() == 4:  # (N, heads, T, T)
            self.probs.append(found)
        return None

    def run(self, step: Step, x: torch.Tensor, focus: Focus, gradients: bool) -> Attentions:
        """One pass's attention probabilities on ``x``'s patch grid (with ``gradients``, the
        summed target scores' gradients with respect to them).

        Raises:
            HookscopeError: no probabilities, attention that is not global, or tokens that are
                not a patch grid of ``x``.
        """
        self.probs = []
        with self.switch.running(self), eager_attention(self.model):
            out = self.objective.output(step.forward(x, grad="grad" if gradients else PLAIN))
        probs, self.probs = self.probs, []
        if not probs:
            raise HookscopeError("No attention module returned its probabilities during the "
                                 "forward pass.")
        # Every layer must attend over the same tokens, one matrix per input.
        shapes = sorted({(int(p.shape[0]), *map(int, p.shape[-2:])) for p in probs})
        if len(shapes) != 1 or shapes[0][0] != len(x) or shapes[0][1] != shapes[0][2]:
            raise HookscopeError(
                "rollout and attention-grad need global self-attention over the same tokens in "
                f"every block; this model's attention matrices are {shapes} (batch, queries, "
                f"keys) for a batch of {len(x)} ({self._unlike(shapes, x)}).")
        grads = self._gradients(probs, out, focus) if gradients else None
        grid = self._grid(x, probs[0].shape[-1])
        if not isinstance(grid, Layout):
            raise HookscopeError(f"The attention is over tokens that are not a patch grid: {grid}.")
        return Attentions([p.detach() for p in probs], grads, grid.prefix, (grid.h, grid.w),
                          *self.rollout)

    def _grid(self, x: torch.Tensor, tokens: int) -> Layout | str:
        """The layout of ``tokens`` tokens over the patches of ``x``."""
        return layout([len(x), tokens, 1], (int(x.shape[-2]), int(x.shape[-1])), hint=self.hint,
                      force="vit")

    def _unlike(self, shapes: list[tuple[int, ...]], x: torch.Tensor) -> str:
        """Why the attention matrices differ: fewer queries than keys is a pooling head's."""
        queries = min(q for _, q, k in shapes)
        if queries >= max(k for _, q, k in shapes):
            return "windowed or reduced attention, as in Swin or SegFormer"
        grid = self._grid(x, max(k for _, _, k in shapes))
        none = ", and no class token to read the maps from" \
            if isinstance(grid, Layout) and grid.prefix == 0 else ""
        return (f"an attention-pooling head: {queries} learned quer{'y' if queries == 1 else 'ies'} "
                f"over the tokens, as in SigLIP{none}")

    def _gradients(self, probs: list[torch.Tensor], out: Any, focus: Focus
                   ) -> list[torch.Tensor]:
        # torch's MultiheadAttention returns a per-head view of the matrix it used: take the
        # gradient at that matrix.
        nodes = [p._base if p._base is not None and p._base.numel() == p.numel() else p
                 for p in probs]
        grads = self.grads(out, focus, nodes) or [None] * len(probs)
        return [or_zeros(g, p).reshape(p.shape) for g, p in zip(grads, probs, strict=True)]
