"""Hugging Face model directories: ``hf:PATH`` (optional: ``pip install 'hookscope[hf]'``).

PATH is a local folder as ``save_pretrained`` writes it. Nothing is fetched: every
``from_pretrained`` call is ``local_files_only``, and a PATH that is not a folder is an
error, never a Hub lookup. A folder whose config names its own code (``auto_map``) is loaded
only with ``trust_checkpoint``, since loading it runs that code.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from hookscope.core.errors import HookscopeError, clip, param
from hookscope.inputs.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess, with_overrides
from hookscope.sources.base import (
    LoadedModel,
    LoadOptions,
    ModelSpec,
    Source,
    import_optional,
    prefixed,
    register,
    warn_random,
)

__all__ = ["PREFIX", "WEIGHT_FILES", "config_json", "hf_preprocess", "load_hf"]

log = logging.getLogger("hookscope")

PREFIX = "hf:"
#: Weight files ``save_pretrained`` writes, safetensors first.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
#: PIL's resampling codes, as the processors store them.
_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}
_GENERIC_LABEL = re.compile(r"^LABEL_\d+$")


def _folder(target: str) -> Path:
    path = Path(target).expanduser()
    if not path.is_dir():
        what = "a file" if path.exists() else "not found"
        raise HookscopeError(
            f"hf:{target}: {what}; hf:PATH names a local folder that save_pretrained wrote "
            "(config.json and the weights). Nothing is downloaded from the Hugging Face Hub.")
    if not (path / "config.json").is_file():
        raise HookscopeError(f"hf:{target}: the folder has no config.json; hf:PATH names a "
                             "folder that save_pretrained wrote.")
    return path


def config_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise HookscopeError(f"{path / 'config.json'}: not readable JSON ({clip(str(exc), 120)}).") from None
    if not isinstance(found, dict):
        raise HookscopeError(f"{path / 'config.json'}: not a JSON object.")
    return found


def _model_class(transformers: ModuleType, config: Any) -> tuple[Any, str]:
    """The Auto class for ``config``'s task, and the task: the saved architecture's head,
    else (none saved) image classification when the family has one, else the backbone."""
    arch = " ".join(getattr(config, "architectures", None) or [])
    if "ForSemanticSegmentation" in arch:
        return transformers.AutoModelForSemanticSegmentation, "segmentation"
    mapping = transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING
    if "ForImageClassification" in arch or (not arch and type(config) in mapping):
        return transformers.AutoModelForImageClassification, "classification"
    return transformers.AutoModel, "custom"


def _build(transformers: ModuleType, path: Path, options: LoadOptions) -> tuple[nn.Module, str, str]:
    """The model (its weights, or seeded random ones for ``weights=none``), task, weights."""
    weights = options.weights.strip().lower()
    if weights not in ("auto", "none"):
        raise HookscopeError(f"{param('weights')} {options.weights!r}: an hf: folder carries its "
                             "own weights; use auto (the folder's) or none (random, seeded).")
    trust = options.trust_checkpoint
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust)
    auto, task = _model_class(transformers, config)
    has_weights = any((path / name).is_file() for name in WEIGHT_FILES)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(options.seed)
        if weights == "none" or not has_weights:
            why = f"hf:{path} has no weights file" if weights == "auto" else None
            loaded = warn_random(why, options.seed)
            return auto.from_config(config, trust_remote_code=trust), task, loaded
        model = auto.from_pretrained(path, local_files_only=True, trust_remote_code=trust)
    return model, task, f"file:{path}"


def _side(size: Any) -> tuple[int | None, bool]:
    """A processor's ``size`` as (side, stretch): ``{"height", "width"}`` stretches,
    ``{"shortest_edge"}`` resizes the shorter side."""
    if isinstance(size, (int, float)):
        return int(size), False
    def get(key: str) -> Any:
        return size.get(key) if isinstance(size, dict) else getattr(size, key, None)

    if get("height") is not None:
        height, width = int(get("height")), int(get("width") or get("height"))
        if height != width:
            log.warning(f"the image processor resizes to {height}x{width}; hookscope resizes "
                        f"to {height}x{height} (give --resize/--crop to choose).")
        return height, True
    if get("shortest_edge") is not None:
        return int(get("shortest_edge")), False
    return None, False


def hf_preprocess(processor: Any) -> Preprocess:
    """The image processor's settings (size, crop, mean/std, resample) as a Preprocess."""
    resize, stretch = _side(getattr(processor, "size", None)) \
        if getattr(processor, "do_resize", True) else (None, False)
    crop = _side(getattr(processor, "crop_size", None))[0] \
        if getattr(processor, "do_center_crop", False) else None
    crop_pct = getattr(processor, "crop_pct", None)
    if crop_pct and resize is not None and crop is None and not stretch and resize < 384:
        crop, resize = resize, int(resize / crop_pct)  # ConvNeXt's processor
    normalise = getattr(processor, "do_normalize", True)
    mean = tuple(float(v) for v in getattr(processor, "image_mean", None) or IMAGENET_MEAN) \
        if normalise else (0.0, 0.0, 0.0)
    std = tuple(float(v) for v in getattr(processor, "image_std", None) or IMAGENET_STD) \
        if normalise else (1.0, 1.0, 1.0)
    if not getattr(processor, "do_rescale", True):
        mean, std = tuple(m / 255 for m in mean), tuple(s / 255 for s in std)
    resample = getattr(processor, "resample", 2)
    code = getattr(resample, "value", resample)
    mode = _RESAMPLE.get(code, code if code in ("nearest", "bilinear", "bicubic") else "bilinear")
    return Preprocess(resize=resize, crop=crop, mean=mean, std=std, interpolation=str(mode),
                      origin="processor", stretch=stretch)


