"""The seeded tiny model the golden outputs are recorded with (``tests/golden.py``)."""

from __future__ import annotations

import torch
from torch import nn


class Tiny(nn.Module):
    """Two conv blocks, a pool and a classifier: every command runs on it in milliseconds.

    The logits are scaled by 10, so that the classes' probabilities are far apart: a near tie
    would let float noise reorder the predictions from one CPU to another.
    """

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 10 * self.fc(self.pool(self.features(x)).flatten(1))
