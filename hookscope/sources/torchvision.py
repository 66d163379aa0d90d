"""The torchvision model source: names, tasks, weights, fine-tuned checkpoints and their
preprocessing, through torchvision's public API only."""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Mapping
from functools import lru_cache, partial
from typing import Any

import torch
from torch import nn

from hookscope.core.errors import HookscopeError, param, suggest
from hookscope.inputs.preprocess import Preprocess
from hookscope.sources.base import (
    Built,
    DeclaredSize,
    LoadedModel,
    LoadOptions,
    ModelSpec,
    Source,
    hub_file,
    is_path,
    pretrained,
    register,
    warn_random,
)
from hookscope.sources.checkpoints import Checkpoint, build_to_fit

log = logging.getLogger("hookscope")

@lru_cache(maxsize=1)
def model_tasks() -> dict[str, str]:
    """Every torchvision model name mapped to its task (classification, detection, ...)."""
    import torchvision.models as tvm
    from torchvision.models import list_models

    groups = {"segmentation": tvm.segmentation, "detection": tvm.detection, "video": tvm.video,
              "optical_flow": tvm.optical_flow, "quantization": tvm.quantization,
              "classification": tvm, "other": None}
    tasks: dict[str, str] = {}
    for task, module in groups.items():  # a name's first group is its task
        for name in list_models(module):
            tasks.setdefault(name, task)
    return tasks


def weights_enum(name: str) -> Any | None:
    """The weights enum of torchvision model ``name``; None when it has none."""
    from torchvision.models import get_model_weights

    try:
        return get_model_weights(name)
    except (ValueError, KeyError):
        return None


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
    """The weights' own transforms, rebuilt so the crop (or resize) is ``size`` when given."""
    from torchvision.transforms._presets import ImageClassification

    factory = weights.transforms if weights is not None else partial(ImageClassification, crop_size=224)
    preset = factory()
    if size is None:
        return preset
    # Sizes as the constructor takes them: the factory's own, else the preset's (an int).
    keywords = getattr(factory, "keywords", {})
    sizes = {k: keywords.get(k, found[0]) for k in ("crop_size", "resize_size")
             if (found := getattr(preset, k, None))}
    if not sizes:
        log.info("size is ignored: this model's preprocessing does not resize")
        return preset
    factor = size / getattr(preset, next(iter(sizes)))[0]
    return factory(**{k: _scaled(v, factor) for k, v in sizes.items()})


def _random_weights(name: str, options: LoadOptions, why: str | None = None) -> Built:
    loaded = warn_random(why, options.seed)
    return _build(name, None, options.seed, options.num_classes), loaded


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
            f"Choose DEFAULT, {', '.join(members)}, auto, none, or a checkpoint path.")
    return enum[member]


def _pretrained(name: str, chosen: Any, options: LoadOptions, *, auto: bool = False) -> Built:
    """``chosen`` weights, from the torch cache or a download (see :func:`pretrained`)."""
    cached = hub_file(chosen.url)
    return pretrained(
        str(chosen), options, classes=len(chosen.meta.get("categories") or []) or None, auto=auto,
        host="download.pytorch.org",
        where=None if cached.exists() else f"the torch cache ({cached.parent})",
        # no warning with num_classes: random weights are what its head gets anyway
        random=lambda why: _random_weights(name, options, why if options.num_classes is None else None),
        build=lambda: (_build(name, chosen, options.seed), str(chosen).split(".", 1)[-1]))


def _aux_options(name: str, state: Mapping[str, torch.Tensor]) -> dict[str, bool]:
    """Build auxiliary heads exactly when the checkpoint has them."""
    from torchvision.models import get_model_builder

    if "aux_loss" in inspect.signature(get_model_builder(name)).parameters:  # segmentation
        return {"aux_loss": any(k.startswith("aux_classifier.") for k in state)}
    if name in ("googlenet", "inception_v3"):  # aux1/aux2, AuxLogits
        return {"aux_logits": any(k.startswith(("aux1.", "aux2.", "AuxLogits.")) for k in state)}
    return {}


