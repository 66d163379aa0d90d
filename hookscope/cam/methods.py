"""The CAM method registry: one small function per method, registered by name.

Each method turns what the engine captured at a target layer (:class:`CamInputs`: the
activations ``A`` (N, C, h, w), for gradient methods the gradients ``G`` of the summed target
scores with respect to them, and callables for the extra passes some methods need) into
either *weighted activations* (N, C, h, w), which the engine sums over channels (or
projects on their first principal component with ``eigen_smooth``), or a finished map
(N, h, w) *before* the ReLU. The formulas follow pytorch-grad-cam 1.5 (and torchcam for
``sscam``, ``iscam`` and ``smoothgradcam++``), the implementations users compare against;
the engine in :mod:`hookscope.cam.probe` applies the ReLU, resizes, fuses layers and normalises.

Every extra forward pass a method needs (masked inputs, ablated activations, noisy inputs)
goes through the callables in :class:`CamInputs`, which the engine backs with
:meth:`hookscope.core.run.Step.forward`, batched by ``score_batch``.

This module imports torch only inside the methods, so the CLI can read the method names
for ``--method`` without loading torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["CamInputs", "FullBackward", "Method", "METHODS", "get_method", "method_names",
           "project", "register"]

#: torchcam's defaults for its noise-based methods.
SSCAM_SAMPLES, SSCAM_STD = 35, 2.0
ISCAM_SAMPLES = 10
SMOOTH_SAMPLES, SMOOTH_STD = 4, 0.3


@dataclass
class FullBackward:
    """One full backward pass to the input, for FullGrad.

    Attributes:
        x: the input (N, C, H, W).
        x_grad: the gradient of the summed target scores with respect to it.
        biases: per call of each Conv2d/BatchNorm2d with a bias (in execution order), its
            effective bias (C,) and the gradient at its output (N, C, h, w).
    """

    x: torch.Tensor
    x_grad: torch.Tensor
    biases: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


@dataclass
class CamInputs:
    """What a method may use.

    Attributes:
        acts: the layer's activations (N, C, h, w).
        grads: the gradients of the summed target scores with respect to them (gradient
            methods only).
        x: the input batch of this pass (N, C_in, H, W).
        targets: the explained class per input (-1 where there is no single class).
        score: scores of new inputs: ``score(inputs, rows)`` gives, for each of the k
            inputs, the target score of input ``rows[j]``'s target (inference, one pass).
        score_batch: inputs per forward pass for ``score`` and ``ablate``.
        base_scores: the target score of each input (N,).
        ablate: ``ablate(i, channels)``: the target scores of input ``i`` with each one
            of ``channels`` of the layer's output ablated (one pass per ``score_batch``).
        regrad: ``regrad(fn)``: the gradient at this layer of ``fn(output).sum()``, ``fn``
            taking the model's output and returning one score per input.
        logits: the model's class logits (classifiers only).
        hvp: the Hessian of the summed target scores times the activations (N, C, h, w).
        noisy: ``noisy(s)``: the activations and gradients of the ``s``-th noisy copy of
            the input (the same noise for every layer).
        noise: ``noise(shape)``: standard normal noise from the seeded generator.
        full: the full backward pass (FullGrad).
        attention: ``attention(gradients)``: the attention probabilities of every block
            (with the target scores' gradients with respect to them), from one more pass.
    """

    acts: torch.Tensor
    grads: torch.Tensor | None
    x: torch.Tensor
    targets: list[int]
    score: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None
    score_batch: int = 32
    base_scores: torch.Tensor | None = None
    ablate: Callable[[int, list[int]], torch.Tensor] | None = None
    regrad: Callable[[Callable[[Any], torch.Tensor]], torch.Tensor] | None = None
    logits: torch.Tensor | None = None
    hvp: Callable[[], torch.Tensor] | None = None
    noisy: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None
    noise: Callable[[tuple[int, ...]], torch.Tensor] | None = None
    full: FullBackward | None = None
    attention: Callable[[bool], Any] | None = None


CamFn = Callable[[CamInputs], "torch.Tensor"]


@dataclass(frozen=True)
class Method:
    """A registered CAM method.

    Attributes:
        gradients: needs the gradients at the layer.
        needs: the extra passes it uses: ``score``, ``ablate``, ``regrad``, ``hvp``,
            ``noisy``, ``noise``, ``full``, ``attention``.
        classifier: only for classifiers (it compares classes of the logits).
        layerwise: computed at each target layer (False: FullGrad, which uses every bias).
        origin: the implementation it follows.
    """

    name: str
    fn: CamFn
    gradients: bool
    summary: str
    needs: frozenset[str] = frozenset()
    classifier: bool = False
    layerwise: bool = True
    origin: str = "pytorch-grad-cam"


METHODS: dict[str, Method] = {}


def register(name: str, *, gradients: bool = True, summary: str = "",
             needs: tuple[str, ...] = (), classifier: bool = False, layerwise: bool = True,
             origin: str = "pytorch-grad-cam") -> Callable[[CamFn], CamFn]:
    """Register ``fn`` as the CAM method ``name``; a duplicate name is a programming error."""

    def wrap(fn: CamFn) -> CamFn:
        if name in METHODS:
            raise ValueError(f"CAM method {name!r} is already registered")
        METHODS[name] = Method(name, fn, gradients,
                               summary or (fn.__doc__ or "").split("\n")[0],
                               frozenset(needs), classifier, layerwise, origin)
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
    from hookscope.core.errors import HookscopeError, param, suggest

    try:
        return METHODS[name.strip().lower()]
    except KeyError:
        raise HookscopeError(
            f"Unknown CAM method {name!r} ({param('method')}).{suggest(name, METHODS)} "
            f"Choose from: {', '.join(METHODS)}."
        ) from None


# ----------------------------------------------------------------------------- helpers


def _spatial_sum(t: torch.Tensor) -> torch.Tensor:
    return t.sum(dim=(2, 3), keepdim=True)


def _channels(weights: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
    """w[n, c] * A[n, c]: the weighted activations (summed by the engine)."""
    return weights[:, :, None, None].to(acts.dtype) * acts


def _need(value: Any, name: str) -> Any:
    if value is None:  # pragma: no cover - the engine passes what a method declares
        raise ValueError(f"this method needs {name}")
    return value


def _grads(inp: CamInputs) -> torch.Tensor:
    return _need(inp.grads, "gradients")  # type: ignore[no-any-return]


def project(t: torch.Tensor) -> torch.Tensor:
    """First principal component of (N, C, h, w) over channels, sign-corrected: (N, h, w).

    Positions are centred over positions and projected on the first right singular
    vector (pytorch-grad-cam's ``get_2d_projection``); the SVD's sign is arbitrary, so the
    projection is negated when its minimum is larger in magnitude than its maximum.
    """
    import torch

    a = torch.nan_to_num(t.double(), nan=0.0)
    n, c, h, w = a.shape
    x = a.reshape(n, c, h * w).transpose(1, 2)  # (N, positions, channels)
    x = x - x.mean(dim=1, keepdim=True)
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    proj = (x @ vh[:, 0, :].unsqueeze(-1)).squeeze(-1)  # (N, positions)
    flip = proj.amin(dim=1).abs() > proj.amax(dim=1).abs()
    proj = torch.where(flip.unsqueeze(1), -proj, proj)
    return proj.reshape(n, h, w).to(t.dtype)


def _minmax_channels(t: torch.Tensor, eps: float) -> torch.Tensor:
    """Each (n, c) map minus its minimum, over its span plus ``eps``."""
    flat = t.reshape(t.shape[0], t.shape[1], -1)
    lo = flat.amin(dim=2)[:, :, None, None]
    hi = flat.amax(dim=2)[:, :, None, None]
    return (t - lo) / (hi - lo + eps)


# ----------------------------------------------------------------------------- gradients


@register("gradcam", summary="Grad-CAM: channels weighted by their mean gradient.")
def gradcam(inp: CamInputs) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al.): w_c = mean over positions of dS/dA_c."""
    return _channels(_grads(inp).mean(dim=(2, 3)), inp.acts)


@register("gradcam++", summary="Grad-CAM++: positive gradients weighted by eq. 19.")
def gradcam_pp(inp: CamInputs) -> torch.Tensor:
    """Grad-CAM++ (Chattopadhyay et al., eq. 19 with the exponential-score simplification)."""
    g = _grads(inp)
    g2 = g * g
    g3 = g2 * g
    alpha = g2 / (2 * g2 + _spatial_sum(inp.acts) * g3 + 1e-6)
    alpha = alpha.masked_fill(g == 0, 0.0)
    return _channels((g.clamp(min=0) * alpha).sum(dim=(2, 3)), inp.acts)


@register("xgradcam", summary="XGrad-CAM: gradients weighted by normalised activations.")
def xgradcam(inp: CamInputs) -> torch.Tensor:
    """XGrad-CAM (Fu et al.): w_c = sum_ij G * A / (sum_ij A + eps)."""
    a = inp.acts
    return _channels((_grads(inp) * a / (_spatial_sum(a) + 1e-7)).sum(dim=(2, 3)), a)


@register("layercam", summary="LayerCAM: activations times positive gradients, per position.")
def layercam(inp: CamInputs) -> torch.Tensor:
    """LayerCAM (Jiang et al.): sum_c ReLU(G) * A."""
    return _grads(inp).clamp(min=0) * inp.acts


@register("hirescam", summary="HiResCAM: activations times gradients, per position.")
def hirescam(inp: CamInputs) -> torch.Tensor:
    """HiResCAM (Draelos & Carin): sum_c G * A."""
    return _grads(inp) * inp.acts


@register("eigencam", gradients=False,
          summary="EigenCAM: first principal component of the activations (no gradients).")
def eigencam(inp: CamInputs) -> torch.Tensor:
    """EigenCAM (Muhammad & Yeasin): the activations' :func:`project`, sign-corrected so the
    SVD's arbitrary sign cannot matter."""
    return project(inp.acts)


@register("scorecam", gradients=False, needs=("score",),
          summary="Score-CAM: channels weighted by the softmax of masked-input scores.")
def scorecam(inp: CamInputs) -> torch.Tensor:
    """Score-CAM (Wang et al.): each channel, upsampled and min-max scaled, masks the input.

    The target score of every masked input, softmaxed over channels, weights the channels.
    Masked inputs run through the model in batches of ``score_batch``. A constant channel
    (a dead one, all zero) masks the input to zero whatever the input: its score is the zero
    input's, computed once.
    """
    import torch
    import torch.nn.functional as F

    score = _need(inp.score, "score")
    a = inp.acts
    n, c = a.shape[:2]
    size = inp.x.shape[-2:]
    scores = torch.empty((n, c), dtype=torch.float32, device=a.device)
    flat = a.reshape(n, c, -1)
    constant = flat.amax(dim=2) == flat.amin(dim=2)
    if bool(constant.any()):
        zero = score(torch.zeros_like(inp.x), list(range(n))).float()
        scores[constant] = zero[:, None].expand(n, c)[constant]
    step = max(1, int(inp.score_batch))
    for i in range(n):
        live = torch.nonzero(~constant[i]).flatten()
        for c0 in range(0, len(live), step):
            idx = live[c0 : c0 + step]
            up = F.interpolate(a[i : i + 1, idx], size=size, mode="bilinear",
                               align_corners=True)
            masks = _minmax_channels(up, 1e-8)[0]
            masked = inp.x[i].unsqueeze(0) * masks.unsqueeze(1)  # (k, C_in, H, W)
            scores[i, idx] = score(masked, [i] * len(idx)).float()
    return _channels(scores.softmax(dim=1), a)


@register("gradcamelementwise", summary="Grad-CAM element-wise: sum_c ReLU(G * A).")
def gradcam_elementwise(inp: CamInputs) -> torch.Tensor:
    """Grad-CAM element-wise (pytorch-grad-cam): the ReLU of each product G * A, summed."""
    return (_grads(inp) * inp.acts).clamp(min=0)


@register("eigengradcam",
          summary="EigenGrad-CAM: first principal component of G * A (sign-corrected).")
def eigengradcam(inp: CamInputs) -> torch.Tensor:
    """EigenGrad-CAM (pytorch-grad-cam): the projection of G * A, as EigenCAM's."""
    return project(_grads(inp) * inp.acts)


@register("ablationcam", gradients=False, needs=("ablate",),
          summary="Ablation-CAM: channels weighted by the score drop when each is removed.")
def ablationcam(inp: CamInputs) -> torch.Tensor:
    """Ablation-CAM (Desai & Ramaswamy): w_c = (S - S_c) / S.

    S_c is the target score with channel c of the layer's output set to 0 (or, when the
    output never reaches 0, to its minimum minus 1e7), as pytorch-grad-cam's AblationLayer.
    Ablated outputs run ``score_batch`` at a time, from the layer on.
    """
    import torch

    ablate = _need(inp.ablate, "ablate")
    base = _need(inp.base_scores, "base_scores").float()
    a = inp.acts
    n, c = a.shape[:2]
    scores = torch.empty((n, c), dtype=torch.float32, device=a.device)
    step = max(1, int(inp.score_batch))
    for i in range(n):
        for c0 in range(0, c, step):
            channels = list(range(c0, min(c, c0 + step)))
            scores[i, c0 : c0 + len(channels)] = ablate(i, channels).float()
    return _channels((base[:, None] - scores) / base[:, None], a)


@register("fullgrad", needs=("full",), layerwise=False,
          summary="FullGrad: input gradients and every bias's gradient (ignores the layer).")
def fullgrad(inp: CamInputs) -> torch.Tensor:
    """FullGrad (Srinivas & Fleuret), as pytorch-grad-cam computes it, at input resolution.

    |x * dS/dx| per input channel, plus, for every Conv2d/BatchNorm2d with a bias, |b * G|
    per channel; each (input, channel) map is min-max scaled (pytorch-grad-cam's 1e-7 in
    the denominator), resized to the input and summed.
    """
    import torch.nn.functional as F

    full = _need(inp.full, "full")
    size = full.x.shape[-2:]
    total = _minmax_channels((full.x_grad * full.x).abs(), 1e-7).sum(dim=1)
    for bias, grad in full.biases:
        term = _minmax_channels((bias[None, :, None, None] * grad).abs(), 1e-7).sum(dim=1)
        # Resizing is linear: the sum of resized channel maps is the resized sum.
        total = total + F.interpolate(term.unsqueeze(1).float(), size=size, mode="bilinear",
                                      align_corners=False).squeeze(1)
    return total


def _top_eigen(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The largest eigenvalue of each symmetric (P, P) matrix and its eigenvector: a dense
    solver up to 200 positions, ARPACK above (as scikit-learn; P^3 gets slow)."""
    import numpy as np
    import torch

    if k.shape[1] <= 200:
        values, vectors = torch.linalg.eigh(k)
        return values[:, -1], vectors[:, :, -1]
    from scipy.sparse.linalg import eigsh

    found = [eigsh(m, 1, which="LA", v0=np.random.default_rng(0).uniform(-1, 1, len(m)))
             for m in k.cpu().numpy()]
    return (torch.tensor([f[0][0] for f in found], dtype=k.dtype, device=k.device),
            torch.tensor(np.stack([f[1][:, 0] for f in found]), dtype=k.dtype, device=k.device))


@register("kpcacam", gradients=False,
          summary="KPCA-CAM: first kernel principal component of the activations.")
def kpcacam(inp: CamInputs) -> torch.Tensor:
    """KPCA-CAM (pytorch-grad-cam): scikit-learn's ``KernelPCA(1, kernel="sigmoid")``.

    The kernel tanh(A A^T / C + 1) between positions (activations centred over positions),
    centred, and its leading eigenvector with scikit-learn's sign (largest entry positive),
    scaled by the square root of its eigenvalue.
    """
    import torch

    a = torch.nan_to_num(inp.acts.double(), nan=0.0)
    n, c, h, w = a.shape
    x = a.reshape(n, c, h * w).transpose(1, 2)
    x = x - x.mean(dim=1, keepdim=True)
    k = torch.tanh(x @ x.transpose(1, 2) / c + 1.0)
    k = k - k.mean(dim=1, keepdim=True) - k.mean(dim=2, keepdim=True) \
        + k.mean(dim=(1, 2), keepdim=True)
    top, vec = _top_eigen(k)
    top = top.clamp(min=0)
    sign = torch.sign(vec.gather(1, vec.abs().argmax(dim=1, keepdim=True)))
    proj = vec * sign * top.sqrt().unsqueeze(1)
    return proj.reshape(n, h, w).to(inp.acts.dtype)


@register("shapleycam", needs=("hvp",),
          summary="ShapleyCAM: gradients corrected by the Hessian-vector product.")
def shapleycam(inp: CamInputs) -> torch.Tensor:
    """ShapleyCAM (Cai): w_c = mean over positions of (G - H A / 2)."""
    hvp = _need(inp.hvp, "hvp")()
    return _channels((_grads(inp) - 0.5 * hvp).mean(dim=(2, 3)), inp.acts)


def _finer_score(targets: list[int], comparisons: torch.Tensor) -> Callable[[Any], Any]:
    """pytorch-grad-cam's ``FinerWeightedTarget`` (alpha 1) for every input at once."""
    import torch

    def score(logits: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(logits.shape[0], device=logits.device)
        main = logits[rows, torch.tensor(targets, device=logits.device)]
        others = logits.gather(1, comparisons)
        prob = torch.softmax(logits, dim=-1).gather(1, comparisons)
        return (prob * (main[:, None] - others)).sum(1) / (prob.sum(1) + 1e-9)

    return score


@register("finercam", needs=("regrad",), classifier=True,
          summary="Finer-CAM: Grad-CAM of the target against its 3 closest classes.")
def finercam(inp: CamInputs) -> torch.Tensor:
    """Finer-CAM (pytorch-grad-cam, Grad-CAM base, alpha 1): the score is the target logit
    minus each of the 3 classes with the closest logits, weighted by their probabilities."""
    import torch

    logits = _need(inp.logits, "logits").float()
    target = logits.gather(1, torch.tensor(inp.targets, device=logits.device)[:, None])
    order = torch.argsort((logits - target).abs(), dim=1)
    comparisons = order[:, 1 : 1 + min(3, logits.shape[1] - 1)]
    grads = _need(inp.regrad, "regrad")(_finer_score(inp.targets, comparisons))
    return _channels(grads.float().mean(dim=(2, 3)), inp.acts)


@register("fem", gradients=False,
          summary="FEM: channels weighted by their share of activations above mean + 2 std.")
def fem(inp: CamInputs) -> torch.Tensor:
    """Feature Explanation Method (Fuad et al.): w_c = mean_ij [A_c > mean_c + 2 std_c]."""
    a = inp.acts
    mean = a.mean(dim=(2, 3), keepdim=True)
    std = a.std(dim=(2, 3), keepdim=True, unbiased=False)
    weights = (a > mean + 2 * std).to(a.dtype).mean(dim=(2, 3))
    return (weights[:, :, None, None] * a).sum(dim=1)


# ----------------------------------------------------------------------------- torchcam


def _score_masks(inp: CamInputs, masks: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Target scores of every (input, channel) mask times the input, minus the input's own
    score: (N, C), ``score_batch`` masked inputs per pass."""
    import torch

    score = _need(inp.score, "score")
    base = _need(inp.base_scores, "base_scores").float()
    n, c = masks.shape[:2]
    flat = masks.reshape(n * c, 1, *masks.shape[2:])
    rows = [i for i in range(n) for _ in range(c)]
    out = torch.empty(n * c, dtype=torch.float32, device=masks.device)
    step = max(1, int(inp.score_batch))
    for s in range(0, n * c, step):
        idx = rows[s : s + step]
        masked = scale * (flat[s : s + step] * inp.x[idx])
        out[s : s + len(idx)] = score(masked, idx).float() - base[idx]
    return out.reshape(n, c)


def _torchcam_masks(inp: CamInputs) -> torch.Tensor:
    """torchcam's Score-CAM masks: each channel min-max scaled, resized to the input."""
    import torch.nn.functional as F

    normed = _minmax_channels(inp.acts, 1e-8)
    return F.interpolate(normed, size=inp.x.shape[-2:], mode="bilinear", align_corners=False)


@register("sscam", gradients=False, needs=("score", "noise"), origin="torchcam",
          summary="SS-CAM: Score-CAM with masks smoothed by Gaussian noise (seeded).")
def sscam(inp: CamInputs) -> torch.Tensor:
    """SS-CAM (Wang et al.), as torchcam computes it: 35 noisy copies of every mask (noise
    std 2), the mean score gain softmaxed over channels."""
    noise = _need(inp.noise, "noise")
    masks = _torchcam_masks(inp)
    total = _score_masks(inp, masks + SSCAM_STD * noise(tuple(masks.shape)))
    for _ in range(SSCAM_SAMPLES - 1):
        total = total + _score_masks(inp, masks + SSCAM_STD * noise(tuple(masks.shape)))
    return _channels((total / SSCAM_SAMPLES).softmax(dim=1), inp.acts)


@register("iscam", gradients=False, needs=("score",), origin="torchcam",
          summary="IS-CAM: Score-CAM integrated over 10 growing mask scales.")
def iscam(inp: CamInputs) -> torch.Tensor:
    """IS-CAM (Naidu et al.), as torchcam computes it: masked inputs scaled by the running
    sum of (i + 1) / 10, the mean score gain softmaxed over channels."""
    masks = _torchcam_masks(inp)
    coeff = 1 / ISCAM_SAMPLES  # accumulated as torchcam does, to the last bit
    total = _score_masks(inp, masks, coeff)
    for i in range(1, ISCAM_SAMPLES):
        coeff += (i + 1) / ISCAM_SAMPLES
        total = total + _score_masks(inp, masks, coeff)
    return _channels((total / ISCAM_SAMPLES).softmax(dim=1), inp.acts)


@register("smoothgradcam++", needs=("noisy",), origin="torchcam",
          summary="Smooth Grad-CAM++: Grad-CAM++ with gradients averaged over noisy inputs.")
def smoothgradcam_pp(inp: CamInputs) -> torch.Tensor:
    """Smooth Grad-CAM++ (Omeiza et al.), as torchcam computes it: 4 noisy inputs (std 0.3).

    alpha = mean G^2 / (2 mean G^2 + sum_ij mean G^3 * A + 1e-8) with A the clean
    activations; the weights are sum_ij alpha * ReLU(G) and the map weights the
    activations, both G and the activations being those of the last noisy input.
    """
    noisy = _need(inp.noisy, "noisy")
    acts, grads = noisy(0)
    g2, g3 = grads.pow(2), grads.pow(3)
    for s in range(1, SMOOTH_SAMPLES):
        acts, grads = noisy(s)
        g2, g3 = g2 + grads.pow(2), g3 + grads.pow(3)
    g2, g3 = g2 / SMOOTH_SAMPLES, g3 / SMOOTH_SAMPLES
    alpha = g2 / (2 * g2 + _spatial_sum(g3 * inp.acts) + 1e-8)
    return _channels((alpha * grads.clamp(min=0)).sum(dim=(2, 3)), acts)


# ----------------------------------------------------------------------------- attention


@register("rollout", gradients=False, needs=("attention",), layerwise=False, origin="paper",
          summary="Attention rollout: head-fused attention, with the residual, multiplied "
                  "through the blocks.")
def attention_rollout(inp: CamInputs) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, 2020); see :func:`hookscope.cam.attention.rollout`."""
    from hookscope.cam.attention import rollout

    return rollout(_need(inp.attention, "attention")(False))


@register("attention-grad", gradients=False, needs=("attention",), layerwise=False,
          classifier=False, origin="paper",
          summary="Chefer et al.: gradient-weighted attention relevance through the blocks.")
def attention_grad(inp: CamInputs) -> torch.Tensor:
    """Chefer, Gur & Wolf (2021); see :func:`hookscope.cam.attention.relevance`."""
    from hookscope.cam.attention import relevance

    return relevance(_need(inp.attention, "attention")(True))