def _labels(config: Any, task: str) -> list[str] | None:
    found = getattr(config, "id2label", None) or {}
    if task == "custom" or not found:
        return None
    labels = [str(found.get(i, found.get(str(i), i))) for i in range(len(found))]
    return None if all(_GENERIC_LABEL.match(name) for name in labels) else labels


def load_hf(spec: ModelSpec, options: LoadOptions) -> LoadedModel:
    """Load ``hf:PATH`` (on the CPU)."""
    if options.num_classes is not None:
        raise HookscopeError(f"{param('num_classes')}: an hf: folder's class count is "
                             "its config's num_labels.")
    path = _folder(spec.target)
    raw = config_json(path)
    if raw.get("auto_map") and not options.trust_checkpoint:
        raise HookscopeError(
            f"hf:{path}: its config.json names its own model code (auto_map), and loading it "
            f"runs that code. If you trust the folder, set {param('trust_checkpoint')}.")
    transformers = import_optional("transformers", "hf")
    bars = transformers.utils.logging
    shown = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()  # its loading bar is chatter on stderr
    try:
        model, task, loaded = _build(transformers, path, options)
        preprocess = hf_preprocess(transformers.AutoImageProcessor.from_pretrained(
            path, local_files_only=True, trust_remote_code=options.trust_checkpoint)) \
            if (path / "preprocessor_config.json").is_file() else None
    except HookscopeError:
        raise
    except Exception as exc:  # transformers raises many types for a folder it cannot load
        raise HookscopeError(f"hf:{spec.target}: transformers cannot load it "
                             f"({type(exc).__name__}: {clip(str(exc), 200)}).") from None
    finally:
        if shown:
            bars.enable_progress_bar()
    if preprocess is None:
        log.warning(f"hf:{spec.target} has no preprocessor_config.json; using ImageNet "
                    "preprocessing (give --mean/--std/--resize/--crop to choose).")
        preprocess = Preprocess()
    config: Any = model.config
    labels = _labels(config, task)
    return LoadedModel(
        name=spec.name, model=model, task=task, weights_requested=options.weights,
        weights_loaded=loaded, device=torch.device("cpu"),
        preprocess=with_overrides(preprocess, size=options.size), categories=labels,
        source="hf", num_classes=int(config.num_labels) if task == "classification" else None,
        labels_from="config:id2label" if labels else None)


register(Source("hf", prefixed("hf", PREFIX, "custom"), load_hf))
