"""The torchvision model source: names, tasks, weights, fine-tuned checkpoints and their
preprocessing, through torchvision's public API only; devices and memory checks."""

from __future__ import annotations

import inspect
import logging
import os
import socket
import warnings
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from hookscope.checkpoints import Checkpoint, build_to_fit
from hookscope.checkpoints import read_checkpoint as read_checkpoint  # re-exported
from hookscope.errors import HookscopeError, param, suggest
from hookscope.preprocess import MAX_SIZE, MIN_SIZE, Preprocess
from hookscope.sources.base import LoadedModel, LoadOptions, ModelSpec

log = logging.getLogger("hookscope")

#: Set to 1 to forbid any download attempt (tests and air-gapped CI set it).
OFFLINE_ENV = "HOOKSCOPE_OFFLINE"
_DOWNLOAD_HOST = "download.pytorch.org"
_CHECKPOINT_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".tar", ".safetensors"}
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


def network_available(host: str = _DOWNLOAD_HOST, timeout: float = 2.0) -> bool:
    """Whether weights could be downloaded from ``host``: never with HOOKSCOPE_OFFLINE set."""
    if os.environ.get(OFFLINE_ENV, "").strip() not in ("", "0"):
        return False
    try:
        with socket.create_connection((host, 443), timeout=timeout):
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


def _build(name: str, weights: Any | None, seed: int, num_classes: int | None = None,
           extra: Mapping[str, Any] | None = None) -> nn.Module:
    from torchvision.models import get_model, get_model_builder

    # Seeded in a forked RNG so loading a model leaves the caller's global RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        kwargs: dict[str, Any] = dict(extra or {})
        if num_classes is not None:
            kwargs["num_classes"] = num_classes
        if name.startswith("quantized_") and weights is not None:
            kwargs["quantize"] = True
        if "weights_backbone" in inspect.signature(get_model_builder(name)).parameters:
            # Otherwise detection and segmentation builders download a backbone.
            kwargs["weights_backbone"] = None
        try:
            with warnings.catch_warnings():  # builders' deprecation notes are not the user's
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", UserWarning)
                return get_model(name, weights=weights, **kwargs)
        except (OSError, RuntimeError) as exc:
            if weights is None:
                raise
            raise HookscopeError(
                f"Could not download the weights {weights} for {name} ({exc.__class__.__name__}: "
                f"{exc}). Use {param('weights')} none for random initialisation, or a local checkpoint."
            ) from exc


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(round(v * factor) for v in value)
    return round(value * factor)


def _preprocess_for(weights: Any | None, size: int | None) -> Callable[..., Any]:
    """The weights' own transforms, rescaled so the crop (or resize) is ``size`` when given."""
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


def _default_classes(name: str, default: Any | None) -> int | None:
    """The class count a builder uses without ``num_classes``: its weights' categories."""
    categories = default.meta.get("categories") if default is not None else None
    return len(categories) if categories else None


def _random_weights(name: str, options: LoadOptions, default: Any | None,
                    why: str | None = None) -> tuple[nn.Module, str]:
    if why is not None:
        log.warning(f"{why}; using random initialisation (seed {options.seed}), so predictions "
                    "are meaningless. weights=none (--weights none) silences this.")
    return (_build(name, None, options.seed, options.num_classes),
            f"random (seed {options.seed})")


def _named_weights(name: str, spec: str, enum: Any | None, default: Any | None) -> Any:
    if enum is None:
        raise HookscopeError(f"{name} has no pretrained weights; use {param('weights')} none.")
    member = spec.split(".")[-1]
    members = [m.name for m in enum]
    if member.upper() == "DEFAULT":
        return default
    if member not in members:
        raise HookscopeError(
            f"{enum.__name__} has no member {spec!r}.{suggest(member, members)} "
            f"Choose DEFAULT, {', '.join(members)}, auto, none, or a checkpoint path."
        )
    return enum[member]


def _pretrained(name: str, chosen: Any, options: LoadOptions) -> tuple[nn.Module, str]:
    if options.num_classes is not None and options.num_classes != _default_classes(name, chosen):
        raise HookscopeError(
            f"{param('num_classes')} {options.num_classes} needs random or checkpoint weights: "
            f"{chosen} has {_default_classes(name, chosen)} classes."
        )
    if not _cached_file(chosen).exists() and not network_available():
        raise HookscopeError(
            f"{chosen} is not in the torch cache ({_cached_file(chosen).parent}) and cannot "
            f"be downloaded (no network). Use {param('weights')} none or a local checkpoint."
        )
    return _build(name, chosen, options.seed), str(chosen).split(".", 1)[-1]


def _aux_options(name: str, state: Mapping[str, torch.Tensor]) -> dict[str, bool]:
    """Build auxiliary heads exactly when the checkpoint has them."""
    from torchvision.models import get_model_builder

    params = inspect.signature(get_model_builder(name)).parameters
    keys = list(state)
    if "aux_loss" in params:  # segmentation: aux_classifier
        return {"aux_loss": any(k.startswith("aux_classifier.") for k in keys)}
    if name in ("googlenet", "inception_v3"):  # aux1/aux2, AuxLogits
        return {"aux_logits": any(k.startswith(("aux1.", "aux2.", "AuxLogits.")) for k in keys)}
    return {}


