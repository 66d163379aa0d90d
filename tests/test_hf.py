"""hf:FOLDER: tiny Hugging Face models saved from configs, through every command; their
labels and preprocessing; token maps against pytorch-grad-cam; refusals."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

transformers = pytest.importorskip("transformers")

from hookscope.core.errors import HookscopeError  # noqa: E402
from hookscope.core.hooks import hook_count  # noqa: E402
from hookscope.sources import load  # noqa: E402
from tests.hf_models import KEYS, LABELS, save_model  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Each tiny model saved once for the module, built on first use."""
    root = tmp_path_factory.mktemp("hf")

    class Lazy(dict):
        def __missing__(self, key: str) -> Path:
            self[key] = save_model(key, root / key)
            return self[key]

    return Lazy()


def _json(r) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


# ----------------------------------------------------------------------------- commands


@pytest.mark.parametrize("key", KEYS)
def test_every_command(cli, folders, cat_jpg, tmp_path, key) -> None:
    model = f"hf:{folders[key]}"
    stats = _json(cli("stats", model, cat_jpg, "--per-channel", "-f", "json"))
    assert stats["source"] == "hf" and stats["labels"] == "config:id2label"
    if key != "segformer":  # a segmentation model's output has no top-5 of classes
        assert {p["label"] for p in stats["predictions"][0]} <= set(LABELS.values())
    layers = _json(cli("layers", model, "-f", "json"))
    names = {n for n, _ in load(model).model.named_modules()}
    assert {row["name"] for row in layers["layers"]} <= names
    cam = _json(cli("gradcam", model, cat_jpg, "--out", tmp_path / "cam", "-f", "json"))
    assert cam["layer_default"] and len(cam["layer_shape"]) == 3
    assert cam["results"][0]["label"] in LABELS.values()
    assert Image.open(cam["results"][0]["overlay"]).size == Image.open(cat_jpg).size
    r = cli("grads", model, cat_jpg, "-f", "json")
    if key == "segformer":  # as for torchvision's segmentation models: one line, why
        assert r.exit_code == 2 and "needs a classifier" in r.stderr
    else:
        assert _json(r)["layers"]
    feats = _json(cli("features", model, cat_jpg, "--layer", cam["layer"], "--out",
                      tmp_path / "feat", "-f", "json"))
    assert feats["grids"][0]["shape"] == cam["layer_shape"]
    report = tmp_path / "report.html"
    r = cli("report", model, cat_jpg, "-o", report)
    assert r.exit_code == 0, r.output
    page = report.read_text(encoding="utf-8")
    # A segmentation model's page, as torchvision's: statistics and Grad-CAM, gradients left
    # out (they need class logits), and it says so.
    assert ("Gradients left out" in page) == (key == "segformer")
    assert 'id="gradcam"' in page


def _clear_beit_cache() -> None:
    """Empty transformers' process-wide cache of BEiT's relative position index, so that the
    next call makes it afresh, as the first call of a fresh process does."""
    from transformers.models.beit.modeling_beit import BeitRelativePositionBias

    cells = BeitRelativePositionBias.generate_relative_position_index.__closure__ or ()
    caches = [c.cell_contents for c in cells if hasattr(c.cell_contents, "cache_clear")]
    assert caches  # else transformers no longer caches it, and this test tests nothing
    for cache in caches:
        cache.cache_clear()


@pytest.mark.parametrize("key", ["beit", "beit-shared"])
def test_beit_relative_position_bias(cli, folders, cat_jpg, tmp_path, key) -> None:
    """BEiT caches its relative position index on the first call: a CAM run's plain passes
    (and report's statistics before them) must not make it an inference-mode tensor, which
    the gradient passes after them could not differentiate."""
    model = f"hf:{folders[key]}"
    _clear_beit_cache()
    r = cli("report", model, cat_jpg, "-o", tmp_path / "report.html")
    assert r.exit_code == 0, r.output
    for method in ("gradcam", "attention-grad"):
        _clear_beit_cache()
        doc = _json(cli("gradcam", model, cat_jpg, "-m", method, "--out", tmp_path / method,
                        "-f", "json"))
        assert Path(doc["results"][0]["overlay"]).is_file()


