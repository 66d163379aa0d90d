"""The CAM method registry: one small function per method, registered by name.

A method turns what the engine captured at a target layer (:class:`CamInputs`) into either
weighted activations (N, C, h, w), which the engine sums over channels (or projects with
``eigen_smooth``), or a finished map (N, h, w) before the ReLU. For a signal or a volume the
activations are (N, C, l) or (N, C, d, h, w) and the maps (N, l) or (N, d, h, w): the methods
pool over :func:`positions`, whatever their number. The formulas follow
pytorch-grad-cam 1.5 (torchcam for ``sscam``, ``iscam`` and ``smoothgradcam++``).

Torch is imported only inside the methods, so the CLI reads the names without loading it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

    from hookscope.cam.passes import BatchRun
    from hookscope.core.run import GradMode

__all__ = ["CamInputs", "FullBackward", "Method", "METHODS", "PLAIN", "get_method",
           "method_names", "minmax", "positions", "project", "register", "Registry", "resize"]

#: The grad mode of a CAM run's passes without gradients: autograd off, but not inference
#: mode, because a model may cache a tensor made in its first call (BEiT's relative position
#: index) and the run's gradient passes could not differentiate an inference tensor.
PLAIN: GradMode = "off"

#: torchcam's defaults for its noise-based methods.
SSCAM_SAMPLES, SSCAM_STD = 35, 2.0
ISCAM_SAMPLES = 10
SMOOTH_SAMPLES, SMOOTH_STD = 4, 0.3


@dataclass
class FullBackward:
    """One full backward pass to the input, for FullGrad: the input, the gradient of the
    summed target scores there, and per call of each biased Conv2d/BatchNorm2d its
    effective bias (C,) and the gradient at its output (N, C, h, w)."""

    x: torch.Tensor
    x_grad: torch.Tensor
    biases: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


@dataclass
class CamInputs:
    """What a method may use at one target layer: its activations (N, C, h, w), the gradients
    of the summed target scores there (None for a method without ``gradients``), the input,
    the target classes, and ``run``, the batch's :class:`hookscope.cam.passes.BatchRun`, for
    the extra passes the method names in its ``needs``."""

    acts: torch.Tensor
    grads: torch.Tensor  # None for a method registered without gradients
    x: torch.Tensor
    targets: list[int]
    run: BatchRun = None  # type: ignore[assignment]  # only for methods with ``needs``
    layer: int = 0
    method: str = ""


CamFn = Callable[[CamInputs], "torch.Tensor"]
E = TypeVar("E")
F = TypeVar("F", bound=Callable[..., Any])


class Registry(dict[str, E]):
    """Registered methods by name, in registration order: ``kind`` makes an entry from the
    name, the function and :meth:`register`'s options; ``what`` names one in messages."""

    def __init__(self, what: str, kind: Callable[..., E]) -> None:
        super().__init__()
        self.what, self.kind = what, kind

    def register(self, name: str, **options: Any) -> Callable[[F], F]:
        """Register ``fn`` as the method ``name``; a duplicate name is a programming error."""

        def wrap(fn: F) -> F:
            if name in self:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self[name] = self.kind(name, fn, **options)
            return fn

        return wrap

    def find(self, name: str) -> E:
        """The method called ``name``; an unknown name raises HookscopeError with close matches."""
        from hookscope.core.errors import HookscopeError, param, suggest

        try:
            return self[name.strip().lower()]
        except KeyError:
            raise HookscopeError(
                f"Unknown {self.what} {name!r} ({param('method')}).{suggest(name, self)} "
                f"Choose from: {', '.join(self)}."
            ) from None


@dataclass(frozen=True)
class Method:
    """A registered CAM method: ``needs`` names the extra passes it runs (see :class:`CamInputs`);
    ``classifier``: it compares a classifier's classes; not ``layerwise``: it ignores the
    target layers (one map, not one per layer); ``image_only``: why it needs an image, not a
    signal or volume (docs/gradcam.md, "Signals and volumes")."""

    name: str
    fn: CamFn
    gradients: bool = True
    needs: tuple[str, ...] = ()
    classifier: bool = False
    layerwise: bool = True
    image_only: str | None = None


