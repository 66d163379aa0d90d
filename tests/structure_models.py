"""Small models of the kinds torchinfo's suite covers (several inputs, dict inputs, recurrent
layers, 1-D convolutions, scripted parts, lazy layers, module lists, shared modules, parameters
outside any submodule), for ``tests/test_structure_models.py``. The ones named on the command
line (``tests/structure_models.py:NAME``) take one image batch ``(N, 3, H, W)``."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


class TwoInputs(nn.Module):
    """Two branches over two tensors of different shapes, fused by a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.vector = nn.Linear(6, 4)
        self.head = nn.Linear(8, 2)

    def forward(self, image: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.image(image).flatten(1), self.vector(vector)], 1))


class DictInput(nn.Module):
    """A forward that takes one dict of tensors (a batch as Hugging Face models take it)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids = nn.Embedding(11, 5)
        self.values = nn.Linear(3, 5)
        self.out = nn.Linear(5, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        mixed = self.ids(batch["ids"]).mean(1) + self.values(batch["values"])
        return self.out(mixed)


class Tagger(nn.Module):
    """Token ids -> embedding -> two-layer bidirectional LSTM with a projection -> tags."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(13, 6)
        self.lstm = nn.LSTM(6, 5, num_layers=2, batch_first=True, bidirectional=True, proj_size=3)
        self.tags = nn.Linear(6, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tags(self.lstm(self.embed(ids))[0])


class Packed(nn.Module):
    """A GRU over a packed batch of sequences of different lengths."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 3)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.gru(pack_padded_sequence(x, lengths, enforce_sorted=False))[1]


class Cells(nn.Module):
    """Each recurrent cell unrolled for three steps (one module, three calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.gru, self.rnn = nn.LSTMCell(4, 3), nn.GRUCell(3, 2), nn.RNNCell(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = None
        for _ in range(3):
            state = self.lstm(x, state)
        return self.rnn(self.gru(state[0]))


class RowReader(nn.Module):
    """An image read row by row by a ReLU RNN (image in, for the command line)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(3 * 8, 5, nonlinearity="relu", batch_first=True)
        self.out = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.permute(0, 2, 1, 3).flatten(2)  # (N, H, C*W)
        return self.out(self.rnn(rows)[0][:, -1])


class Signal(nn.Module):
    """1-D convolutions over ``(N, C, L)`` signals."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(2, 4, 5), nn.BatchNorm1d(4), nn.ReLU(),
                                      nn.Conv1d(4, 4, 3, stride=2, groups=2))
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(2))


class PartlyScripted(nn.Module):
    """An eager model with a scripted block in the middle (image in)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3)
        self.block = torch.jit.script(nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU()))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x)).mean((2, 3)))


class Lazy(nn.Module):
    """Lazy layers, sized by the first forward (image in)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.LazyConv2d(4, 3)
        self.norm = nn.LazyBatchNorm2d()
        self.fc = nn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.conv(x)).mean((2, 3)))


class Listed(nn.Module):
    """A ModuleList, a module shared by two places, a tied weight and a parameter used in the
    model's own forward (image in)."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Conv2d(4, 4, 3, padding=1)
        self.stem = nn.Conv2d(3, 4, 1)
        self.blocks = nn.ModuleList([shared, nn.ReLU(), shared])
        self.again = shared  # the same module under a second name
        self.scale = nn.Parameter(torch.ones(4, 4))  # used by a matmul in forward
        self.encode, self.decode = nn.Linear(4, 6, bias=False), nn.Linear(4, 6)
        self.decode.weight = self.encode.weight  # tied: one tensor, two modules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        pooled = x.mean((2, 3)) @ self.scale
        return self.encode(pooled) + self.decode(pooled)


class AuxHead(nn.Module):
    """An auxiliary head that runs only in training, as GoogLeNet's and Inception's do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.aux = nn.Linear(4, 2)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.body(x).mean((2, 3))
        out = self.head(pooled)
        return out + self.aux(pooled) if self.training else out


class Bilinear(nn.Module):
    """``nn.Bilinear``, whose ``aten._trilinear`` has no FLOP formula (image in)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.pair = nn.Bilinear(4, 4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.fc(x.mean((2, 3)))
        return self.pair(v, v)