def test_segformer_default_layer_is_not_called_a_backbone_stage(cli, folders, cat_jpg,
                                                                tmp_path) -> None:
    """SegFormer has no ``backbone``: its default layer is its last grid, said as such."""
    r = cli("gradcam", f"hf:{folders['segformer']}", cat_jpg, "--out", tmp_path, "-f", "json")
    assert r.exit_code == 0, r.output
    [note] = [line for line in r.stderr.splitlines() if "using layer" in line]
    assert "using layer decode_head, the last module with an image-grid output" in note
    table = cli("gradcam", f"hf:{folders['segformer']}", cat_jpg, "--out", tmp_path / "t")
    assert table.exit_code == 0 and "backbone" not in table.stdout, table.stdout
    assert "chosen automatically: the last module with an image-grid output" in \
        " ".join(table.stdout.split())


def test_models_lists_the_folders(cli, folders) -> None:
    for key in ("vit", "segformer"):
        folders[key]
    root = folders["vit"].parent
    doc = _json(cli("models", "--source", "hf", root, "-f", "json"))
    found = {m["name"]: m for m in doc["models"]}
    assert found[f"hf:{root / 'vit'}"]["default"] == "ViTForImageClassification"
    assert found[f"hf:{root / 'segformer'}"]["task"] == "segmentation"
    assert "model.safetensors" in found[f"hf:{root / 'vit'}"]["weights"]
    table = cli("models", "--source", "hf", root)
    assert "architecture" in table.stdout and "default weights" not in table.stdout, table.stdout


# ----------------------------------------------------------------------------- loading


@pytest.mark.parametrize("key", ["vit", "deit", "dinov2", "convnext"])
def test_preprocessing_is_the_processors(folders, cat_jpg, key) -> None:
    """The same tensor as the folder's own image processor (its PIL backend) makes."""
    loaded = load(f"hf:{folders[key]}")
    processor = transformers.AutoImageProcessor.from_pretrained(
        folders[key], local_files_only=True, backend="pil")
    image = Image.open(cat_jpg).convert("RGB")
    theirs = processor(image, return_tensors="pt")["pixel_values"][0]
    ours = loaded.preprocess(image)
    assert ours.shape == theirs.shape
    # Resampling rounds to 8-bit pixels on both sides: allow one level, over the std.
    tol = (1 / 255) / min(loaded.std) + 1e-5
    assert float((ours - theirs).abs().max()) <= tol
    if key == "vit":
        assert loaded.mean == (0.5, 0.5, 0.5) and loaded.std == (0.5, 0.5, 0.5)


def test_labels_and_overrides(folders) -> None:
    loaded = load(f"hf:{folders['vit']}")
    assert loaded.categories == ["cat", "dog", "bird"] and loaded.num_classes == 3
    from hookscope.sources import LoadOptions

    over = load(f"hf:{folders['vit']}", LoadOptions(mean=(0.1,), std=(0.2,), crop=24))
    assert over.mean == (0.1,) * 3 and over.preprocess.crop == 24


def test_not_a_folder_is_one_line(cli, tmp_path) -> None:
    file = tmp_path / "model.bin"
    file.write_bytes(b"x")
    for target in (file, tmp_path / "missing", "google/vit-base-patch16-224"):
        r = cli("layers", f"hf:{target}")
        assert r.exit_code == 2 and "Nothing is downloaded" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_remote_code_needs_trust(cli, folders, tmp_path) -> None:
    folder = tmp_path / "remote"
    folder.mkdir()
    config = json.loads((folders["vit"] / "config.json").read_text())
    config["auto_map"] = {"AutoModelForImageClassification": "modeling_x.Net"}
    (folder / "config.json").write_text(json.dumps(config))
    r = cli("layers", f"hf:{folder}")
    assert r.exit_code == 2 and "trust-checkpoint" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_missing_transformers_is_one_line(cli, folders, monkeypatch) -> None:
    folder = folders["vit"]
    monkeypatch.setitem(sys.modules, "transformers", None)  # import raises ImportError
    r = cli("layers", f"hf:{folder}")
    assert r.exit_code == 2 and "pip install 'hookscope[hf]'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _one_line(r, code: int = 2) -> str:
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


