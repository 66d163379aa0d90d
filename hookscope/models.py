"""Models, weights, preprocessing and devices, through torchvision's public API only."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from hookscope import __version__
from hookscope.errors import HookscopeError, clip, param, suggest

log = logging.getLogger("hookscope")

#: Set to 1 to forbid any download attempt (tests and air-gapped CI set it).
OFFLINE_ENV = "HOOKSCOPE_OFFLINE"
_DOWNLOAD_HOST = "download.pytorch.org"
_CHECKPOINT_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors"}
#: Input sizes hookscope accepts (pixels, the crop or resize side).
MIN_SIZE, MAX_SIZE = 8, 8192
#: Activation memory per input pixel, in float32 values, assumed by :func:`check_batch_memory`:
#: a typical stem's output (64 channels at half resolution: 16 values per pixel), about
#: three such tensors live at once.
_VALUES_PER_PIXEL = 48


@lru_cache(maxsize=1)
def model_tasks() -> dict[str, str]:
    """Every torchvision model name mapped to its task (classification, detection, ...)."""
    import torchvision.models as tvm
    from torchvision.models import list_models

    groups = {
        "segmentation": tvm.segmentation,
        "detection": tvm.detection,
        "video": tvm.video,
        "optical_flow": tvm.optical_flow,
        "quantization": tvm.quantization,
        "classification": tvm,
    }
    tasks: dict[str, str] = {}
    for task, module in groups.items():
        for name in list_models(module):
            tasks.setdefault(name, task)
    for name in list_models():
        tasks.setdefault(name, "other")
    return tasks


def input_ndim(name: str) -> int:
    """Dimensions of one input batch for a model: 5 for video (N, C, T, H, W), else 4."""
    return 5 if model_tasks().get(name) == "video" else 4


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


@dataclass
class LoadedModel:
    """A model ready to run, with what was loaded and how inputs are preprocessed."""

    name: str
    model: nn.Module
    task: str
    weights_requested: str
    weights_loaded: str
    device: torch.device
    preprocess: Callable[[Any], torch.Tensor]
    categories: list[str] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    input_size: tuple[int, int] = (224, 224)

    @property
    def input_ndim(self) -> int:
        """Dimensions of one batch: 5 for video models (N, C, T, H, W), else 4."""
        return input_ndim(self.name)

    def label(self, index: int) -> str | None:
        """The class label for an output index, when the weights' metadata has one."""
        if self.categories is not None and 0 <= index < len(self.categories):
            return self.categories[index]
        return None

    def dummy_input(self, batch: int = 1) -> torch.Tensor:
        """A zero batch of the weights' default input size, on the model's device."""
        h, w = self.input_size
        shape = (batch, 3, 16, h, w) if self.input_ndim == 5 else (batch, 3, h, w)
        return torch.zeros(shape, device=self.device)

    def envelope(self, command: str, inputs: list[str]) -> dict[str, Any]:
        """The JSON envelope every command's document starts with."""
        return {
            "hookscope": __version__,
            "command": command,
            "model": self.name,
            "weights": {"requested": self.weights_requested, "loaded": self.weights_loaded},
            "device": str(self.device),
            "inputs": list(inputs),
        }


def _weights_enum(name: str) -> Any | None:
    from torchvision.models import get_model_weights

    try:
        return get_model_weights(name)
    except (ValueError, KeyError):
        return None


def check_model_name(name: str) -> str:
    """Raise with the closest names when ``name`` is not a torchvision model."""
    tasks = model_tasks()
    if name in tasks:
        return name
    raise HookscopeError(
        f"Unknown model {name!r}.{suggest(name, tasks)} Run `hookscope models` to list them."
    )


def _cached_file(weights: Any) -> Path:
    filename = os.path.basename(urlparse(weights.url).path)
    return Path(torch.hub.get_dir()) / "checkpoints" / filename


