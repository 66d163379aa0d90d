"""Tiny Hugging Face models built from configs and saved with ``save_pretrained`` (nothing
from the Hub): what the hf: tests load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LABELS = {0: "cat", 1: "dog", 2: "bird"}
#: The models, by key: each is small enough to run every command in a second or two.
KEYS = ("vit", "deit", "dinov2", "swin", "convnext", "segformer")


def _labels() -> dict[str, Any]:
    return {"id2label": dict(LABELS), "label2id": {v: k for k, v in LABELS.items()}}


def _vit(t: Any) -> tuple[Any, Any]:
    config = t.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, image_size=32, patch_size=8, **_labels())
    return (t.ViTForImageClassification(config),
            t.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3,
                                image_std=[0.5] * 3))


def _deit(t: Any) -> tuple[Any, Any]:
    config = t.DeiTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, image_size=32, patch_size=8, **_labels())
    return (t.DeiTForImageClassificationWithTeacher(config),
            t.DeiTImageProcessor(size={"height": 36, "width": 36},
                                 crop_size={"height": 32, "width": 32}))


def _dinov2(t: Any) -> tuple[Any, Any]:
    config = t.Dinov2WithRegistersConfig(hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, mlp_ratio=2, image_size=32,
                                         patch_size=8, num_register_tokens=4, **_labels())
    return (t.Dinov2WithRegistersForImageClassification(config),
            t.BitImageProcessor(size={"shortest_edge": 36}, crop_size={"height": 32,
                                                                         "width": 32},
                                resample=3, do_convert_rgb=True))


def _swin(t: Any) -> tuple[Any, Any]:
    config = t.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1],
                          num_heads=[1, 2], window_size=4, **_labels())
    return (t.SwinForImageClassification(config),
            t.ViTImageProcessor(size={"height": 32, "width": 32}))


def _convnext(t: Any) -> tuple[Any, Any]:
    config = t.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, **_labels())
    return (t.ConvNextForImageClassification(config),
            t.ConvNextImageProcessor(size={"shortest_edge": 32}, crop_pct=0.875))


def _segformer(t: Any) -> tuple[Any, Any]:
    config = t.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                               hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2],
                               num_attention_heads=[1, 2], decoder_hidden_size=16,
                               **_labels())
    return (t.SegformerForSemanticSegmentation(config),
            t.SegformerImageProcessor(size={"height": 32, "width": 32}))


def _beit(t: Any, shared: bool = False) -> tuple[Any, Any]:
    """BEiT as its checkpoints are built: a relative position bias in each block (or one
    shared by the blocks), which transformers caches on the first call."""
    config = t.BeitConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, image_size=32, patch_size=8,
                          use_relative_position_bias=not shared,
                          use_shared_relative_position_bias=shared, **_labels())
    return (t.BeitForImageClassification(config),
            t.BeitImageProcessor(size={"height": 32, "width": 32}, do_center_crop=False))


def _siglip(t: Any) -> tuple[Any, Any]:
    """A SigLIP classifier: no class token, and an attention-pooling head in its tower."""
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64}
    config = t.SiglipConfig(vision_config=small | {"image_size": 32, "patch_size": 8},
                            text_config=small | {"vocab_size": 64}, **_labels())
    return (t.SiglipForImageClassification(config),
            t.SiglipImageProcessor(size={"height": 32, "width": 32}))


def _vit_gray(t: Any) -> tuple[Any, None]:
    """A one-channel ViT saved without an image processor: its config alone says its input."""
    config = t.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, image_size=24, patch_size=8, num_channels=1,
                         **_labels())
    return t.ViTForImageClassification(config), None


def _detr(t: Any) -> tuple[Any, Any]:
    """DETR with a small ResNet backbone built from its config (no timm, nothing fetched)."""
    backbone = t.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                              out_features=["stage1", "stage2"])
    config = t.DetrConfig(use_timm_backbone=False, backbone_config=backbone,
                          use_pretrained_backbone=False, d_model=16, encoder_layers=1,
                          decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                          num_queries=5, **_labels())
    return (t.DetrForObjectDetection(config),
            t.DetrImageProcessor(size={"height": 32, "width": 32}, do_pad=False))


def _bert(t: Any) -> tuple[Any, None]:
    """A text model: what hookscope refuses as no vision model."""
    config = t.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, vocab_size=50)
    return t.BertForMaskedLM(config), None


BUILDERS = {"vit": _vit, "deit": _deit, "dinov2": _dinov2, "swin": _swin,
            "convnext": _convnext, "segformer": _segformer, "beit": _beit,
            "beit-shared": lambda t: _beit(t, shared=True), "siglip": _siglip,
            "vit-gray": _vit_gray, "detr": _detr, "bert": _bert}


def save_model(key: str, folder: Path, seed: int = 0) -> Path:
    """Build model ``key`` seeded, save it and its image processor (if it has one) to
    ``folder``."""
    import transformers

    torch.manual_seed(seed)
    model, processor = BUILDERS[key](transformers)
    model.save_pretrained(folder)
    if processor is not None:
        processor.save_pretrained(folder)
    return folder