def _copy(folder: Path, to: Path, **changes) -> Path:
    """``folder`` copied to ``to`` with its preprocessor_config.json's ``changes``."""
    shutil.copytree(folder, to)
    processor = to / "preprocessor_config.json"
    processor.write_text(json.dumps(json.loads(processor.read_text()) | changes))
    return to


def test_the_saved_architecture_is_loaded(cli, folders, tmp_path) -> None:
    """The folder's config.architectures is what loads, its head included (DETR's box and
    class heads, DeiT's distillation head), not the family's bare Auto class."""
    detr = load(f"hf:{folders['detr']}")
    assert type(detr.model).__name__ == "DetrForObjectDetection"
    assert type(load(f"hf:{folders['deit']}").model).__name__ == \
        "DeiTForImageClassificationWithTeacher"
    doc = _json(cli("layers", f"hf:{folders['detr']}", "--max-depth", "1", "-f", "json"))
    names = {row["name"] for row in doc["layers"]}
    assert {"class_labels_classifier", "bbox_predictor"} <= names
    assert doc["root"]["type"] == "DetrForObjectDetection"
    unknown = tmp_path / "unknown"
    shutil.copytree(folders["vit"], unknown)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps(config | {"architectures": ["NoSuchNet"]}))
    line = _one_line(cli("layers", f"hf:{unknown}"))
    assert "NoSuchNet" in line and "architectures" in line


@pytest.mark.parametrize(("changes", "field", "why"), [
    ({"size": {"height": -5, "width": 0}}, "size.height", "between 8 and 8192"),
    ({"size": {"shortest_edge": 9000}}, "size.shortest_edge", "between 8 and 8192"),
    ({"size": {"height": "big", "width": 32}}, "size.height", "a whole number"),
    ({"image_std": [0, 0, 0]}, "image_std", "must not be zero"),
    ({"image_mean": [0.5, "big", 0.5]}, "image_mean", "numbers"),
    ({"image_mean": [0.5, 0.5]}, "image_mean", "has 2 values"),
    ({"image_std": [float("nan")] * 3}, "image_std", "finite"),
    ({"crop_pct": -1, "key": "convnext"}, "crop_pct", "a number in (0, 1]"),
])
def test_processor_values_are_checked_as_the_options_are(cli, folders, cat_jpg, tmp_path,
                                                         changes, field, why) -> None:
    """A processor's size, mean and std pass the checks --size, --mean and --std pass: one
    line naming the file and the field, exit 2."""
    changes = dict(changes)
    folder = _copy(folders[changes.pop("key", "vit")], tmp_path / "bad", **changes)
    line = _one_line(cli("stats", f"hf:{folder}", cat_jpg))
    assert f"{folder / 'preprocessor_config.json'}: {field}" in line and why in line


def test_a_folder_without_a_processor_is_preprocessed_for_its_config(cli, folders, cat_jpg,
                                                                     tmp_path) -> None:
    """No preprocessor_config.json: the config's image_size and num_channels set the input,
    with ImageNet's resize ratio, mean and std."""
    folder = tmp_path / "vit"
    shutil.copytree(folders["vit"], folder)
    (folder / "preprocessor_config.json").unlink()
    loaded = load(f"hf:{folder}")
    assert loaded.input_size == (32, 32) and loaded.preprocess.origin == "config"
    assert loaded.preprocess.resize == round(32 * 256 / 224)
    r = cli("stats", f"hf:{folder}", cat_jpg, "-f", "json")
    assert "image_size 32" in r.stderr
    assert _json(r)["preprocessing"]["crop"] == 32
    gray = load(f"hf:{folders['vit-gray']}")
    assert gray.input_size == (24, 24) and gray.preprocess.channels == 1
    assert len(gray.mean) == 1 and gray.preprocess(Image.open(cat_jpg)).shape == (1, 24, 24)
    assert _json(cli("stats", f"hf:{folders['vit-gray']}", cat_jpg, "-f", "json"))["layers"]
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"image_size": 4}))
    line = _one_line(cli("stats", f"hf:{folder}", cat_jpg, "--weights", "none"))
    assert f"{folder / 'config.json'}: image_size must be between 8 and 8192" in line