def _network_available(timeout: float = 2.0) -> bool:
    if os.environ.get(OFFLINE_ENV, "").strip() not in ("", "0"):
        return False
    try:
        with socket.create_connection((_DOWNLOAD_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _is_path(spec: str) -> bool:
    p = Path(spec)
    return (
        os.sep in spec
        or "/" in spec
        or p.suffix.lower() in _CHECKPOINT_SUFFIXES
        or p.exists()
    )


def _build(name: str, weights: Any | None, seed: int) -> nn.Module:
    import inspect

    from torchvision.models import get_model, get_model_builder

    # Seeded in a forked RNG so loading a model leaves the caller's global RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        kwargs: dict[str, Any] = {}
        if name.startswith("quantized_") and weights is not None:
            kwargs["quantize"] = True
        if "weights_backbone" in inspect.signature(get_model_builder(name)).parameters:
            # Otherwise detection and segmentation builders download a backbone.
            kwargs["weights_backbone"] = None
        try:
            return get_model(name, weights=weights, **kwargs)
        except (OSError, RuntimeError) as exc:
            if weights is None:
                raise
            raise HookscopeError(
                f"Could not download the weights {weights} for {name} ({exc.__class__.__name__}: "
                f"{exc}). Use {param('weights')} none for random initialisation, or a local checkpoint."
            ) from exc


def _unwrap_state_dict(obj: Any, path: Path) -> Mapping[str, torch.Tensor] | nn.Module:
    if isinstance(obj, nn.Module):
        return obj
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model", "model_state_dict"):
            if key in obj and isinstance(obj[key], (Mapping, nn.Module)):
                return _unwrap_state_dict(obj[key], path)
        if obj and all(isinstance(k, str) for k in obj) and all(
            isinstance(v, torch.Tensor) for v in obj.values()
        ):
            keys = list(obj)
            if all(k.startswith("module.") for k in keys):  # saved from DataParallel
                return {k[len("module."):]: v for k, v in obj.items()}
            return obj
    raise HookscopeError(
        f"{path}: not a checkpoint hookscope can use; expected a state_dict, or a dict with a "
        "'state_dict' or 'model' entry."
    )


def _is_pickle(path: Path) -> bool:
    """Whether ``path`` is a ``torch.save`` archive (zip) or a pickle (protocol 2 or later)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
    except OSError:
        return False
    return zipfile.is_zipfile(path) or (len(head) == 2 and head[0] == 0x80 and head[1] >= 2)


def read_checkpoint(path: Path, *, trust: bool = False) -> Mapping[str, torch.Tensor] | nn.Module:
    """Read a local checkpoint: a state_dict, a dict holding one, or ``.safetensors``.

    Raises:
        HookscopeError: missing, unreadable, not a checkpoint, or an untrusted pickle.
    """
    if not path.exists():
        raise HookscopeError(f"Weights file not found: {path}.")
    if path.is_dir():
        raise HookscopeError(f"{path} is a directory; {param('weights')} takes a checkpoint file.")
    if path.suffix.lower() == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return _unwrap_state_dict(load_file(str(path), device="cpu"), path)
        except (SafetensorError, OSError, ValueError) as exc:
            raise HookscopeError(f"{path}: not a readable .safetensors file ({exc}).") from None
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as exc:
        if not trust and _is_pickle(path):
            raise HookscopeError(
                f"{path}: the file holds Python objects that need arbitrary unpickling, which "
                f"can run code. If it is a checkpoint from a source you trust, set "
                f"{param('trust_checkpoint')}."
            ) from None
        raise HookscopeError(f"{path}: not a PyTorch checkpoint ({clip(str(exc), 120)}).") from None
    except Exception as exc:  # torch.load raises many types on files that aren't checkpoints
        raise HookscopeError(
            f"{path}: not a PyTorch checkpoint ({exc.__class__.__name__})."
        ) from None
    return _unwrap_state_dict(obj, path)


def _load_checkpoint(model: nn.Module, name: str, path: Path, trust: bool) -> nn.Module:
    loaded = read_checkpoint(path, trust=trust)
    if isinstance(loaded, nn.Module):
        return loaded
    own = model.state_dict()
    wrong = [(k, list(v.shape), list(own[k].shape)) for k, v in loaded.items()
             if k in own and isinstance(v, torch.Tensor) and v.shape != own[k].shape]
    if wrong:
        key, theirs, ours = wrong[0]
        raise HookscopeError(
            f"{path} does not fit {name}: {len(wrong)} tensor(s) have another shape, e.g. "
            f"{key} is {theirs} in the file and {ours} in the model. Is it a checkpoint for "
            "another architecture?"
        )
    missing, unexpected = model.load_state_dict(loaded, strict=False)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s), e.g. {', '.join(missing[:3])}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s), e.g. {', '.join(unexpected[:3])}")
        raise HookscopeError(
            f"{path} does not fit {name}: {'; '.join(parts)}. "
            "Is it a checkpoint for another architecture?"
        )
    return model


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(round(v * factor) for v in value)
    return round(value * factor)


def _preprocess_for(weights: Any | None, size: int | None) -> Callable[..., Any]:
    """The weights' own transforms, rescaled so the crop (or resize) is ``size`` when given."""
    import inspect

    from torchvision.transforms._presets import ImageClassification

    factory: Any = weights.transforms if weights is not None else ImageClassification
    cls = getattr(factory, "func", factory)
    keywords: dict[str, Any] = dict(getattr(factory, "keywords", None) or {})
    params = inspect.signature(cls).parameters
    if size is not None:
        if not MIN_SIZE <= size <= MAX_SIZE:
            raise HookscopeError(f"{param('size')} must be between {MIN_SIZE} and {MAX_SIZE} "
                                 f"pixels, not {size}.")
        key = "crop_size" if "crop_size" in params else "resize_size" if "resize_size" in params else None
        if key is None:
            log.info("size is ignored: this model's preprocessing does not resize")
        else:
            current = keywords.get(key, params[key].default)
            if current is inspect.Parameter.empty:
                current = 224
            first = current[0] if isinstance(current, (tuple, list)) else current
            factor = size / first
            for k in ("crop_size", "resize_size"):
                if k in params:
                    value = keywords.get(k, params[k].default)
                    if value is not inspect.Parameter.empty and value is not None:
                        keywords[k] = _scaled(value, factor)
    if "crop_size" in params and "crop_size" not in keywords:
        keywords["crop_size"] = 224
    return cls(**keywords)


def _input_size(transform: Any) -> tuple[int, int]:
    for attr in ("crop_size", "resize_size"):
        value = getattr(transform, attr, None)
        if value:
            v = value if isinstance(value, (tuple, list)) else [value]
            return (int(v[0]), int(v[-1]))
    return (224, 224)


def load_model(
    name: str,
    *,
    weights: str = "auto",
    seed: int = 0,
    device: str | torch.device = "cpu",
    size: int | None = None,
    trust_checkpoint: bool = False,
) -> LoadedModel:
    """Build a torchvision model with the requested weights, in eval mode, on ``device``.

    Args:
        name: any name in ``torchvision.models.list_models()``.
        weights: ``auto`` (DEFAULT weights when cached or downloadable, else random with a
            warning), ``DEFAULT`` or an enum member name, ``none`` (random, seeded), or a path.
        seed: seed for random initialisation.
        device: a device or a spec: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        size: override the preprocessing's crop or resize size.
        trust_checkpoint: allow checkpoints that need arbitrary unpickling.

    Raises:
        HookscopeError: unknown model or weights, unreadable checkpoint, unavailable device.
    """
    check_model_name(name)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    enum = _weights_enum(name)
    default = getattr(enum, "DEFAULT", None) if enum is not None else None
    spec = weights.strip()
    random_label = f"random (seed {seed})"

    if spec.lower() == "none":
        model, chosen, loaded = _build(name, None, seed), None, random_label
    elif spec.lower() == "auto":
        if default is not None and (_cached_file(default).exists() or _network_available()):
            model, chosen = _build(name, default, seed), default
            loaded = str(default).split(".", 1)[-1]
        else:
            why = "this model has no pretrained weights" if default is None else (
                f"{default} is not in the torch cache ({_cached_file(default).parent}) and "
                "cannot be downloaded"
            )
            msg = (f"{why}; using random initialisation (seed {seed}), so predictions are "
                   "meaningless. weights=none (--weights none) silences this.")
            log.warning(msg)
            model, chosen, loaded = _build(name, None, seed), None, random_label
    elif _is_path(spec):
        path = Path(spec).expanduser()
        if not path.exists():
            raise HookscopeError(f"Weights file not found: {spec}.")
        model = _load_checkpoint(_build(name, None, seed), name, path, trust_checkpoint)
        chosen, loaded = None, f"file:{path}"
    else:
        if enum is None:
            raise HookscopeError(f"{name} has no pretrained weights; use {param('weights')} none.")
        member = spec.split(".")[-1]
        members = [m.name for m in enum]
        if member.upper() == "DEFAULT":
            chosen = default
        elif member in members:
            chosen = enum[member]
        else:
            raise HookscopeError(
                f"{enum.__name__} has no member {spec!r}.{suggest(member, members)} "
                f"Choose DEFAULT, {', '.join(members)}, auto, none, or a checkpoint path."
            )
        if not _cached_file(chosen).exists() and not _network_available():
            raise HookscopeError(
                f"{chosen} is not in the torch cache ({_cached_file(chosen).parent}) and cannot "
                f"be downloaded (no network). Use {param('weights')} none or a local checkpoint."
            )
        model = _build(name, chosen, seed)
        loaded = str(chosen).split(".", 1)[-1]

    meta_weights = chosen if chosen is not None else default
    transform = _preprocess_for(meta_weights, size)
    categories = None
    if meta_weights is not None:
        categories = list(meta_weights.meta.get("categories") or []) or None
    mean = getattr(transform, "mean", None)
    std = getattr(transform, "std", None)
    model = model.to(dev).eval()
    return LoadedModel(
        name=name,
        model=model,
        task=model_tasks().get(name, "other"),
        weights_requested=weights,
        weights_loaded=loaded,
        device=dev,
        preprocess=transform,
        categories=categories,
        mean=tuple(mean) if mean is not None else None,
        std=tuple(std) if std is not None else None,
        input_size=_input_size(transform),
    )


def check_supported(name: str, *, needs_logits: bool = False,
                    needs_images: bool = False) -> None:
    """Refuse, before the model is built, a model kind an analysis cannot run.

    Args:
        name: the model's name.
        needs_logits: the analysis explains or differentiates (N, classes) class logits.
        needs_images: the analysis needs image batches (N, C, H, W), not video clips.

    Raises:
        HookscopeError: optical-flow models (two frames per input) anywhere; detection and
            segmentation models where class logits are needed; video where images are.
    """
    task = model_tasks().get(name, "other")
    if task == "optical_flow":
        raise HookscopeError(
            f"{name} is an optical-flow model: it takes two frames per input, and hookscope "
            "runs models on one batch of images (classification, segmentation, detection) or "
            "clips (video)."
        )
    if needs_logits and task in ("detection", "segmentation"):
        raise HookscopeError(
            f"{name} is a {task} model; this analysis needs a classifier's (N, classes) "
            f"logits. {task.capitalize()} models work with stats, layers, debug and features."
        )
    if needs_images and input_ndim(name) != 4:
        raise HookscopeError(f"{name} is a video model; this analysis explains image "
                             "classifiers (N, C, H, W).")


def available_memory(device: torch.device) -> int | None:
    """Bytes free for tensors on ``device``, or None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_batch_memory(loaded: LoadedModel, batch_size: int) -> None:
    """Refuse a batch whose activations clearly cannot fit in memory, before it is made.

    The estimate is deliberately rough (see ``_VALUES_PER_PIXEL``); it catches ``size``
    100000 or ``batch_size`` 100000, which would otherwise end in the out-of-memory killer.

    Raises:
        HookscopeError: the batch size is out of range or the estimate exceeds the memory
            available on the model's device.
    """
    if not 1 <= batch_size <= 4096:
        raise HookscopeError(f"{param('batch_size')} must be between 1 and 4096, not "
                             f"{batch_size}.")
    h, w = loaded.input_size
    frames = 16 if loaded.input_ndim == 5 else 1
    need = batch_size * h * w * frames * _VALUES_PER_PIXEL * 4
    free = available_memory(loaded.device)
    if free is not None and need > free:
        raise HookscopeError(
            f"{batch_size} input(s) of {h}x{w} need about {need / 2**30:.1f} GiB for "
            f"activations, and {loaded.device} has {free / 2**30:.1f} GiB available; lower "
            f"{param('size')} or {param('batch_size')}."
        )
