"""What every model source shares: what MODEL names, the loaded model, and the registry the
sources join. Commands never care which source a :class:`LoadedModel` came from."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from hookscope.core.errors import HookscopeError, param
from hookscope.core.files import envelope
from hookscope.core.load_options import LoadOptions
from hookscope.inputs.preprocess import Preprocess

__all__ = ["DeclaredSize", "LoadOptions", "LoadedModel", "ModelSpec", "SOURCES", "Source",
           "register"]


@dataclass(frozen=True)
class ModelSpec:
    """What a MODEL string names, found without loading anything heavy."""

    source: str  # the registered source's name
    name: str  # the MODEL string as given
    target: str  # what the source loads: a torchvision or timm name, file.py:Name, a path
    #: classification, segmentation, detection, video, optical_flow, or custom (unknown)
    task: str = "custom"
    input_ndim: int = 4  # 5 for video (N, C, T, H, W)


@dataclass(frozen=True)
class DeclaredSize:
    """The (height, width) a model declares it takes: exactly (``exact``), or at least.
    ``origin`` says where it is declared, for messages (``its weights' min_size``)."""

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
    preprocess: Preprocess
    device: torch.device = torch.device("cpu")  # where the source builds it; load() moves it
    categories: list[str] | None = None
    source: str = "torchvision"
    num_classes: int | None = None
    output_key: str | None = None
    input_ndim: int = 4
    labels_from: str | None = None
    dtype: torch.dtype = torch.float32
    autocast: torch.dtype | None = None
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

    def dummy_input(self, batch: int = 1) -> Any:
        """A zero batch of the preprocessing's input size, on the model's device (no
        arguments, ``()``, for a forward that takes none)."""
        from hookscope.core.arguments import takes_nothing

        if takes_nothing(self.model):
            return ()
        h, w = self.input_size
        c = self.preprocess.channels
        shape = (batch, c, 16, h, w) if self.input_ndim == 5 else (batch, c, h, w)
        return torch.zeros(shape, device=self.device)

    def envelope(self, command: str, inputs: list[str]) -> dict[str, Any]:
        """The JSON envelope every command's document starts with."""
        autocast = str(self.autocast).removeprefix("torch.") if self.autocast is not None else None
        return envelope(
            command, model=self.name, device=str(self.device), inputs=inputs,
            weights={"requested": self.weights_requested, "loaded": self.weights_loaded,
                     "num_classes": self.num_classes},
            source=self.source, labels=self.labels_from, preprocessing=self.preprocess.to_dict(),
            precision={"dtype": str(self.dtype).removeprefix("torch."), "autocast": autocast})


@dataclass(frozen=True)
class Source:
    """A way to name and load models: ``parse`` claims a MODEL string cheaply (no model code,
    no weights) or returns None; ``load`` builds the model on the CPU, and the caller moves
    and checks it."""

    name: str
    parse: Callable[[str], ModelSpec | None]
    load: Callable[[ModelSpec, LoadOptions], LoadedModel]


#: Registered sources, asked in order; the first that claims a spec loads it.
SOURCES: list[Source] = []


def register(source: Source) -> Source:
    """Add ``source`` to the registry; a duplicate name is a programming error."""
    if any(s.name == source.name for s in SOURCES):
        raise ValueError(f"model source {source.name!r} is already registered")
    SOURCES.append(source)
    return source


def prefixed(source: str, prefix: str, task: str) -> Callable[[str], ModelSpec | None]:
    """A ``parse`` that claims the MODEL strings starting with ``prefix`` (``timm:``)."""
    def parse(spec: str) -> ModelSpec | None:
        if not spec.startswith(prefix):
            return None
        return ModelSpec(source, spec, spec[len(prefix):], task)

    return parse


def warn_random(why: str | None, seed: int) -> str:
    """Warn why ``weights=auto`` fell back to random weights (unless ``why`` is None, as for
    ``weights=none``); returns what ``weights.loaded`` records."""
    if why is not None:
        logging.getLogger("hookscope").warning(
            f"{why}; using random initialisation (seed {seed}), so predictions are "
            "meaningless. weights=none (--weights none) silences this.")
    return f"random (seed {seed})"


#: A model as built, and what ``weights.loaded`` records.
Built = tuple[nn.Module, str]


def pretrained(what: str, options: LoadOptions, *, classes: int | None, where: str | None,
               host: str, auto: bool, random: Callable[[str | None], Built],
               build: Callable[[], Built]) -> Built:
    """The pretrained weights ``what`` (``build``), unless ``num_classes`` is not their
    ``classes`` or they are not cached (``where`` names the cache; None: cached) and
    ``host`` is out of reach: then ``auto`` falls back to ``random`` (given why), else one
    error."""
    if options.num_classes not in (None, classes):
        if auto:
            return random(None)
        raise HookscopeError(
            f"{param('num_classes')} {options.num_classes} needs random or checkpoint weights: "
            f"{what} has {classes} classes.")
    if where is not None and not network_available(host):
        missing = f"{what} is not in {where} and cannot be downloaded"
        if auto:
            return random(missing)
        raise HookscopeError(f"{missing} (no network). Use {param('weights')} none or a local checkpoint.")
    return build()


def import_optional(package: str, extra: str) -> ModuleType:
    """An optional dependency, or the one-line install hint when it is missing."""
    try:
        return import_module(package)
    except ImportError:
        raise HookscopeError(f"this needs the {package} package: pip install 'hookscope[{extra}]'") from None


_CHECKPOINT_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors", ".pkl"}


def resolve_device(spec: str = "auto") -> torch.device:
    """Turn ``auto|cpu|cuda|cuda:N|mps`` into a device that exists here, or refuse it."""
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise HookscopeError(
            f"{param('device')} {spec!r} is not a device name; use auto, cpu, cuda, cuda:N or mps.") from None
    problem = None
    if device.type == "cuda" and not torch.cuda.is_available():
        problem = "CUDA is not available on this machine; use cpu"
    elif device.type == "cuda" and (device.index or 0) >= (count := torch.cuda.device_count()):
        problem = f"this machine has {count} CUDA device(s), numbered 0 to {count - 1}"
    elif device.type == "mps" and not torch.backends.mps.is_available():
        problem = "MPS is not available; use cpu"
    elif device.type not in ("cpu", "cuda", "mps"):
        problem = "unsupported device type; use auto, cpu, cuda or mps"
    if problem is not None:
        raise HookscopeError(f"{param('device')} {spec}: {problem}.")
    return device


def network_available(host: str = "download.pytorch.org", timeout: float = 2.0) -> bool:
    """Whether weights could be downloaded from ``host``: never with HOOKSCOPE_OFFLINE set
    (tests and air-gapped CI set it)."""
    if os.environ.get("HOOKSCOPE_OFFLINE", "").strip() not in ("", "0"):
        return False
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def hub_file(url: str) -> Path:
    """Where torch hub caches the file at ``url``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


def is_path(spec: str) -> bool:
    """Whether a MODEL or weights spec names a file rather than a name."""
    path = Path(spec)
    return "/" in spec or os.sep in spec or path.suffix.lower() in _CHECKPOINT_SUFFIXES \
        or path.exists()
