"""The CAM method registry: one small function per method, registered by name.

Each method turns the target layer's activations ``A`` (N, C, h, w) and, for gradient
methods, the gradients ``G`` of the summed target logits with respect to them into an
(N, h, w) map *before* the ReLU. The formulas follow pytorch-grad-cam, the implementation
users compare against; the engine in :mod:`hookscope.cam` applies the ReLU and normalises.

This module imports torch only inside the methods that need a torch function, so the CLI
can read the method names for ``--method`` without loading torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["CamInputs", "Method", "METHODS", "get_method", "method_names", "register"]


@dataclass
class CamInputs:
    """What a method may use: activations, gradients and, for ScoreCAM, the model."""

    acts: torch.Tensor
    grads: torch.Tensor | None
    x: torch.Tensor
    targets: list[int]
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None
    score_batch: int = 32


CamFn = Callable[[CamInputs], "torch.Tensor"]


@dataclass(frozen=True)
class Method:
    """A registered CAM method."""

    name: str
    fn: CamFn
    gradients: bool
    summary: str


METHODS: dict[str, Method] = {}


def register(name: str, *, gradients: bool = True, summary: str = "") -> Callable[[CamFn], CamFn]:
    """Register ``fn`` as the CAM method ``name``; a duplicate name is a programming error."""

    def wrap(fn: CamFn) -> CamFn:
        if name in METHODS:
            raise ValueError(f"CAM method {name!r} is already registered")
        METHODS[name] = Method(name, fn, gradients, summary or (fn.__doc__ or "").split("\n")[0])
        return fn

    return wrap


def method_names() -> list[str]:
    """Registered method names, in registration order."""
    return list(METHODS)


def get_method(name: str) -> Method:
    """The method called ``name``.

    Raises:
        HookscopeError: unknown name, with the close matches.
    """
    from hookscope.errors import HookscopeError, suggest

    try:
        return METHODS[name.strip().lower()]
    except KeyError:
        raise HookscopeError(
            f"Unknown CAM method {name!r}.{suggest(name, METHODS)} Choose from: "
            f"{', '.join(METHODS)}."
        ) from None


def _spatial_sum(t: torch.Tensor) -> torch.Tensor:
    return t.sum(dim=(2, 3), keepdim=True)


def _weighted(weights: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
    """sum_c w[n, c] * A[n, c] as one batched matrix product."""
    n, c, h, w = acts.shape
    return (weights.reshape(n, 1, c) @ acts.reshape(n, c, h * w)).reshape(n, h, w)


def _grads(inp: CamInputs) -> torch.Tensor:
    if inp.grads is None:  # pragma: no cover - the engine always passes them
        raise ValueError("this method needs gradients")
    return inp.grads


@register("gradcam", summary="Grad-CAM: channels weighted by their mean gradient.")
def gradcam(inp: CamInputs) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al.): w_c = mean over positions of dS/dA_c."""
    return _weighted(_grads(inp).mean(dim=(2, 3)), inp.acts)


@register("gradcam++", summary="Grad-CAM++: positive gradients weighted by eq. 19.")
def gradcam_pp(inp: CamInputs) -> torch.Tensor:
    """Grad-CAM++ (Chattopadhyay et al., eq. 19 with the exponential-score simplification)."""
    g = _grads(inp)
    g2 = g * g
    g3 = g2 * g
    alpha = g2 / (2 * g2 + _spatial_sum(inp.acts) * g3 + 1e-6)
    alpha = alpha.masked_fill(g == 0, 0.0)
    weights = (g.clamp(min=0) * alpha).sum(dim=(2, 3))
    return _weighted(weights, inp.acts)


@register("xgradcam", summary="XGrad-CAM: gradients weighted by normalised activations.")
def xgradcam(inp: CamInputs) -> torch.Tensor:
    """XGrad-CAM (Fu et al.): w_c = sum_ij G * A / (sum_ij A + eps)."""
    a = inp.acts
    weights = (_grads(inp) * a / (_spatial_sum(a) + 1e-7)).sum(dim=(2, 3))
    return _weighted(weights, a)


@register("layercam", summary="LayerCAM: activations times positive gradients, per position.")
def layercam(inp: CamInputs) -> torch.Tensor:
    """LayerCAM (Jiang et al.): sum_c ReLU(G) * A."""
    return (_grads(inp).clamp(min=0) * inp.acts).sum(dim=1)


@register("hirescam", summary="HiResCAM: activations times gradients, per position.")
def hirescam(inp: CamInputs) -> torch.Tensor:
    """HiResCAM (Draelos & Carin): sum_c G * A."""
    return (_grads(inp) * inp.acts).sum(dim=1)


@register("eigencam", gradients=False,
          summary="EigenCAM: first principal component of the activations (no gradients).")
def eigencam(inp: CamInputs) -> torch.Tensor:
    """EigenCAM (Muhammad & Yeasin), sign-corrected so the SVD's arbitrary sign cannot matter.

    The activations at each position are centred over positions and projected on the first
    right singular vector; the projection is negated when its minimum is larger in
    magnitude than its maximum.
    """
    import torch

    a = torch.nan_to_num(inp.acts.double(), nan=0.0)
    n, c, h, w = a.shape
    x = a.reshape(n, c, h * w).transpose(1, 2)  # (N, positions, channels)
    x = x - x.mean(dim=1, keepdim=True)
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    proj = (x @ vh[:, 0, :].unsqueeze(-1)).squeeze(-1)  # (N, positions)
    flip = proj.amin(dim=1).abs() > proj.amax(dim=1).abs()
    proj = torch.where(flip.unsqueeze(1), -proj, proj)
    return proj.reshape(n, h, w).to(inp.acts.dtype)


@register("scorecam", gradients=False,
          summary="Score-CAM: channels weighted by the softmax of masked-input scores.")
def scorecam(inp: CamInputs) -> torch.Tensor:
    """Score-CAM (Wang et al.): each channel, upsampled and min-max scaled, masks the input.

    The target logit of every masked input, softmaxed over channels, weights the channels.
    Masked inputs run through the model in batches of ``score_batch``.
    """
    import torch
    import torch.nn.functional as F

    if inp.forward is None:  # pragma: no cover - the engine always passes it
        raise ValueError("scorecam needs the model")
    a = inp.acts
    n, c = a.shape[:2]
    size = inp.x.shape[-2:]
    scores = torch.empty((n, c), dtype=torch.float32, device=a.device)
    step = max(1, int(inp.score_batch))
    for i in range(n):
        for c0 in range(0, c, step):
            chunk = a[i : i + 1, c0 : c0 + step]
            up = F.interpolate(chunk, size=size, mode="bilinear", align_corners=True)[0]
            flat = up.reshape(up.shape[0], -1)
            lo = flat.amin(dim=1).reshape(-1, 1, 1)
            hi = flat.amax(dim=1).reshape(-1, 1, 1)
            masks = (up - lo) / (hi - lo + 1e-8)
            masked = inp.x[i].unsqueeze(0) * masks.unsqueeze(1)  # (k, C_in, H, W)
            out = inp.forward(masked)
            scores[i, c0 : c0 + masks.shape[0]] = out[:, inp.targets[i]].float()
    weights = scores.softmax(dim=1).to(a.dtype)
    return _weighted(weights, a)

