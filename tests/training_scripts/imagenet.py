"""pytorch/examples ``imagenet/main.py --dummy -a resnet18``: torchvision's resnet18,
``CrossEntropyLoss``, SGD with momentum and weight decay, ``StepLR``, on ``FakeData`` at 32 px.
Faults: ``sqrt_shared`` (``sqrt(x*x)`` of layer2.0.conv1's input, which
layer2.0.downsample.0 reads too), ``dead_relu`` (bn1's bias -100), ``nan_pixels`` (step 1),
``custom_backward`` (a NaN-backward ``autograd.Function`` in layer3.1.conv2), ``grad_blowup``
(a custom backward at layer4.0.conv1's input multiplies the gradient by 1e9: every gradient below
it explodes, the loss and layer4 stay as they were)."""

from __future__ import annotations

from pathlib import Path

import torch
import torchvision
from torch import nn
from torch.optim.lr_scheduler import StepLR

import hookscope

from .faults import blow_up, in_forward, nan_grad, sqrt_of_square


def main(log_dir: Path, fault: str | None = None, steps: int = 2, every: int = 1) -> None:
    torch.manual_seed(1)
    model = torchvision.models.__dict__["resnet18"]()
    if fault == "sqrt_shared":
        in_forward(model.layer2[0].conv1, before=sqrt_of_square)
    if fault == "custom_backward":
        in_forward(model.layer3[1].conv2, after=nan_grad)
    if fault == "dead_relu":
        torch.nn.init.constant_(model.bn1.bias, -100.0)
    if fault == "grad_blowup":
        in_forward(model.layer4[0].conv1, before=blow_up)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)
    data = torchvision.datasets.FakeData(2 * steps, (3, 32, 32), 1000,
                                         torchvision.transforms.ToTensor(), random_offset=1)
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    model.train()
    with hookscope.watch(model, log_dir, every=every) as w:
        for i, (images, target) in enumerate(loader):
            if fault == "nan_pixels" and i == 1:
                images[1, 0, 3, 3] = float("nan")
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            w.step(loss)
    scheduler.step()
