"""The planted faults' pieces, as a user's bug would make them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class NanGrad(torch.autograd.Function):
    """The identity forward, NaN backward: a custom ``autograd.Function`` with a bad backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * torch.nan


class BlowUp(torch.autograd.Function):
    """The identity forward, a backward that multiplies the gradient by 1e9: a mis-scaled
    custom ``autograd.Function`` (a gradient-reversal layer with a huge factor, say)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 1e9


def in_forward(module: nn.Module, before: Any = None, after: Any = None) -> None:
    """Make ``module``'s own forward apply ``before`` to its input and ``after`` to its output
    (the code runs inside the module's call, so the module made what it makes)."""
    inner = module.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        out = inner(before(x) if before else x)
        return after(out) if after else out

    module.forward = forward  # type: ignore[method-assign]


def sqrt_of_square(x: torch.Tensor) -> torch.Tensor:
    """``|x|`` written as a user might: finite forward, NaN backward wherever ``x == 0``."""
    return torch.sqrt(x * x)


def nan_grad(x: torch.Tensor) -> torch.Tensor:
    return NanGrad.apply(x)


def blow_up(x: torch.Tensor) -> torch.Tensor:
    return BlowUp.apply(x)


@torch.no_grad()
def poison(param: torch.Tensor, value: float = float("nan")) -> None:
    """One weight set to ``value``."""
    param.view(-1)[0] = value


@torch.no_grad()
def scale(param: torch.Tensor, factor: float) -> None:
    param.mul_(factor)
