"""What every model source shares: what MODEL names, the load options (declared in
:mod:`hookscope.core.load_options`), the loaded model, and the registry the sources join.

A source turns a MODEL string into a :class:`LoadedModel`: the module, its preprocessing,
its labels and a record of what was loaded. Commands never care which source it came from.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from hookscope import __version__
from hookscope.core.errors import HookscopeError, param
from hookscope.core.load_options import LoadOptions
from hookscope.inputs.preprocess import Preprocess

__all__ = ["DeclaredSize", "LoadOptions", "LoadedModel", "ModelSpec", "SOURCES", "Source",
           "register"]


@dataclass(frozen=True)
class ModelSpec:
    """What a MODEL string names, found without loading anything heavy.

    Attributes:
        source: the registered source's name (``torchvision``, ``timm``, ``code``, ``pickle``).
        name: the MODEL string as given.
        target: what the source loads: a torchvision or timm name, ``file.py:Name``, a path.
        task: ``classification``, ``segmentation``, ``detection``, ``video``,
            ``optical_flow``, or ``custom`` when the source cannot tell.
        input_ndim: dimensions of one batch: 5 for video (N, C, T, H, W), else 4.
    """

    source: str
    name: str
    target: str
    task: str = "custom"
    input_ndim: int = 4


@dataclass(frozen=True)
class DeclaredSize:
    """The input size a model declares: exactly ``size`` (``exact``), or at least it.

    Attributes:
        size: (height, width) in pixels.
        exact: the model takes this size only (a ViT's position embeddings), not more.
        origin: where it is declared, for messages (``its weights' min_size``).
    """

    size: tuple[int, int]
    exact: bool
    origin: str

    def takes(self, size: tuple[int, int]) -> bool:
        if self.exact:
            return size == self.size
        return size[0] >= self.size[0] and size[1] >= self.size[1]

    def describe(self) -> str:
        """``224x224 inputs only`` or ``inputs of at least 75x75``."""
        h, w = self.size
        return f"{h}x{w} inputs only" if self.exact else f"inputs of at least {h}x{w}"


@dataclass
class LoadedModel:
    """A model ready to run, with what was loaded and how inputs are preprocessed."""

    name: str
    model: nn.Module
    task: str
    weights_requested: str
    weights_loaded: str
    device: torch.device
    preprocess: Preprocess
    categories: list[str] | None = None
    source: str = "torchvision"
    num_classes: int | None = None
    output_key: str | None = None
    input_ndim: int = 4
    labels_from: str | None = None
    dtype: torch.dtype = torch.float32
    autocast: torch.dtype | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The input size the model declares, when it does (see :class:`DeclaredSize`).
    declared_size: DeclaredSize | None = None

    @property
    def mean(self) -> tuple[float, ...]:
        return self.preprocess.mean

    @property
    def std(self) -> tuple[float, ...]:
        return self.preprocess.std

    @property
    def input_size(self) -> tuple[int, int]:
        return self.preprocess.input_size

    def label(self, index: int) -> str | None:
        """The class label for an output index, when labels are known."""
        if self.categories is not None and 0 <= index < len(self.categories):
            return self.categories[index]
        return None

    def dummy_input(self, batch: int = 1) -> torch.Tensor:
        """A zero batch of the preprocessing's input size, on the model's device."""
        h, w = self.input_size
        c = self.preprocess.channels
        shape = (batch, c, 16, h, w) if self.input_ndim == 5 else (batch, c, h, w)
        return torch.zeros(shape, device=self.device)

    def envelope(self, command: str, inputs: list[str]) -> dict[str, Any]:
        """The JSON envelope every command's document starts with."""
        return {
            "hookscope": __version__,
            "command": command,
            "model": self.name,
            "weights": {"requested": self.weights_requested, "loaded": self.weights_loaded,
                        "num_classes": self.num_classes},
            "device": str(self.device),
            "inputs": list(inputs),
            "source": self.source,
            "labels": self.labels_from,
            "preprocessing": self.preprocess.to_dict(),
            "precision": {"dtype": str(self.dtype).removeprefix("torch."),
                          "autocast": str(self.autocast).removeprefix("torch.")
                          if self.autocast is not None else None},
        }


class Source(Protocol):
    """A way to name and load models."""

    name: str

    def parse(self, spec: str) -> ModelSpec | None:
        """The spec, when this source claims ``spec``; None otherwise. Cheap: no import of
        the model's code and no weights."""

    def load(self, spec: ModelSpec, options: LoadOptions) -> LoadedModel:
        """Build the model (on the CPU, in any mode); the caller moves it and checks it."""


#: Registered sources, asked in order; the first that claims a spec loads it.
SOURCES: list[Source] = []


def register(source: Source) -> Source:
    """Add ``source`` to the registry; a duplicate name is a programming error."""
    if any(s.name == source.name for s in SOURCES):
        raise ValueError(f"model source {source.name!r} is already registered")
    SOURCES.append(source)
    return source


def missing_dependency(package: str, extra: str) -> HookscopeError:
    """The one-line error for an optional dependency that is not installed."""
    return HookscopeError(f"this needs the {package} package: pip install 'hookscope[{extra}]'")


#: Set to 1 to forbid any download attempt (tests and air-gapped CI set it).
OFFLINE_ENV = "HOOKSCOPE_OFFLINE"
_DOWNLOAD_HOST = "download.pytorch.org"
_CHECKPOINT_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors"}


def resolve_device(spec: str = "auto") -> torch.device:
    """Turn ``auto|cpu|cuda|cuda:N|mps`` into a device that exists.

    Raises:
        HookscopeError: the device is not available here.
    """
    spec = spec.strip().lower()
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise HookscopeError(
            f"{param('device')} {spec!r} is not a device name; use auto, cpu, cuda, cuda:N or mps."
        ) from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise HookscopeError(
                f"{param('device')} {spec}: CUDA is not available on this machine; use cpu."
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise HookscopeError(
                f"{param('device')} {spec}: this machine has {count} CUDA device(s), "
                f"numbered 0 to {count - 1}."
            )
        return device
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise HookscopeError(f"{param('device')} {spec}: MPS is not available; use cpu.")
        return device
    raise HookscopeError(f"{param('device')} {spec}: unsupported device type; use auto, cpu, cuda "
                         "or mps.")


def network_available(host: str = _DOWNLOAD_HOST, timeout: float = 2.0) -> bool:
    """Whether weights could be downloaded from ``host``: never with HOOKSCOPE_OFFLINE set."""
    if os.environ.get(OFFLINE_ENV, "").strip() not in ("", "0"):
        return False
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def is_path(spec: str) -> bool:
    """Whether a MODEL or weights spec names a file rather than a name."""
    p = Path(spec)
    return (
        os.sep in spec
        or "/" in spec
        or p.suffix.lower() in _CHECKPOINT_SUFFIXES
        or p.exists()
    )
