"""The timm source: ``timm:NAME`` (optional: ``pip install 'hookscope[timm]'``).

NAME is a timm architecture (``convnext_tiny``), maybe with a pretrained tag
(``resnet18.a1_in1k``). Weights follow the torchvision source's rules (``auto``: pretrained
when cached or downloadable, else random with a warning); preprocessing is timm's own.
"""

from __future__ import annotations

import math
import os
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

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
    import_optional,
    is_path,
    prefixed,
    pretrained,
    register,
    warn_random,
)
from hookscope.sources.checkpoints import build_to_fit

__all__ = ["PREFIX", "load_timm", "pretrained_tags"]

PREFIX = "timm:"
#: Weight files timm fetches from a Hugging Face repo, safetensors first as timm does.
_HUB_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_model.safetensors",
              "open_clip_pytorch_model.bin")


def _architecture(timm: ModuleType, name: str) -> tuple[str, str]:
    """``name`` split into a known architecture and its tag (``""`` when none)."""
    from timm.models import split_model_name_tag

    arch, tag = split_model_name_tag(name)
    if not timm.is_model(arch):
        raise HookscopeError(
            f"Unknown timm model {name!r}.{suggest(arch, timm.list_models())} Run `hookscope "
            "models --source timm PATTERN` to list them.")
    return arch, _choose_tag(arch, tag) if tag else tag


def pretrained_tags(arch: str, with_weights: set[str] | None = None) -> list[str]:
    """The tags of ``arch``'s pretrained weights, timm's default first. ``with_weights``:
    ``set(timm.list_pretrained())``, when the caller already has it."""
    import timm
    from timm.models import get_arch_pretrained_cfgs, get_pretrained_cfg

    if with_weights is None:
        with_weights = set(timm.list_pretrained(f"{arch}.*"))
    tags = [key.split(".", 1)[1] for key in get_arch_pretrained_cfgs(arch) if key in with_weights]
    default = getattr(get_pretrained_cfg(arch), "tag", None)
    return sorted(tags, key=lambda t: t != default)


def _choose_tag(arch: str, requested: str, default: str = "") -> str:
    """The tag ``requested`` names: ``DEFAULT`` (``default``, else timm's), a tag, or
    ``arch.tag``."""
    tags = pretrained_tags(arch)
    if not tags:
        raise HookscopeError(f"timm:{arch} has no pretrained weights; use {param('weights')} "
                             "none or a checkpoint path.")
    if requested.upper() == "DEFAULT":
        return default or tags[0]
    tag = requested.removeprefix(f"{arch}.")
    if tag not in tags:
        raise HookscopeError(
            f"timm:{arch} has no pretrained weights {requested!r}.{suggest(tag, tags)} "
            f"Choose DEFAULT, {', '.join(tags)}, auto, none, or a checkpoint path.")
    return tag


def _cached_file(cfg: Any) -> Path | None:
    """The weights' file in the Hugging Face cache or timm's torch hub cache, if there."""
    hub_id = getattr(cfg, "hf_hub_id", None)
    if hub_id:
        from huggingface_hub import try_to_load_from_cache

        repo, _, revision = hub_id.partition("@")
        names = ((cfg.hf_hub_filename,) if cfg.hf_hub_filename else ()) + _HUB_FILES
        for filename in names:
            found = try_to_load_from_cache(repo, filename, revision=revision or None)
            if isinstance(found, str) and os.path.isfile(found):
                return Path(found)
    url = getattr(cfg, "url", None)
    return hub_file(url) if url and hub_file(url).is_file() else None


def _create(name: str, seed: int, num_classes: int | None = None,
            pretrained_from: Path | None = None, download: bool = False) -> nn.Module:
    """Build ``name`` seeded in a forked RNG, pretrained from a cached file or a download."""
    import timm
    from huggingface_hub import constants

    kwargs: dict[str, Any] = {} if num_classes is None else {"num_classes": num_classes}
    if pretrained_from is not None:
        kwargs["pretrained_cfg_overlay"] = {"file": str(pretrained_from)}
    with torch.random.fork_rng(devices=[]), ExitStack() as stack:
        if not download:  # forbid hub requests; its flag is read at import, so set both
            stack.enter_context(mock.patch.dict(os.environ, HF_HUB_OFFLINE="1"))
            stack.enter_context(mock.patch.object(constants, "HF_HUB_OFFLINE", True))
        torch.manual_seed(seed)
        return timm.create_model(name, pretrained=pretrained_from is not None or download,
                                 **kwargs)


def _random(arch: str, tag: str, options: LoadOptions, why: str | None = None) -> Built:
    loaded = warn_random(why, options.seed)
    return _create(f"{arch}.{tag}" if tag else arch, options.seed, options.num_classes), loaded