def test_a_text_model_is_refused(cli, folders, cat_jpg, tmp_path) -> None:
    """A BERT folder is no vision model: refused before it is built, saying what runs;
    without a saved architecture too (the class its Auto class would build)."""
    for args in (("stats", f"hf:{folders['bert']}", cat_jpg), ("layers", f"hf:{folders['bert']}")):
        line = _one_line(cli(*args))
        assert "BertForMaskedLM" in line and "not a vision model" in line
        assert "pixel_values" in line
    bare = tmp_path / "bare"
    shutil.copytree(folders["bert"], bare)
    config = json.loads((bare / "config.json").read_text())
    del config["architectures"]
    (bare / "config.json").write_text(json.dumps(config))
    assert "BertModel, not a vision model" in _one_line(cli("layers", f"hf:{bare}"))


# ----------------------------------------------------------------------------- token maps


class Logits(nn.Module):
    """pytorch-grad-cam's Hugging Face wrapper: the model's ``.logits``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x).logits


def _reshape(prefix: int, side: int):
    """pytorch-grad-cam's documented ``reshape_transform``, with the prefix tokens dropped."""
    def transform(tensor: torch.Tensor) -> torch.Tensor:
        result = tensor[:, prefix:, :].reshape(tensor.size(0), side, side, tensor.size(2))
        return result.transpose(2, 3).transpose(1, 2)
    return transform


@pytest.mark.parametrize(("key", "prefix", "side"), [
    ("vit", 1, 4), ("deit", 2, 4), ("dinov2", 5, 4), ("swin", 0, 8)])
def test_token_maps_match_pytorch_grad_cam(folders, key, prefix, side) -> None:
    import hookscope
    from tests.test_cam import TOL, reference

    model = load(f"hf:{folders[key]}").model
    torch.manual_seed(1)
    x = torch.randn(2, 3, 32, 32)
    ours = hookscope.gradcam(model, x, target=[1, 2])
    assert ours.raw.shape == (2, side, side)
    wrapped = Logits(model).eval()
    ref = reference(wrapped, f"m.{ours.layer}", x, [1, 2], "gradcam", _reshape(prefix, side))
    flat = ours.raw.reshape(2, -1)
    lo, hi = flat.min(axis=1)[:, None, None], flat.max(axis=1)[:, None, None]
    assert ref.max() > 0
    np.testing.assert_allclose((ours.raw - lo) / (hi - lo), ref, atol=TOL, rtol=0)
    assert hook_count(model) == 0 and all(p.grad is None for p in model.parameters())


def test_default_layers_of_token_models() -> None:
    """A ViT's default layer is its last block's first norm; its attention internals are
    refused by name."""
    timm = pytest.importorskip("timm")
    from torchvision.models.vision_transformer import VisionTransformer

    import hookscope
    from hookscope.cam.probe import default_layer

    vit = timm.create_model("vit_tiny_patch16_224", img_size=64, depth=2, num_classes=3).eval()
    x = torch.randn(1, 3, 64, 64)
    assert default_layer(vit, x) == ("blocks.1.norm1", [1, 192, 4, 4])
    with pytest.raises(HookscopeError, match="heads x tokens"):
        hookscope.gradcam(vit, x, "blocks.1.attn.k_norm")
    vit.blocks[1].attn.fused_attn = False
    with pytest.raises(HookscopeError, match="attention matrix"):
        hookscope.gradcam(vit, x, "blocks.1.attn.attn_drop")
    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                           hidden_dim=32, mlp_dim=64, num_classes=3).eval()
    assert default_layer(tv, torch.zeros(1, 3, 32, 32))[0] == \
        "encoder.layers.encoder_layer_1.ln_1"