def load_torchvision(spec: ModelSpec, options: LoadOptions) -> LoadedModel:
    """Build a torchvision model with the requested weights (on the CPU).

    ``weights``: ``auto`` (DEFAULT weights when cached or downloadable, else random with a
    warning), ``DEFAULT`` or an enum member name, ``none`` (random, seeded), or a checkpoint
    path. A checkpoint whose classifier head has another class count (a fine-tuned model)
    builds the architecture with that count; ``num_classes`` sets it for random weights.

    Raises:
        HookscopeError: unknown weights, an unreadable checkpoint, a checkpoint for another
            architecture, or a class count that contradicts the weights.
    """
    name = spec.target
    enum = _weights_enum(name)
    default = getattr(enum, "DEFAULT", None) if enum is not None else None
    weights = options.weights.strip()
    chosen, found = None, None
    if weights.lower() == "none":
        model, loaded = _random_weights(name, options, default)
    elif weights.lower() == "auto":
        if default is not None and options.num_classes in (None, _default_classes(name, default)) \
                and (_cached_file(default).exists() or network_available()):
            chosen = default
            model, loaded = _pretrained(name, chosen, options)
        else:
            why = None if options.num_classes is not None else \
                "this model has no pretrained weights" if default is None else (
                    f"{default} is not in the torch cache ({_cached_file(default).parent}) and "
                    "cannot be downloaded")
            model, loaded = _random_weights(name, options, default, why)
    elif _is_path(weights):
        model, found = build_to_fit(
            Path(weights).expanduser(), name=name, num_classes=options.num_classes,
            trust=options.trust_checkpoint,
            build=lambda n, state: _build(name, None, options.seed, n, _aux_options(name, state)))
        loaded = f"file:{Path(weights).expanduser()}"
    else:
        chosen = _named_weights(name, weights, enum, default)
        model, loaded = _pretrained(name, chosen, options)
    return _loaded(spec, model, options, loaded, chosen or default, found)


def _head_size(model: nn.Module, meta_classes: int | None) -> int | None:
    """The class count of the model as built: its last Linear (or 1x1 conv) layer's outputs."""
    last = None
    for module in model.modules():
        if isinstance(module, nn.Linear):
            last = module.out_features
        elif isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1):
            last = module.out_channels
    return last if last is not None else meta_classes


def _loaded(spec: ModelSpec, model: nn.Module, options: LoadOptions, loaded: str,
            meta: Any | None, found: Checkpoint | None) -> LoadedModel:
    preset = _preprocess_for(meta, options.size)
    origin = "weights" if meta is not None else "default"
    categories = list(meta.meta.get("categories") or []) or None if meta is not None else None
    classes = _head_size(model, len(categories) if categories else None) \
        if spec.task in ("classification", "video", "segmentation") else None
    labels_from = "weights" if categories else None
    if categories and classes is not None and len(categories) != classes:
        categories, labels_from = None, None  # a fine-tuned head: ImageNet's labels do not fit
    if found is not None and found.labels is not None:
        categories, labels_from = found.labels, f"checkpoint:{found.labels_key}"
    return LoadedModel(
        name=spec.name, model=model, task=spec.task, weights_requested=options.weights,
        weights_loaded=loaded, device=torch.device("cpu"),
        preprocess=Preprocess.from_preset(preset, origin), categories=categories,
        source="torchvision", num_classes=classes, input_ndim=spec.input_ndim,
        labels_from=labels_from,
    )


def load_model(name: str, *, weights: str = "auto", seed: int = 0,
               device: str | torch.device = "cpu", size: int | None = None,
               trust_checkpoint: bool = False, **options: Any) -> LoadedModel:
    """Load any model hookscope can name, in eval mode, on ``device``.

    ``name`` is a torchvision name, ``timm:NAME``, ``file.py:NAME`` or ``package.module:NAME``,
    or a whole pickled module's path (with ``trust_checkpoint``). ``options`` are the other
    fields of :class:`hookscope.sources.LoadOptions` (``num_classes``, ``labels``,
    ``model_args``, ``mean``, ``std``, ``resize``, ``crop``, ``channels``, ``output_key``).

    Raises:
        HookscopeError: unknown model or weights, an unreadable checkpoint, an unavailable
            device, or options that contradict the model.
    """
    from hookscope import sources

    return sources.load(name, LoadOptions(weights=weights, seed=seed, device=device, size=size,
                                          trust_checkpoint=trust_checkpoint, **options))


def check_supported(spec: ModelSpec, *, needs_logits: bool = False,
                    needs_images: bool = False) -> None:
    """Refuse, before the model is built, a model kind an analysis cannot run.

    Args:
        spec: what MODEL names (its task and input dimensions).
        needs_logits: the analysis explains or differentiates (N, classes) class logits.
        needs_images: the analysis explains image batches (N, C, H, W), not video clips:
            Grad-CAM, which also explains segmentation models (a class over a region) and
            detectors (their boxes), so those pass with it.

    Raises:
        HookscopeError: optical-flow models (two frames per input) anywhere; detection and
            segmentation models where class logits are needed (except Grad-CAM); video
            where images are.
    """
    name, task = spec.name, spec.task
    if task == "optical_flow":
        raise HookscopeError(
            f"{name} is an optical-flow model: it takes two frames per input, and hookscope "
            "runs models on one batch of images (classification, segmentation, detection) or "
            "clips (video)."
        )
    if needs_logits and not needs_images and task in ("detection", "segmentation"):
        raise HookscopeError(
            f"{name} is a {task} model; this analysis needs a classifier's (N, classes) "
            f"logits. {task.capitalize()} models work with stats, layers, debug, features, "
            "gradcam, check and diff."
        )
    if needs_images and spec.input_ndim != 4:
        raise HookscopeError(f"{name} is a video model; this analysis explains image "
                             "models (N, C, H, W).")


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
