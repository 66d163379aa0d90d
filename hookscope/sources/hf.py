"""Hugging Face model directories: ``hf:PATH`` (optional: ``pip install 'hookscope[hf]'``).

PATH is a local folder as ``save_pretrained`` writes it. Nothing is fetched: every
``from_pretrained`` call is ``local_files_only``, and a PATH that is not a folder is an
error, never a Hub lookup. A folder whose config names its own code (``auto_map``) is loaded
only with ``trust_checkpoint``, since loading it runs that code.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from hookscope.core.errors import HookscopeError, clip, param
from hookscope.inputs.preprocess import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Preprocess,
    check_side,
    check_values,
    with_overrides,
)
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


def _model_class(transformers: ModuleType, config: Any, raw: dict[str, Any],
                 path: Path) -> tuple[Any, str]:
    """The class to build and its task: the saved architecture (``config.architectures``),
    head and all; else (none saved, or the folder's own code) the Auto class for the task:
    image classification when the family has one, else the backbone."""
    names = [str(name) for name in getattr(config, "architectures", None) or []]
    arch = " ".join(names)
    mapping = transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING
    if "ForSemanticSegmentation" in arch:
        task, auto = "segmentation", transformers.AutoModelForSemanticSegmentation
    elif "ForImageClassification" in arch or (not arch and type(config) in mapping):
        task, auto = "classification", transformers.AutoModelForImageClassification
    else:
        task, auto = "custom", transformers.AutoModel
    if not names or raw.get("auto_map"):
        return auto, task
    saved = getattr(transformers, names[0], None)
    if not isinstance(saved, type):
        raise HookscopeError(
            f"hf:{path}: config.json's architectures names {names[0]}, which transformers "
            f"{transformers.__version__} does not have; upgrade transformers, or name a class "
            "it has there.")
    return saved, task


def image_text(cls: type) -> bool:
    """Whether the model takes images and texts (CLIP, SigLIP): ``pixel_values`` and
    ``input_ids``."""
    params = inspect.signature(cls.forward).parameters  # type: ignore[attr-defined]
    return "pixel_values" in params and "input_ids" in params


def _vision(cls: type, path: Path) -> None:
    """Refuse a model that takes no images (a text model), before any forward."""
    takes = getattr(cls, "main_input_name", "pixel_values")
    if takes != "pixel_values" and not image_text(cls):
        raise HookscopeError(
            f"hf:{path} is a {cls.__name__}, not a vision model (it takes {takes}); hookscope "
            "runs Hugging Face models that take images (pixel_values): image classifiers, "
            "segmenters, detectors and backbones.")


def _build(transformers: ModuleType, path: Path, raw: dict[str, Any],
           options: LoadOptions) -> tuple[nn.Module, str, str]:
    """The model (its weights, or seeded random ones for ``weights=none``), task, weights."""
    weights = options.weights.strip().lower()
    if weights not in ("auto", "none"):
        raise HookscopeError(f"{param('weights')} {options.weights!r}: an hf: folder carries its "
                             "own weights; use auto (the folder's) or none (random, seeded).")
    trust = options.trust_checkpoint
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust)
    cls, task = _model_class(transformers, config, raw, path)
    auto = cls.__name__.startswith("Auto")
    with suppress(KeyError):  # the class an Auto class builds for this config (not for a folder's own code)
        _vision(cls._model_mapping[type(config)] if auto else cls, path)
    remote = {"trust_remote_code": trust} if auto else {}
    has_weights = any((path / name).is_file() for name in WEIGHT_FILES)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(options.seed)
        if weights == "none" or not has_weights:
            why = f"hf:{path} has no weights file" if weights == "auto" else None
            loaded = warn_random(why, options.seed)
            model = cls.from_config(config, **remote) if auto else cls(config)
        else:
            model, loaded = cls.from_pretrained(path, local_files_only=True, **remote), f"file:{path}"
    _vision(type(model), path)
    return model, task, loaded


def _with_texts(transformers: ModuleType, model: nn.Module, path: Path, texts: Sequence[str]
                ) -> None:
    """Make an image-text model's forward take the images alone: with ``texts`` (tokenized
    by the folder's tokenizer) as its other inputs, or, with none, the inputs' own
    ``input_ids`` (a tensor file's or a data set's dict)."""
    tokens = None
    if texts:
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise HookscopeError(f"hf:{path}: no tokenizer for {param('text')} "
                                 f"({clip(str(exc), 120)}); give inputs holding input_ids "
                                 "(a .pt dict, or --data) instead.") from None
        tokens = dict(tokenizer(list(texts), padding=True, return_tensors="pt"))
    forward = model.forward

    def with_texts(pixel_values: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if tokens is not None and pixel_values is not None:
            kwargs = {k: v.to(pixel_values.device) for k, v in tokens.items()} | kwargs
        elif "input_ids" not in kwargs:
            raise HookscopeError(
                f"hf:{path} compares images with texts ({type(model).__name__}): give the "
                f"texts with {param('text')}, or inputs holding input_ids.")
        return forward(pixel_values=pixel_values, **kwargs)

    model.forward = with_texts  # type: ignore[method-assign]


def _pixels(value: Any, name: str, where: str) -> int:
    """A processor's side in pixels, checked as --size is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not value.is_integer()):
        raise HookscopeError(f"{where}: {name} must be a whole number of pixels, not {value!r}.")
    check_side(name, int(value), f"{where}: {name}")
    return int(value)


def _side(size: Any, name: str, where: str) -> tuple[int | None, bool]:
    """A processor's ``size`` as (side, stretch): ``{"height", "width"}`` stretches,
    ``{"shortest_edge"}`` resizes the shorter side. Each value is checked (``where``: the
    file, ``name``: the field)."""
    if isinstance(size, (int, float)):
        return _pixels(size, name, where), False
    get = getattr(size, "get", lambda key: None)  # a dict, or transformers' SizeDict
    if get("height") is not None:
        height = _pixels(get("height"), f"{name}.height", where)
        width = height if get("width") is None else _pixels(get("width"), f"{name}.width", where)
        if height != width:
            log.warning(f"the image processor resizes to {height}x{width}; hookscope resizes "
                        f"to {height}x{height} (give --resize/--crop to choose).")
        return height, True
    if get("shortest_edge") is not None:
        return _pixels(get("shortest_edge"), f"{name}.shortest_edge", where), False
    return None, False


def _stats(processor: Any, name: str, default: tuple[float, ...], where: str) -> tuple[float, ...]:
    """The processor's ``image_mean`` or ``image_std``, checked as --mean and --std are."""
    values = getattr(processor, f"image_{name}", None)
    if values is None:
        return default
    values = values if isinstance(values, (list, tuple)) else [values]
    return check_values(name, values, 3, f"{where}: image_{name}")


def hf_preprocess(processor: Any, where: str = "the image processor") -> Preprocess:
    """The image processor's settings (size, crop, mean/std, resample) as a Preprocess;
    a value out of range is one line naming ``where`` (its file) and the field."""
    resize, stretch = _side(getattr(processor, "size", None), "size", where) \
        if getattr(processor, "do_resize", True) else (None, False)
    crop = _side(getattr(processor, "crop_size", None), "crop_size", where)[0] \
        if getattr(processor, "do_center_crop", False) else None
    crop_pct = getattr(processor, "crop_pct", None)
    if crop_pct and resize is not None and crop is None and not stretch and resize < 384:
        if not isinstance(crop_pct, (int, float)) or not 0 < crop_pct <= 1:
            raise HookscopeError(f"{where}: crop_pct must be a number in (0, 1], not "
                                 f"{crop_pct!r}.")
        crop, resize = resize, int(resize / crop_pct)  # ConvNeXt's processor
    normalise = getattr(processor, "do_normalize", True)
    mean = _stats(processor, "mean", IMAGENET_MEAN, where) if normalise else (0.0, 0.0, 0.0)
    std = _stats(processor, "std", IMAGENET_STD, where) if normalise else (1.0, 1.0, 1.0)
    if not getattr(processor, "do_rescale", True):
        mean, std = tuple(m / 255 for m in mean), tuple(s / 255 for s in std)
    resample = getattr(processor, "resample", 2)
    code = getattr(resample, "value", resample)
    mode = _RESAMPLE.get(code, code if code in ("nearest", "bilinear", "bicubic") else "bilinear")
    return Preprocess(resize=resize, crop=crop, mean=mean, std=std, interpolation=str(mode),
                      origin="processor", stretch=stretch)


def _config_value(config: Any, key: str) -> Any:
    """``key`` of the config, or of its vision tower's (CLIP's, SigLIP's)."""
    found = getattr(config, key, None)
    vision = getattr(config, "vision_config", None)
    return found if found is not None or vision is None else getattr(vision, key, None)


def _from_config(config: Any, path: Path, name: str) -> Preprocess:
    """Preprocessing for a folder without preprocessor_config.json: ImageNet's, at the
    config's ``image_size`` (ImageNet's resize ratio) and ``num_channels``."""
    side = _config_value(config, "image_size")
    side = side[0] if isinstance(side, (list, tuple)) and side else side
    side = side if isinstance(side, int) and not isinstance(side, bool) else None
    check_side("image_size", side, f"{path / 'config.json'}: image_size")
    channels = 1 if _config_value(config, "num_channels") == 1 else None
    found = with_overrides(Preprocess(), size=side, input_channels=channels)
    what = f"config.json's image_size {side}" if side is not None else "224 px"
    log.warning(f"{name} has no preprocessor_config.json; preprocessing for {what} with "
                "ImageNet's mean and std (give --mean/--std/--resize/--crop to choose).")
    return replace(found, origin="config")


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
    processor_file = path / "preprocessor_config.json"
    try:
        model, task, loaded = _build(transformers, path, raw, options)
        preprocess = hf_preprocess(transformers.AutoImageProcessor.from_pretrained(
            path, local_files_only=True, trust_remote_code=options.trust_checkpoint),
            str(processor_file)) if processor_file.is_file() else None
    except HookscopeError:
        raise
    except Exception as exc:  # transformers raises many types for a folder it cannot load
        raise HookscopeError(f"hf:{spec.target}: transformers cannot load it "
                             f"({type(exc).__name__}: {clip(str(exc), 200)}).") from None
    finally:
        if shown:
            bars.enable_progress_bar()
    config: Any = model.config
    if preprocess is None:
        preprocess = _from_config(config, path, f"hf:{spec.target}")
    elif _config_value(config, "num_channels") == 1 and preprocess.channels != 1:
        preprocess = replace(with_overrides(preprocess, input_channels=1), origin="processor")
    labels = _labels(config, task)
    classes = int(config.num_labels) if task == "classification" else None
    pairs, texts = image_text(type(model)), list(options.text or ())
    if pairs:  # the classes are the texts
        _with_texts(transformers, model, path, texts)
        task, labels, classes = "classification", texts or None, len(texts) or None
    elif texts:
        raise HookscopeError(f"{param('text')} is for image-text models (CLIP); hf:{spec.target} "
                             f"is a {type(model).__name__}.")
    return LoadedModel(
        name=spec.name, model=model, task=task, weights_requested=options.weights,
        weights_loaded=loaded, preprocess=with_overrides(preprocess, size=options.size),
        categories=labels, source="hf", num_classes=classes,
        output_key="logits_per_image" if pairs else None,
        labels_from=("text" if texts else None) if pairs else "config:id2label" if labels else None)


register(Source("hf", prefixed("hf", PREFIX, "custom"), load_hf))