def test_channels_last_outputs_are_laid_out(folders) -> None:
    """ConvNeXt's blocks run channels-last: their GELU output (N, h, w, C) is a grid in
    (N, C, h, w) for the features and has its channels last for the statistics."""
    from hookscope.core.run import drive
    from hookscope.numerics.layout import channel_dim
    from hookscope.probes.features import FeaturesProbe, feature_sites

    model = load(f"hf:{folders['convnext']}").model
    name = "convnext.encoder.stages.1.layers.0.act"
    out = {}
    handle = dict(model.named_modules())[name].register_forward_hook(
        lambda m, i, o: out.setdefault("t", o))
    x = torch.randn(1, 3, 32, 32)
    model(x)
    handle.remove()
    nhwc = out["t"]
    assert nhwc.shape == (1, 4, 4, 64)
    assert channel_dim(nhwc.shape, "GELUActivation", (32, 32)) == 3
    probe = FeaturesProbe(feature_sites(model, [name]), max_channels=64)
    drive(model, x, probe)
    torch.testing.assert_close(probe.kept[0].values, nhwc[0].permute(2, 0, 1))


# ----------------------------------------------------------------------------- attention


def _hf(folder: Path, attn: str) -> nn.Module:
    auto = transformers.AutoModelForImageClassification
    return auto.from_pretrained(folder, local_files_only=True, attn_implementation=attn).eval()


def _reference_attentions(model: nn.Module, x: torch.Tensor, targets: list[int]):
    """The probabilities through transformers' own ``output_attentions``, and the target
    logits' gradients with respect to them (autograd, retain_grad)."""
    out = model(x, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    out.logits[torch.arange(len(targets)), torch.tensor(targets)].sum().backward()
    probs = [a.detach().double() for a in out.attentions]
    grads = [a.grad.double() for a in out.attentions]
    model.zero_grad(set_to_none=True)
    return probs, grads


def _rollout_reference(probs, fusion="mean", discard=0.0) -> torch.Tensor:
    """The paper's recurrence, written out per input: fuse heads, (0.5 A + 0.5 I), rows
    normalised, multiplied through the layers."""
    maps = []
    for n in range(probs[0].shape[0]):
        result = torch.eye(probs[0].shape[-1], dtype=torch.float64)
        for layer in probs:
            heads = layer[n]
            fused = {"mean": heads.mean(0), "max": heads.max(0).values,
                     "min": heads.min(0).values}[fusion].clone()
            flat = fused.view(-1)
            k = int(flat.numel() * discard)
            if k:
                order = sorted(range(flat.numel()), key=lambda i: float(flat[i]))
                for i in order[:k]:
                    if i != 0:
                        flat[i] = 0.0
            a = 0.5 * fused + 0.5 * torch.eye(fused.shape[0], dtype=torch.float64)
            a = a / a.sum(dim=1, keepdim=True)
            result = a @ result
        maps.append(result[0])
    return torch.stack(maps)


def _chefer_reference(probs, grads) -> torch.Tensor:
    """Chefer et al.'s rule: R = I; per block, R += mean_h((grad * A)^+) @ R."""
    maps = []
    for n in range(probs[0].shape[0]):
        r = torch.eye(probs[0].shape[-1], dtype=torch.float64)
        for a, g in zip(probs, grads, strict=True):
            cam = (g[n] * a[n]).clamp(min=0).mean(dim=0)
            r = r + cam @ r
        maps.append(r[0])
    return torch.stack(maps)


@pytest.mark.parametrize(("key", "prefix"), [("vit", 1), ("deit", 2), ("dinov2", 5)])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_rollout_and_attention_grad_match_references(folders, key, prefix, attn) -> None:
    import hookscope

    model = _hf(folders[key], attn)
    torch.manual_seed(2)
    x = torch.randn(2, 3, 32, 32)
    targets = [0, 2]
    probs, grads = _reference_attentions(_hf(folders[key], "eager"), x, targets)
    for fusion, discard in (("mean", 0.0), ("max", 0.0), ("min", 0.5)):
        ours = hookscope.gradcam(model, x, method="rollout", target=targets,
                                 head_fusion=fusion, discard_ratio=discard)
        ref = _rollout_reference(probs, fusion, discard)[:, prefix:].reshape(2, 4, 4)
        np.testing.assert_allclose(ours.raw, ref.numpy(), atol=1e-5, rtol=0)
    ours = hookscope.gradcam(model, x, method="attention-grad", target=targets)
    ref = _chefer_reference(probs, grads)[:, prefix:].reshape(2, 4, 4).clamp(min=0)
    # float32 products of T x T matrices through two layers: a few eps of their size.
    tol = 64 * torch.finfo(torch.float32).eps * float(ref.abs().max()) + 1e-7
    assert float(ref.max()) > 0
    np.testing.assert_allclose(ours.raw, ref.numpy(), atol=tol, rtol=0)
    assert model.config._attn_implementation == attn
    assert hook_count(model) == 0 and all(p.grad is None for p in model.parameters())


def test_attention_methods_on_timm_and_torchvision() -> None:
    """timm's fused attention and torch's MultiheadAttention give their probabilities for
    the pass, and are left as they were."""
    timm = pytest.importorskip("timm")
    from torchvision.models.vision_transformer import VisionTransformer

    import hookscope

    torch.manual_seed(0)
    vit = timm.create_model("deit_tiny_distilled_patch16_224", img_size=32, depth=2,
                            num_classes=3).eval()
    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                           hidden_dim=32, mlp_dim=64, num_classes=3).eval()
    nn.init.normal_(tv.heads.head.weight)  # torchvision starts the head at zero
    x = torch.randn(2, 3, 32, 32)
    for model, side in ((vit, 2), (tv, 4)):
        fused = [getattr(m, "fused_attn", None) for m in model.modules()]
        for method in ("rollout", "attention-grad"):
            r = hookscope.gradcam(model, x, method=method, target=1)
            assert r.raw.shape == (2, side, side) and float(r.raw.min()) >= 0
            assert all(float(m.max()) > 0 for m in r.raw)
        assert [getattr(m, "fused_attn", None) for m in model.modules()] == fused
        assert hook_count(model) == 0 and all(p.grad is None for p in model.parameters())


