"""What FullGrad and guided backpropagation need: the biases, and :class:`GuidedGrad`.

Guided backpropagation wraps every ``nn.ReLU``'s output in :class:`GuidedGrad`, whose backward
keeps only positive gradients (with the ReLU's own backward: pytorch-grad-cam's
``GuidedBackpropReLU``), so no module is swapped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["GuidedGrad", "bias_of", "deprocess", "has_bias"]


class GuidedGrad(torch.autograd.Function):
    """Identity forward; backward passes only the positive part of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.clone()  # a new tensor: an in-place op that follows cannot reach the input

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad.clamp(min=0)


def has_bias(module: nn.Module) -> bool:
    """A Conv2d or BatchNorm2d (exactly those types, as pytorch-grad-cam) with a bias."""
    if type(module) is nn.Conv2d:
        return module.bias is not None
    if type(module) is nn.BatchNorm2d:
        return module.bias is not None and module.running_mean is not None
    return False


def bias_of(module: nn.Module) -> torch.Tensor:
    """The bias a module adds to each channel: a BatchNorm's folds in its running mean."""
    bias = module.bias
    assert isinstance(bias, torch.Tensor)
    if isinstance(module, nn.BatchNorm2d):
        mean, var = module.running_mean, module.running_var
        assert mean is not None and var is not None
        weight = module.weight if module.weight is not None else torch.ones_like(bias)
        bias = bias - mean * weight / torch.sqrt(var + module.eps)
    return bias.detach()


def deprocess(values: np.ndarray) -> np.ndarray:
    """pytorch-grad-cam's ``deprocess_image``: standardise, scale by 0.1 around 0.5, uint8."""
    img = values - np.mean(values)
    img = img / (np.std(img) + 1e-5)
    img = np.clip(img * 0.1 + 0.5, 0, 1)
    return (img * 255).astype(np.uint8)