def _pretrained(arch: str, tag: str, options: LoadOptions, *, auto: bool = False) -> Built:
    """Pretrained weights from the cache, else a download (see :func:`pretrained`)."""
    from timm.models import get_pretrained_cfg

    cfg: Any = get_pretrained_cfg(f"{arch}.{tag}")
    cached, hub_id = _cached_file(cfg), getattr(cfg, "hf_hub_id", None)

    def build() -> Built:
        try:
            return _create(f"{arch}.{tag}", options.seed, pretrained_from=cached,
                           download=cached is None), tag
        except Exception as exc:  # timm and the hub raise many types for a failed download
            where = "load" if cached is not None else "download"
            raise HookscopeError(
                f"Could not {where} the weights timm:{arch}.{tag} ({exc.__class__.__name__}: "
                f"{exc}). Use {param('weights')} none for random initialisation, or a local "
                "checkpoint.") from exc

    return pretrained(
        f"timm:{arch}.{tag}", options, classes=cfg.num_classes, host="huggingface.co", auto=auto,
        where=None if cached is not None else
        f"the Hugging Face cache ({hub_id})" if hub_id else "the torch hub cache",
        random=lambda why: _random(arch, tag, options, why), build=build)


def timm_preprocess(model: nn.Module, size: int | None = None) -> Preprocess:
    """timm's data config for ``model`` (its crop set to ``size`` when given), applied by
    timm's own eval transform."""
    from timm.data import create_transform, resolve_data_config

    config = resolve_data_config({}, model=model)
    if size is not None:
        config["input_size"] = (config["input_size"][0], size, size)
    channels, crop = int(config["input_size"][0]), int(config["input_size"][-1])
    crop_pct = config.get("crop_pct") or 0.875
    interpolation = str(config.get("interpolation") or "bilinear")
    return Preprocess(
        resize=math.floor(crop / crop_pct), crop=crop, mean=tuple(config["mean"]),
        std=tuple(config["std"]), channels=channels,
        interpolation=interpolation if interpolation in ("bilinear", "bicubic", "nearest")
        else "bilinear",
        origin="timm", transform=create_transform(**config))


def declared_size(model: nn.Module) -> DeclaredSize | None:
    """The input size a timm model declares: when its ``pretrained_cfg`` says the size is
    fixed, its patch embedding's ``img_size`` (else the config's ``input_size``)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if not cfg.get("fixed_input_size") or getattr(model, "dynamic_img_size", False):
        return None
    found = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if not (isinstance(found, (tuple, list)) and len(found) == 2):
        found = tuple(cfg.get("input_size") or ())[1:]
    if len(found) != 2:
        return None
    return DeclaredSize((int(found[0]), int(found[1])), True,
                        "its pretrained_cfg has fixed_input_size")


def imagenet_labels(model: nn.Module) -> list[str] | None:
    """ImageNet class names for a head whose class count is an ImageNet subset's."""
    try:
        from timm.data import ImageNetInfo, infer_imagenet_subset
    except ImportError:  # timm before 0.9.8
        return None
    subset = infer_imagenet_subset(model)
    if subset is None:
        return None
    labels = list(ImageNetInfo(subset).label_descriptions())
    return labels if len(labels) == getattr(model, "num_classes", None) else None


def load_timm(spec: ModelSpec, options: LoadOptions) -> LoadedModel:
    """Build a timm model with the requested weights (on the CPU)."""
    timm = import_optional("timm", "timm")
    arch, tag = _architecture(timm, spec.target)
    weights = options.weights.strip()
    found = None
    if weights.lower() == "none":
        model, loaded = _random(arch, tag, options)
    elif weights.lower() == "auto":
        tags = [tag] if tag else pretrained_tags(arch)
        if tags:
            model, loaded = _pretrained(arch, tags[0], options, auto=True)
        else:
            model, loaded = _random(arch, "", options, "this timm model has no pretrained weights")
    elif is_path(weights):
        name = f"{arch}.{tag}" if tag else arch
        model, found = build_to_fit(options, name=f"timm:{arch}",
                                    build=lambda n, state: _create(name, options.seed, n))
        loaded = f"file:{found.path}"
    else:
        model, loaded = _pretrained(arch, _choose_tag(arch, weights, default=tag), options)
    pretrained = not loaded.startswith(("random", "file:"))
    categories = imagenet_labels(model) if pretrained else None
    labels_from = "weights" if categories else None
    if found is not None and found.labels is not None:
        categories, labels_from = found.labels, found.labels_from
    return LoadedModel(
        name=spec.name, model=model, task="classification", weights_requested=options.weights,
        weights_loaded=loaded, preprocess=timm_preprocess(model, options.size),
        categories=categories, source="timm", num_classes=getattr(model, "num_classes", None),
        labels_from=labels_from, declared_size=declared_size(model))


register(Source("timm", prefixed("timm", PREFIX, "classification"), load_timm))