METHODS: Registry[Method] = Registry("CAM method", Method)
register = METHODS.register
get_method = METHODS.find


def method_names() -> list[str]:
    """Registered method names, in registration order."""
    return list(METHODS)


def positions(t: torch.Tensor) -> tuple[int, ...]:
    """The position dimensions of (N, C, ...) activations: (2, 3) for (N, C, h, w), (2,) for
    a signal's (N, C, l), (2, 3, 4) for a volume's (N, C, d, h, w)."""
    return tuple(range(2, t.dim()))


def _spatial_sum(t: torch.Tensor) -> torch.Tensor:
    return t.sum(dim=positions(t), keepdim=True)


def _channels(weights: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
    """w[n, c] * A[n, c]: the weighted activations (summed by the engine)."""
    return weights.reshape(*weights.shape[:2], *[1] * (acts.dim() - 2)).to(acts.dtype) * acts


def _positions(t: torch.Tensor) -> torch.Tensor:
    """(N, C, h, w) as (N, positions, channels) in float64, centred over positions."""
    import torch

    a = torch.nan_to_num(t.double(), nan=0.0)
    x = a.flatten(2).transpose(1, 2)
    return x - x.mean(dim=1, keepdim=True)


def project(t: torch.Tensor) -> torch.Tensor:
    """First principal component of (N, C, h, w) over channels, sign-corrected: (N, h, w).

    pytorch-grad-cam's ``get_2d_projection``; the SVD's sign is arbitrary, so the projection
    is negated when its minimum is larger in magnitude than its maximum.
    """
    import torch

    x = _positions(t)
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    proj = (x @ vh[:, 0, :].unsqueeze(-1)).squeeze(-1)  # (N, positions)
    flip = proj.amin(dim=1).abs() > proj.amax(dim=1).abs()
    proj = torch.where(flip.unsqueeze(1), -proj, proj)
    return proj.reshape(t.shape[0], *t.shape[2:]).to(t.dtype)


def minmax(t: torch.Tensor, eps: float, dims: int = 2) -> torch.Tensor:
    """Each map (the last ``dims`` dimensions: (h, w), (l,) or (d, h, w)) minus its minimum,
    over its span plus ``eps``."""
    flat = t.flatten(-dims) if dims > 1 else t
    lo = flat.amin(dim=-1).reshape(*t.shape[:-dims], *[1] * dims)
    hi = flat.amax(dim=-1).reshape(*t.shape[:-dims], *[1] * dims)
    return (t - lo) / (hi - lo + eps)


#: Interpolation of a map by its number of dimensions: pytorch-grad-cam's (bilinear for
#: images, trilinear for its 5-D branch), and linear for a signal.
SMOOTH_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


def resize(maps: torch.Tensor, size: Sequence[int], mode: str = "bilinear") -> torch.Tensor:
    """(N, h, w) maps, or (N, l) or (N, d, h, w) ones for a ``size`` of that many dimensions,
    resized to ``size`` (``bilinear``: linear in each dimension, without aligned corners)."""
    import torch.nn.functional as F

    if tuple(maps.shape[-len(size):]) == tuple(size):
        return maps
    mode = SMOOTH_MODES[len(size)] if mode == "bilinear" else mode
    return F.interpolate(maps.unsqueeze(1), size=tuple(size), mode=mode).squeeze(1)


# ----------------------------------------------------------------------------- gradients


@register("gradcam")
def gradcam(inp: CamInputs) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al.): w_c = mean over positions of dS/dA_c."""
    return _channels(inp.grads.mean(dim=positions(inp.grads)), inp.acts)


@register("gradcam++")
def gradcam_pp(inp: CamInputs) -> torch.Tensor:
    """Grad-CAM++ (Chattopadhyay et al., eq. 19 with the exponential-score simplification)."""
    g = inp.grads
    g2 = g * g
    g3 = g2 * g
    alpha = g2 / (2 * g2 + _spatial_sum(inp.acts) * g3 + 1e-6)
    alpha = alpha.masked_fill(g == 0, 0.0)
    return _channels((g.clamp(min=0) * alpha).sum(dim=positions(g)), inp.acts)


@register("xgradcam")
def xgradcam(inp: CamInputs) -> torch.Tensor:
    """XGrad-CAM (Fu et al.): w_c = sum_ij G * A / (sum_ij A + eps)."""
    a = inp.acts
    return _channels((inp.grads * a / (_spatial_sum(a) + 1e-7)).sum(dim=positions(a)), a)


@register("layercam")
def layercam(inp: CamInputs) -> torch.Tensor:
    """LayerCAM (Jiang et al.): sum_c ReLU(G) * A."""
    return inp.grads.clamp(min=0) * inp.acts


@register("hirescam")
def hirescam(inp: CamInputs) -> torch.Tensor:
    """HiResCAM (Draelos & Carin): sum_c G * A."""
    return inp.grads * inp.acts


@register("eigencam", gradients=False)
def eigencam(inp: CamInputs) -> torch.Tensor:
    """EigenCAM (Muhammad & Yeasin): the activations' :func:`project` (no gradients)."""
    return project(inp.acts)