def test_attention_methods_refuse_what_they_cannot_read(folders, tiny_net) -> None:
    import hookscope

    with pytest.raises(HookscopeError, match="no attention module"):
        hookscope.gradcam(tiny_net, torch.randn(1, 3, 16, 16), "conv1", method="rollout")
    swin = load(f"hf:{folders['swin']}").model
    with pytest.raises(HookscopeError, match="same tokens in every block"):
        hookscope.gradcam(swin, torch.randn(1, 3, 32, 32), method="rollout")
    siglip = load(f"hf:{folders['siglip']}").model
    for method in ("rollout", "attention-grad"):
        with pytest.raises(HookscopeError, match=r"\(1, 1, 16\), \(1, 16, 16\)\].*an "
                           "attention-pooling head.*and no class token") as refused:
            hookscope.gradcam(siglip, torch.randn(1, 3, 32, 32), method=method)
        assert "windowed" not in str(refused.value)
    vit = load(f"hf:{folders['vit']}").model
    with pytest.raises(HookscopeError, match="head_fusion"):
        hookscope.gradcam(vit, torch.randn(1, 3, 32, 32), method="rollout",
                          head_fusion="median")


def test_cli_rollout(cli, folders, cat_jpg, tmp_path) -> None:
    doc = _json(cli("gradcam", f"hf:{folders['dinov2']}", cat_jpg, "-m", "rollout", "-m",
                    "attention-grad", "--head-fusion", "max", "--discard-ratio", "0.2",
                    "--out", tmp_path, "-f", "json"))
    assert [r["method"] for r in doc["results"]] == ["rollout", "attention-grad"]
    assert all(Path(r["overlay"]).is_file() for r in doc["results"])
    # They use no layer: their rows name none, and no default layer is announced for them.
    r = cli("gradcam", f"hf:{folders['dinov2']}", cat_jpg, "-m", "rollout", "--out",
            tmp_path / "one", "-f", "json")
    assert [row["layer"] for row in _json(r)["results"]] == [None]
    assert "using layer" not in r.stderr
    table = cli("gradcam", f"hf:{folders['dinov2']}", cat_jpg, "-m", "rollout", "--out",
                tmp_path / "three")
    assert table.exit_code == 0 and "layer:" not in table.stdout, table.stdout
    mixed = _json(cli("gradcam", f"hf:{folders['dinov2']}", cat_jpg, "-m", "attention-grad",
                      "-m", "gradcam", "--out", tmp_path / "two", "-f", "json"))
    assert [row["layer"] for row in mixed["results"]] == [None, mixed["layer"]]