def load_torchvision(spec: ModelSpec, options: LoadOptions) -> LoadedModel:
    """Build a torchvision model with the requested weights (on the CPU).

    ``weights``: ``auto`` (DEFAULT weights when cached or downloadable, else random with a
    warning), ``DEFAULT`` or an enum member name, ``none`` (random, seeded), or a checkpoint
    (a fine-tuned one builds the architecture with its class count).
    """
    name = spec.target
    enum = weights_enum(name)
    default = getattr(enum, "DEFAULT", None)
    weights = options.weights.strip()
    chosen, found = None, None
    if weights.lower() == "none":
        model, loaded = _random_weights(name, options)
    elif weights.lower() == "auto" and default is not None:
        model, loaded = _pretrained(name, default, options, auto=True)
    elif weights.lower() == "auto":
        why = "this model has no pretrained weights" if options.num_classes is None else None
        model, loaded = _random_weights(name, options, why)
    elif is_path(weights):
        model, found = build_to_fit(options, name=name, build=lambda n, state: _build(
            name, None, options.seed, n, _aux_options(name, state)))
        loaded = f"file:{found.path}"
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


#: Constructor parameters that fix a torchvision model's input size (ViT, MaxViT, MViT).
_FIXED_SIZE = ("image_size", "input_size", "spatial_size")


def declared_size(model: nn.Module, meta: Any | None) -> DeclaredSize | None:
    """The input size a torchvision model declares: its ``image_size`` (ViT), else its
    weights' ``min_size``, exact when its class is built for one size."""
    image_size = getattr(model, "image_size", None)
    if isinstance(image_size, int):
        return DeclaredSize((image_size, image_size), True, "its image_size")
    found = meta.meta.get("min_size") if meta is not None else None
    if not found or tuple(found) == (1, 1):
        return None
    kind = type(model)
    exact = any(p in inspect.signature(kind.__init__).parameters for p in _FIXED_SIZE)
    origin = f"its weights' min_size, and {kind.__name__} is built for one size" if exact \
        else "its weights' min_size"
    return DeclaredSize((int(found[0]), int(found[1])), exact, origin)


def _fitted(name: str, meta: Any | None, size: int | None, declared: DeclaredSize | None
            ) -> Callable[..., Any]:
    """The weights' transforms, at ``size`` when given; else at the one size the model was
    built for when their own gives another (a ViT built without its weights, at its
    builder's default: vit_h_14's are 518 px, the builder's 224), said in a note."""
    preset = _preprocess_for(meta, size)
    crop = Preprocess.from_preset(preset, "weights").input_size
    if size is not None or declared is None or not declared.exact or crop == declared.size:
        return preset
    h, w = declared.size
    log.info(f"{name} is built for {h}x{w} inputs ({declared.origin}), and its weights' "
             f"preprocessing gives {crop[0]}x{crop[1]}: preprocessing as those weights do, "
             f"scaled to {h} px.")
    return _preprocess_for(meta, h)


def _loaded(spec: ModelSpec, model: nn.Module, options: LoadOptions, loaded: str,
            meta: Any | None, found: Checkpoint | None) -> LoadedModel:
    declared = declared_size(model, meta)
    preset = _fitted(spec.name, meta, options.size, declared)
    origin = "weights" if meta is not None else "default"
    categories = list(meta.meta.get("categories") or []) or None if meta is not None else None
    classes = _head_size(model, len(categories) if categories else None) \
        if spec.task in ("classification", "video", "segmentation") else None
    labels_from = "weights" if categories else None
    if categories and classes is not None and len(categories) != classes:
        categories, labels_from = None, None  # a fine-tuned head: ImageNet's labels do not fit
    if found is not None and found.labels is not None:
        categories, labels_from = found.labels, found.labels_from
    return LoadedModel(
        name=spec.name, model=model, task=spec.task, weights_requested=options.weights,
        weights_loaded=loaded, preprocess=Preprocess.from_preset(preset, origin),
        categories=categories, num_classes=classes, input_ndim=spec.input_ndim,
        labels_from=labels_from, declared_size=declared)


def _parse(spec: str) -> ModelSpec | None:
    """Every name in ``torchvision.models.list_models()``."""
    task = model_tasks().get(spec)
    if task is None:
        return None
    return ModelSpec("torchvision", spec, spec, task, 5 if task == "video" else 4)


register(Source("torchvision", _parse, load_torchvision))