@register("scorecam", gradients=False, needs=("score",))
def scorecam(inp: CamInputs) -> torch.Tensor:
    """Score-CAM (Wang et al.): each channel, upsampled and min-max scaled, masks the input;
    the masked inputs' target scores, softmaxed over channels, weight the channels.

    A constant (dead) channel masks every input to zero: its score is the zero input's,
    computed once.
    """
    import torch
    import torch.nn.functional as F

    score = inp.run.score
    a = inp.acts
    n, c = a.shape[:2]
    size = inp.x.shape[2:]
    scores = torch.empty((n, c), dtype=torch.float32, device=a.device)
    flat = a.reshape(n, c, -1)
    constant = flat.amax(dim=2) == flat.amin(dim=2)
    if bool(constant.any()):
        zero = score(torch.zeros_like(inp.x), list(range(n))).float()
        scores[constant] = zero[:, None].expand(n, c)[constant]
    for i in range(n):
        for idx in torch.nonzero(~constant[i]).flatten().split(inp.run.score_batch):
            up = F.interpolate(a[i : i + 1, idx], size=size, mode=SMOOTH_MODES[len(size)],
                               align_corners=True)
            masks = minmax(up, 1e-8, len(size))[0]
            masked = inp.x[i].unsqueeze(0) * masks.unsqueeze(1)  # (k, C_in, H, W)
            scores[i, idx] = score(masked, [i] * len(idx)).float()
    return _channels(scores.softmax(dim=1), a)


@register("gradcamelementwise")
def gradcam_elementwise(inp: CamInputs) -> torch.Tensor:
    """Grad-CAM element-wise (pytorch-grad-cam): sum_c ReLU(G * A)."""
    return (inp.grads * inp.acts).clamp(min=0)


@register("eigengradcam")
def eigengradcam(inp: CamInputs) -> torch.Tensor:
    """EigenGrad-CAM (pytorch-grad-cam): the :func:`project` of G * A."""
    return project(inp.grads * inp.acts)


@register("ablationcam", gradients=False, needs=("ablate",))
def ablationcam(inp: CamInputs) -> torch.Tensor:
    """Ablation-CAM (Desai & Ramaswamy): w_c = (S - S_c) / S, with S_c the target score when
    channel c of the layer's output is ablated (pytorch-grad-cam's AblationLayer)."""
    import torch

    run, a = inp.run, inp.acts
    base = run.cap.scores.float()
    n, c = a.shape[:2]
    scores = torch.empty((n, c), dtype=torch.float32, device=a.device)
    for i in range(n):
        for channels in torch.arange(c).split(run.score_batch):
            scores[i, channels] = run.ablate(inp.layer, i, channels.tolist()).float()
    return _channels((base[:, None] - scores) / base[:, None], a)


