"""An image-text hf: folder (a tiny CLIPModel and its tokenizer, built offline and saved with
``save_pretrained``): ``stats``, ``layers`` and ``gradcam`` with ``--text`` (the texts are the
classes, scored by ``logits_per_image``) or with inputs holding ``input_ids``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

EPS32 = float(torch.finfo(torch.float32).eps)
TEXTS = ["a cat", "a dog", "a bird"]
LAYER = "vision_model.encoder.layers.1.layer_norm1"


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """CLIP with a 32 px, 8 px patch vision tower and a letters-only tokenizer (no merges)."""
    t = transformers
    folder = tmp_path_factory.mktemp("clip")
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    vocab |= {c + end: 2 + 2 * i + j for i, c in enumerate(letters) for j, end in enumerate(("", "</w>"))}
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    config = t.CLIPConfig(vision_config=small | {"image_size": 32, "patch_size": 8},
                          text_config=small | {"vocab_size": len(vocab), "max_position_embeddings": 16,
                                               "eos_token_id": 1, "bos_token_id": 0, "pad_token_id": 1},
                          projection_dim=16)
    torch.manual_seed(0)
    t.CLIPModel(config).save_pretrained(folder)
    t.CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(folder)
    t.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
                         ).save_pretrained(folder)
    torch.save(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)), folder / "pixels.pt")
    return folder


def reference(folder: Path, pixels: torch.Tensor, texts: list[str]):
    """The saved model in float64 and the texts' tokens, straight from transformers."""
    model = transformers.CLIPModel.from_pretrained(folder).double().eval()
    tokens = transformers.AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="pt")
    return model, dict(tokens), pixels.double()


def run(cli, *args) -> dict:
    r = cli(*args, "-f", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_stats_and_layers_with_texts(cli, clip) -> None:
    pixels = torch.load(clip / "pixels.pt")
    model, tokens, x = reference(clip, pixels, TEXTS)
    with torch.no_grad():
        probs = model(pixel_values=x, **tokens).logits_per_image.softmax(1)
    texts = [a for text in TEXTS for a in ("--text", text)]
    doc = run(cli, "stats", f"hf:{clip}", clip / "pixels.pt", *texts)
    for i, preds in enumerate(doc["predictions"]):
        assert [p["label"] for p in preds] == [TEXTS[j] for j in probs[i].argsort(descending=True)]
        # A float32 forward of two 32-wide blocks per tower: ~1e-6 relative; 1e-5 leaves room.
        np.testing.assert_allclose([p["prob"] for p in preds], probs[i].sort(descending=True).values,
                                   rtol=0, atol=1e-5)
    layers = run(cli, "layers", f"hf:{clip}", clip / "pixels.pt", *texts)
    assert layers["root"]["params_total"] == sum(p.numel() for p in model.parameters())
    rows = {r["name"]: r for r in layers["layers"]}
    assert rows["text_projection"]["calls"][0]["output_shape"] == [3, 16]  # the 3 texts
    assert rows["visual_projection"]["calls"][0]["output_shape"] == [1, 16]


def test_gradcam_on_the_vision_tower_by_its_definition(cli, clip, tmp_path) -> None:
    """Grad-CAM of the image-text logit of text 1 at the vision tower's last block norm:
    the patch tokens (after the class token) on their 4 x 4 grid, channel weights the mean
    gradient, the ReLU of the weighted sum; in float64 with autograd.grad."""
    pixels = torch.load(clip / "pixels.pt")
    model, tokens, x = reference(clip, pixels, TEXTS)
    kept = []
    handle = dict(model.named_modules())[LAYER].register_forward_hook(lambda m, i, o: kept.append(o))
    logits = model(pixel_values=x, **tokens).logits_per_image
    handle.remove()
    (grad,) = torch.autograd.grad(logits[:, 1].sum(), kept[0])
    acts, grad = kept[0][:, 1:].reshape(2, 4, 4, 32), grad[:, 1:].reshape(2, 4, 4, 32)
    want = (grad.mean((1, 2), keepdim=True) * acts).sum(-1).clamp(min=0).detach().numpy()
    doc = run(cli, "gradcam", f"hf:{clip}", clip / "pixels.pt", *[a for t in TEXTS for a in ("--text", t)],
              "--target", "a dog", "--layer", LAYER, "--save-raw", "--out", tmp_path / "cams")
    assert [r["target"] for r in doc["results"]] == [1, 1]
    got = np.stack([np.load(r["raw"]) for r in doc["results"]])
    # 32 channels of a 32-wide float32 tower (two blocks, layer norms): eps per term and layer.
    np.testing.assert_allclose(got, want, rtol=0, atol=EPS32 * 32 * 32 * 4 * np.abs(want).max())


def test_inputs_holding_input_ids_and_the_refusals(cli, clip, tmp_path) -> None:
    """A .pt dict of pixel_values, input_ids and attention_mask runs the model's own forward
    (each image against the batch's texts); an image alone needs --text; --text needs an
    image-text model."""
    pixels = torch.load(clip / "pixels.pt")
    model, tokens, x = reference(clip, pixels, TEXTS[:2])
    torch.save({"pixel_values": pixels, **tokens}, tmp_path / "pairs.pt")
    with torch.no_grad():
        probs = model(pixel_values=x, **tokens).logits_per_image.softmax(1)
    doc = run(cli, "stats", f"hf:{clip}", tmp_path / "pairs.pt", "--batch-size", "2")
    got = [max(p["prob"] for p in preds) for preds in doc["predictions"]]
    np.testing.assert_allclose(got, probs.max(1).values, rtol=0, atol=1e-5)
    r = cli("gradcam", f"hf:{clip}", tmp_path / "pairs.pt", "--layer", LAYER, "--out", tmp_path / "c")
    assert r.exit_code == 0, r.output
    r = cli("stats", f"hf:{clip}", clip / "pixels.pt")
    assert r.exit_code == 2 and "give the texts with --text" in r.stderr and "Traceback" not in r.output
    r = cli("stats", "resnet18", "--weights", "none", clip / "pixels.pt", "--text", "a cat")
    assert r.exit_code == 2 and "--text gives the texts" in r.stderr
