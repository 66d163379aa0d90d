"""Shared fixtures. Nothing here downloads: the torch cache points at an empty folder and
HOOKSCOPE_OFFLINE forbids any download attempt."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ["HOOKSCOPE_OFFLINE"] = "1"
os.environ["TORCH_HOME"] = tempfile.mkdtemp(prefix="hookscope-torch-home-")
os.environ.setdefault("COLUMNS", "200")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_images"


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests with one intra-op thread, restoring the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES


@pytest.fixture(scope="session")
def cat_jpg() -> Path:
    return SAMPLES / "cat.jpg"


@pytest.fixture()
def cli():
    """Invoke the CLI in-process: ``cli("stats", "resnet18", path)`` -> click Result."""
    from hookscope.cli import app

    runner = CliRunner()

    def invoke(*args: object, input: bytes | str | None = None):
        return runner.invoke(app, [str(a) for a in args], input=input)

    return invoke


class TinyNet(nn.Module):
    """A small CNN with an in-place ReLU, a shared module called twice, and a classifier."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.block(x))  # the same ReLU module, second call
        return self.fc(self.pool(x).flatten(1))


@pytest.fixture()
def tiny_net() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet().eval()