@register("fullgrad", needs=("full",), layerwise=False,
          image_only="sums the bias gradients of Conv2d and BatchNorm2d layers (its definition)")
def fullgrad(inp: CamInputs) -> torch.Tensor:
    """FullGrad (Srinivas & Fleuret) as pytorch-grad-cam, at input resolution (it ignores
    the layer): |x * dS/dx| plus, for every biased Conv2d/BatchNorm2d, |b * G|, each
    (input, channel) map min-max scaled, resized to the input and summed."""
    full = inp.run.full
    assert full is not None  # the engine runs it for the methods that need it
    size = full.x.shape[-2:]
    total = minmax((full.x_grad * full.x).abs(), 1e-7).sum(dim=1)
    for bias, grad in full.biases:
        term = minmax((bias[None, :, None, None] * grad).abs(), 1e-7).sum(dim=1)
        # Resizing is linear: the sum of resized channel maps is the resized sum.
        total = total + resize(term.float(), size)
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


@register("kpcacam", gradients=False)
def kpcacam(inp: CamInputs) -> torch.Tensor:
    """KPCA-CAM (pytorch-grad-cam): scikit-learn's ``KernelPCA(1, kernel="sigmoid")`` over
    positions: the centred kernel tanh(A A^T / C + 1), its leading eigenvector with
    scikit-learn's sign (largest entry positive), scaled by the root of its eigenvalue."""
    import torch

    x = _positions(inp.acts)
    k = torch.tanh(x @ x.transpose(1, 2) / x.shape[2] + 1.0)
    k = k - k.mean(dim=1, keepdim=True) - k.mean(dim=2, keepdim=True) \
        + k.mean(dim=(1, 2), keepdim=True)
    top, vec = _top_eigen(k)
    top = top.clamp(min=0)
    sign = torch.sign(vec.gather(1, vec.abs().argmax(dim=1, keepdim=True)))
    proj = vec * sign * top.sqrt().unsqueeze(1)
    return proj.reshape(x.shape[0], *inp.acts.shape[2:]).to(inp.acts.dtype)


@register("shapleycam", needs=("hvp",))
def shapleycam(inp: CamInputs) -> torch.Tensor:
    """ShapleyCAM (Cai): w_c = mean over positions of (G - H A / 2)."""
    hvp = inp.run.hvp(inp.layer)
    return _channels((inp.grads - 0.5 * hvp).mean(dim=positions(hvp)), inp.acts)


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


@register("finercam", needs=("regrad",), classifier=True)
def finercam(inp: CamInputs) -> torch.Tensor:
    """Finer-CAM (pytorch-grad-cam, Grad-CAM base, alpha 1): the gradient of the target logit
    minus the 3 closest classes' logits, weighted by their probabilities."""
    import torch

    logits = inp.run.cap.out.float()
    target = logits.gather(1, torch.tensor(inp.targets, device=logits.device)[:, None])
    order = torch.argsort((logits - target).abs(), dim=1)
    comparisons = order[:, 1 : 1 + min(3, logits.shape[1] - 1)]
    grads = inp.run.regrad(inp.layer, _finer_score(inp.targets, comparisons))
    return _channels(grads.float().mean(dim=positions(grads)), inp.acts)


@register("fem", gradients=False)
def fem(inp: CamInputs) -> torch.Tensor:
    """Feature Explanation Method (Fuad et al.): w_c = mean_ij [A_c > mean_c + 2 std_c]."""
    a = inp.acts
    mean = a.mean(dim=positions(a), keepdim=True)
    std = a.std(dim=positions(a), keepdim=True, unbiased=False)
    weights = (a > mean + 2 * std).to(a.dtype).mean(dim=positions(a))
    return _channels(weights, a).sum(dim=1)


# ----------------------------------------------------------------------------- torchcam


