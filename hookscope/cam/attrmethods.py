"""The attribution method registry: one small function per method, registered by name.

A method turns one batch's :class:`~hookscope.cam.attribution.AttrRun` (the inputs, their
targets, and the batched passes it may ask for) into an attribution of the input's shape
(N, C, H, W). The definitions and defaults follow captum 0.9 (``captum.attr``), so the
numbers agree (tests/test_attribute.py).

Torch is imported only inside the methods, so the CLI reads the names without loading it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hookscope.cam.methods import Registry

if TYPE_CHECKING:
    import torch

    from hookscope.cam.attribution import AttrRun

__all__ = ["ATTRIBUTIONS", "Attribution", "attribution_names", "gauss_legendre",
           "get_attribution", "register"]

AttrFn = Callable[["AttrRun"], "torch.Tensor"]


@dataclass(frozen=True)
class Attribution:
    """A registered method: ``baseline``: it compares the input with a baseline (its JSON
    row has the completeness gap); ``rule``: the gradient rule it sets at the
    nonlinearities (``guided`` or ``deeplift``, see :mod:`hookscope.cam.rules`); ``rows``:
    the derived inputs it evaluates per input (progress units)."""

    name: str
    fn: AttrFn
    baseline: bool = False
    rule: str | None = None
    rows: Callable[[AttrRun], int] = lambda run: 1


ATTRIBUTIONS: Registry[Attribution] = Registry("attribution method", Attribution)
register = ATTRIBUTIONS.register
get_attribution = ATTRIBUTIONS.find


def attribution_names() -> list[str]:
    """Registered method names, in registration order."""
    return list(ATTRIBUTIONS)


def gauss_legendre(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """captum's ``gausslegendre`` rule on [0, 1]: the ``steps`` points and their weights
    (float64)."""
    import numpy as np
    import torch

    points, weights = np.polynomial.legendre.leggauss(steps)
    return torch.from_numpy(0.5 * (1 + points)), torch.from_numpy(0.5 * weights)


@register("saliency")
def saliency(run: AttrRun) -> torch.Tensor:
    """|dy/dx| (captum's ``Saliency``, ``abs=True``)."""
    return run.gradient(run.x).abs()


@register("inputxgradient")
def input_x_gradient(run: AttrRun) -> torch.Tensor:
    """x * dy/dx (captum's ``InputXGradient``)."""
    return run.x * run.gradient(run.x)


@register("integrated-gradients", baseline=True, rows=lambda run: run.options.steps)
def integrated_gradients(run: AttrRun) -> torch.Tensor:
    """(x - x0) * the Gauss-Legendre mean of dy/dx along the line from the baseline x0 to x
    (captum's ``IntegratedGradients``: 50 steps, ``gausslegendre``)."""
    import torch

    alphas, weights = gauss_legendre(run.options.steps)
    x, base = run.x, run.baseline
    delta = x - base
    alphas, weights = alphas.to(x), weights.to(x)
    steps = len(alphas)

    def rows(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        owner, k = index // steps, index % steps
        return base[owner] + alphas[k, None, None, None] * delta[owner], owner

    total = torch.zeros_like(x)
    for index, owner, grads in run.gradients(len(x) * steps, rows):
        total.index_add_(0, owner, grads * weights[index % steps, None, None, None])
    return total * delta


def _noisy(run: AttrRun, power: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean over ``samples`` noisy copies of the gradient and of its square."""
    import torch

    x, samples = run.x, run.options.samples
    noise = run.noise()  # (N, samples, C, H, W)

    def rows(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        owner = index // samples
        return x[owner] + noise[owner, index % samples], owner

    first, second = torch.zeros_like(x), torch.zeros_like(x)
    for _, owner, grads in run.gradients(len(x) * samples, rows):
        first.index_add_(0, owner, grads)
        if power == 2:
            second.index_add_(0, owner, grads * grads)
    return first / samples, second / samples


@register("smoothgrad", rows=lambda run: run.options.samples)
def smoothgrad(run: AttrRun) -> torch.Tensor:
    """The mean gradient over noisy copies of the input (captum's ``NoiseTunnel`` of
    ``Saliency(abs=False)``, ``smoothgrad``)."""
    return _noisy(run, 1)[0]


@register("smoothgrad-sq", rows=lambda run: run.options.samples)
def smoothgrad_sq(run: AttrRun) -> torch.Tensor:
    """The mean squared gradient over noisy copies (``smoothgrad_sq``)."""
    return _noisy(run, 2)[1]


@register("vargrad", rows=lambda run: run.options.samples)
def vargrad(run: AttrRun) -> torch.Tensor:
    """The variance of the gradient over noisy copies (``vargrad``: E[g^2] - E[g]^2)."""
    mean, square = _noisy(run, 2)
    return square - mean * mean


@register("occlusion", rows=lambda run: len(run.windows()))
def occlusion(run: AttrRun) -> torch.Tensor:
    """The drop of the target score when a window (all channels) is set to ``value``,
    averaged over the windows that cover each pixel (captum's ``Occlusion``)."""
    import torch

    x = run.x
    masks = run.windows()  # (W, 1, H, W) bool, every window
    count = len(masks)
    value = run.options.value

    def rows(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        owner, w = index // count, index % count
        return torch.where(masks[w], value, x[owner]), owner

    total = torch.zeros_like(x)
    for index, owner, scores in run.scores(len(x) * count, rows):
        drop = (run.clean[owner] - scores).to(x.dtype)
        window = masks[index % count].to(x.dtype).expand(-1, x.shape[1], -1, -1)
        total.index_add_(0, owner, drop[:, None, None, None] * window)
    covered = masks.sum(dim=0).to(x.dtype)  # every pixel: the last window reaches the edge
    return total / covered


@register("guided-backprop", rule="guided")
def guided_backprop(run: AttrRun) -> torch.Tensor:
    """The gradient with each nn.ReLU passing back only positive gradients (captum's
    ``GuidedBackprop``)."""
    return run.gradient(run.x)


@register("deeplift", baseline=True, rule="deeplift")
def deeplift(run: AttrRun) -> torch.Tensor:
    """(x - x0) * the gradient with the rescale rule at each nonlinearity (captum's
    ``DeepLift``; the reference pass runs beside the input's, see :mod:`hookscope.cam.rules`)."""
    return (run.x - run.baseline) * run.gradient(run.x, paired=True)
