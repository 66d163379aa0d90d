"""Gradient rules at the nonlinearities, for guided backpropagation and DeepLift: hook
callbacks (run by the one hook engine, per module call, so a module called several times,
such as resnet's reused ReLU, gets each call's own rule) that replace a module's output
with one whose backward pass is the rule's.

DeepLift follows captum 0.9's ``DeepLift`` (rescale rule): the batch holds the inputs and
then their references, and each supported module's input gradient becomes
``grad_out * (y - y0) / (x - x0)`` (the plain gradient where ``|x - x0| < 1e-10``), with
captum's rules for max pooling and softmax. Unlike captum, which stores the pass on the
module and so refuses a module used twice, each call keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["EPS", "RULE_TYPES", "Swap", "apply_rule", "guided", "writing_copies"]

#: captum's ``eps``: below this input change the plain gradient is used.
EPS = 1e-10
_POOLS: dict[type[nn.Module], tuple[Callable[..., Any], Callable[..., Any]]] = {
    nn.MaxPool1d: (F.max_pool1d, F.max_unpool1d), nn.MaxPool2d: (F.max_pool2d, F.max_unpool2d),
    nn.MaxPool3d: (F.max_pool3d, F.max_unpool3d)}
_ELEMENTWISE = (nn.ReLU, nn.ELU, nn.LeakyReLU, nn.Sigmoid, nn.Tanh, nn.Softplus)
#: The module types each rule acts on (exact types, as captum's).
RULE_TYPES: dict[str, tuple[type[nn.Module], ...]] = {
    "guided": (nn.ReLU,), "deeplift": (*_ELEMENTWISE, *_POOLS, nn.Softmax)}


@contextmanager
def writing_copies(modules: list[nn.Module]) -> Iterator[None]:
    """In-place modules (``ReLU(inplace=True)``) write a new tensor while this runs, so a
    hook still sees each call's input; their flags are restored on any exit."""
    flagged = [m for m in modules if getattr(m, "inplace", False)]
    for m in flagged:
        m.inplace = False  # type: ignore[assignment]
    try:
        yield
    finally:
        for m in flagged:
            m.inplace = True  # type: ignore[assignment]


class Swap(torch.autograd.Function):
    """Forward: ``y``'s values; backward: ``rule(grad_out)`` as the gradient at ``x``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor,  # type: ignore[override]
                rule: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        ctx.rule = rule
        return y.detach().clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        rule, ctx.rule = ctx.rule, None  # break the cycle through the saved graph
        return rule(grad), None, None


def guided(output: torch.Tensor) -> torch.Tensor:
    """A copy of ``output`` (an in-place op that follows cannot reach it) that passes back only
    the positive part of its gradient, after the ReLU's own backward: pytorch-grad-cam's
    ``GuidedBackpropReLU``, without swapping modules."""
    return Swap.apply(output, output.detach(), lambda grad: grad.clamp(min=0))


def _halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs' half of a paired batch and the references' half."""
    half = len(t) // 2
    return t[:half], t[half:]


def _deltas(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x - x0 and y - y0, repeated for both halves (captum's ``_compute_diffs``)."""
    (xi, xr), (yi, yr) = _halves(x), _halves(y)
    return torch.cat([xi - xr] * 2), torch.cat([yi - yr] * 2)


def _rescale(module: nn.Module, x: torch.Tensor, y: torch.Tensor, plain: torch.Tensor,
             grad: torch.Tensor) -> torch.Tensor:
    dx, dy = _deltas(x, y)
    new = torch.where(dx.abs() < EPS, plain, grad * dy / dx)
    if type(module) is nn.Softmax:  # captum's normalisation, per input and its reference
        half = len(new) // 2
        pairs = torch.stack([new[:half], new[half:]], dim=1).flatten(1)
        pairs = pairs - pairs.sum(dim=1, keepdim=True) / pairs.shape[1]
        new = torch.cat([pairs[:, : pairs.shape[1] // 2], pairs[:, pairs.shape[1] // 2:]])
        new = new.reshape(plain.shape)
    return new


def _maxpool(module: Any, x: torch.Tensor, y: torch.Tensor, plain: torch.Tensor,
             grad: torch.Tensor) -> torch.Tensor:
    """captum's ``maxpool`` rule: the output change routed back through the larger of the
    two poolings' positions."""
    pool, unpool = _POOLS[type(module)]
    with torch.no_grad():
        (xi, xr), (yi, yr) = _halves(x), _halves(y)
        dx = torch.cat([xi - xr] * 2)
        top = torch.max(yi, yr)
        dy = torch.cat([top - yr, yi - top])
        _, index = pool(x, module.kernel_size, module.stride, module.padding, module.dilation,
                        module.ceil_mode, True)
        routed = unpool(grad * dy, index, module.kernel_size, module.stride, module.padding,
                        list(x.shape))
        ri, rr = _halves(routed)
        routed = torch.cat([ri + rr] * 2)
    return torch.where(dx.abs() < EPS, plain, routed / dx)


def _deeplift(module: nn.Module, x: torch.Tensor, y: torch.Tensor, graph: torch.Tensor,
              grad: torch.Tensor) -> torch.Tensor:
    """The input gradient of one call under the rescale rule, from its output gradient."""
    (plain,) = torch.autograd.grad(graph, x, grad, retain_graph=False)
    rule = _maxpool if type(module) in _POOLS else _rescale
    return rule(module, x.detach(), y.detach(), plain, grad)


def apply_rule(rule: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
    """The replacement output of one call of ``module`` under ``rule`` (None: keep it)."""
    if not isinstance(output, torch.Tensor) or not output.requires_grad:
        return None
    if rule == "guided":
        return guided(output)
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None or not x.requires_grad or len(x) % 2 or len(output) != len(x):
        return None
    return Swap.apply(x, output.detach(), partial(_deeplift, module, x, output.detach(), output))