def _score_masks(inp: CamInputs, masks: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The target score gain of each (input, channel) mask times the input: (N, C)."""
    import torch

    score, base = inp.run.score, inp.run.cap.scores.float()
    n, c = masks.shape[:2]
    flat = masks.reshape(n * c, 1, *masks.shape[2:])
    out = torch.empty(n * c, dtype=torch.float32, device=masks.device)
    for index in torch.arange(n * c, device=masks.device).split(inp.run.score_batch):
        rows = (index // c).tolist()
        out[index] = score(scale * (flat[index] * inp.x[rows]), rows).float() - base[rows]
    return out.reshape(n, c)


def _torchcam_masks(inp: CamInputs) -> torch.Tensor:
    """torchcam's Score-CAM masks: each channel min-max scaled, resized to the input."""
    import torch.nn.functional as F

    size = inp.x.shape[2:]
    return F.interpolate(minmax(inp.acts, 1e-8, len(size)), size=size,
                         mode=SMOOTH_MODES[len(size)], align_corners=False)


@register("sscam", gradients=False, needs=("score", "noise"))
def sscam(inp: CamInputs) -> torch.Tensor:
    """SS-CAM (Wang et al.) as torchcam: Score-CAM over 35 noisy copies of every mask (std 2),
    the mean score gain softmaxed over channels (seeded noise)."""
    masks = _torchcam_masks(inp)
    total: Any = sum(_score_masks(inp, masks + SSCAM_STD * inp.run.noise(inp.method, masks.shape))
                     for _ in range(SSCAM_SAMPLES))
    return _channels((total / SSCAM_SAMPLES).softmax(dim=1), inp.acts)


@register("iscam", gradients=False, needs=("score",))
def iscam(inp: CamInputs) -> torch.Tensor:
    """IS-CAM (Naidu et al.) as torchcam: Score-CAM over 10 growing mask scales (the running
    sum of (i + 1) / 10), the mean score gain softmaxed over channels."""
    masks = _torchcam_masks(inp)
    coeff = 1 / ISCAM_SAMPLES  # accumulated as torchcam does, to the last bit
    total = _score_masks(inp, masks, coeff)
    for i in range(1, ISCAM_SAMPLES):
        coeff += (i + 1) / ISCAM_SAMPLES
        total = total + _score_masks(inp, masks, coeff)
    return _channels((total / ISCAM_SAMPLES).softmax(dim=1), inp.acts)


@register("smoothgradcam++", needs=("noisy",))
def smoothgradcam_pp(inp: CamInputs) -> torch.Tensor:
    """Smooth Grad-CAM++ (Omeiza et al.) as torchcam: Grad-CAM++ over 4 noisy inputs (std 0.3).

    alpha = mean G^2 / (2 mean G^2 + sum_ij mean G^3 * A + 1e-8) with A the clean
    activations; the weights sum_ij alpha * ReLU(G) weight the activations, G and the
    activations there being the last noisy input's (as torchcam).
    """
    acts, grads = inp.run.noisy(inp.method, inp.layer, 0)
    g2, g3 = grads.pow(2), grads.pow(3)
    for s in range(1, SMOOTH_SAMPLES):
        acts, grads = inp.run.noisy(inp.method, inp.layer, s)
        g2, g3 = g2 + grads.pow(2), g3 + grads.pow(3)
    g2, g3 = g2 / SMOOTH_SAMPLES, g3 / SMOOTH_SAMPLES
    alpha = g2 / (2 * g2 + _spatial_sum(g3 * inp.acts) + 1e-8)
    return _channels((alpha * grads.clamp(min=0)).sum(dim=positions(grads)), acts)


# ----------------------------------------------------------------------------- attention

_VIT = "follows a vision transformer's attention over its patch grid"


@register("rollout", gradients=False, needs=("attention",), layerwise=False, image_only=_VIT)
def attention_rollout(inp: CamInputs) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, 2020): :meth:`.attention.Attentions.rollout`."""
    return inp.run.attention(False).rollout()


@register("attention-grad", gradients=False, needs=("attention",), layerwise=False, image_only=_VIT)
def attention_grad(inp: CamInputs) -> torch.Tensor:
    """Chefer, Gur & Wolf (2021): :meth:`.attention.Attentions.relevance`."""
    return inp.run.attention(True).relevance()
