"""pytorch/examples ``dcgan/main.py``: its ``Generator`` and ``Discriminator`` (64 px, tiny
widths), ``BCELoss``, two Adam optimisers, the D-then-G loop, on random "real" images; one
watch per model, both stepped at the end of an iteration. Faults: ``nan_d_forward`` (a NaN
weight in netD's main.2 at step 1: the BCELoss raises), ``nan_pixels`` (a NaN in the real
batch at step 1: the BCELoss raises), ``sqrt_g_backward`` (``sqrt(x*x)`` of netG's last
ConvTranspose's input), ``dead_g`` (netG's first BatchNorm's bias -100: main.2 is dead)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn, optim

import hookscope

from .faults import in_forward, poison, sqrt_of_square

nz, ngf, ndf, nc = 8, 4, 4, 3


def weights_init(m: nn.Module) -> None:
    if type(m).__name__.find("Conv") != -1:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif type(m).__name__.find("BatchNorm") != -1:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def _up(cin: int, cout: int, stride: int, pad: int) -> list[nn.Module]:
    return [nn.ConvTranspose2d(cin, cout, 4, stride, pad, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]


def _down(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 4, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.2, inplace=True)]


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(*_up(nz, ngf * 8, 1, 0), *_up(ngf * 8, ngf * 4, 2, 1),
                                  *_up(ngf * 4, ngf * 2, 2, 1), *_up(ngf * 2, ngf, 2, 1),
                                  nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                                  *_down(ndf, ndf * 2), *_down(ndf * 2, ndf * 4), *_down(ndf * 4, ndf * 8),
                                  nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x).view(-1, 1).squeeze(1)


def main(log_dir: Path, fault: str | None = None, steps: int = 3, every: int = 1) -> None:
    torch.manual_seed(1)
    netG, netD = Generator(), Discriminator()
    netG.apply(weights_init)
    netD.apply(weights_init)
    if fault == "sqrt_g_backward":
        in_forward(netG.main[12], before=sqrt_of_square)
    if fault == "dead_g":
        torch.nn.init.constant_(netG.main[1].bias, -100.0)
    criterion = nn.BCELoss()
    real_label, fake_label = 1.0, 0.0
    optimizerD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    batches = [torch.rand(2, nc, 64, 64) * 2 - 1 for _ in range(steps)]
    with hookscope.watch(netD, log_dir / "D", every=every) as wD, \
            hookscope.watch(netG, log_dir / "G", every=every) as wG:
        for i, real in enumerate(batches):
            if fault == "nan_d_forward" and i == 1:
                poison(netD.main[2].weight)
            if fault == "nan_pixels" and i == 1:
                real[0, 0, 0, 0] = float("nan")
            # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
            netD.zero_grad()
            label = torch.full((real.size(0),), real_label)
            errD_real = criterion(netD(real), label)
            errD_real.backward()
            fake = netG(torch.randn(real.size(0), nz, 1, 1))
            label.fill_(fake_label)
            errD_fake = criterion(netD(fake.detach()), label)
            errD_fake.backward()
            optimizerD.step()
            # (2) Update G: maximize log(D(G(z)))
            netG.zero_grad()
            label.fill_(real_label)
            errG = criterion(netD(fake), label)
            errG.backward()
            optimizerG.step()
            wD.step(errD_real + errD_fake)
            wG.step(errG)
