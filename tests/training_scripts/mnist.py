"""pytorch/examples ``mnist/main.py``: its ``Net``, Adadelta, ``nll_loss`` and ``StepLR``, on
random 28x28 images. Faults: ``nan_weight`` (fc1 at step 2), ``nan_pixels`` (step 1),
``sqrt_between`` (a sqrt of dropout1's output in the model's own code), ``fc2_tiny``
(fc2.weight x 1e-6), ``dead_conv1`` (conv1's bias -100, ReLU dead after it)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR

import hookscope

from .faults import poison, scale


class Net(nn.Module):
    def __init__(self, fault: str | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)
        self.fault = fault

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout1(x)
        if self.fault == "sqrt_between":
            x = torch.sqrt(x)  # exact zeros from the dropout: finite forward, inf backward
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def main(log_dir: Path, fault: str | None = None, steps: int = 3, every: int = 1) -> None:
    torch.manual_seed(1)
    model = Net(fault)
    if fault == "fc2_tiny":
        scale(model.fc2.weight, 1e-6)
    if fault == "dead_conv1":
        torch.nn.init.constant_(model.conv1.bias, -100.0)
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    batches = [(torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))) for _ in range(steps)]
    model.train()
    with hookscope.watch(model, log_dir, every=every) as w:
        for batch_idx, (data, target) in enumerate(batches):
            if fault == "nan_weight" and batch_idx == 2:
                poison(model.fc1.weight)
            if fault == "nan_pixels" and batch_idx == 1:
                data[0, 0, 5, 5] = float("nan")
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            w.step(loss)
    scheduler.step()
