"""Your own model: fine-tuned torchvision heads, labels, preprocessing options, outputs that
are not one tensor, and every command on every model form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision.models import get_model
from torchvision.transforms import functional as TF

from hookscope import sources
from hookscope.core.errors import HookscopeError
from hookscope.core.logits import select_logits
from hookscope.sources import LoadOptions
from hookscope.sources.checkpoints import read_labels

CLASSES = ["cat", "dog", "car", "ship", "frog", "horse", "bird", "deer", "truck", "plane"]


def one_line(result, code: int = 2) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stderr
    errors = [ln for ln in lines if ln.startswith("hookscope: error: ")]
    assert len(errors) == 1 and errors[0] == lines[-1] and "Traceback" not in result.stderr
    return errors[0]


@pytest.fixture(scope="module")
def ft10(tmp_path_factory) -> Path:
    """A resnet18 fine-tuned for 10 classes: the checkpoint most users have."""
    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("ft") / "ft10.pt"
    torch.save(get_model("resnet18", weights=None, num_classes=10).state_dict(), path)
    return path


@pytest.fixture(scope="module")
def classes_txt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("labels") / "classes.txt"
    path.write_text("\n".join(CLASSES) + "\n")
    return path


# ------------------------------------------------------------------------- fine-tuned heads


def test_done_when_fine_tuned_resnet_prints_predictions_with_its_labels(cli, cat_jpg, ft10,
                                                                        classes_txt) -> None:
    result = cli("stats", "resnet18", cat_jpg, "--weights", ft10, "--labels", classes_txt,
                 "--layers", "fc", "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["weights"]["num_classes"] == 10 and doc["labels"] == f"file:{classes_txt}"
    # Independent: the same checkpoint in a plain torchvision model, the same preprocessing.
    model = get_model("resnet18", weights=None, num_classes=10).eval()
    model.load_state_dict(torch.load(ft10))
    x = sources.load("resnet18", LoadOptions(weights=str(ft10))).preprocess(
        Image.open(cat_jpg).convert("RGB")).unsqueeze(0)
    with torch.no_grad():
        probs = model(x).softmax(1)[0]
    top = probs.topk(5)
    predicted = doc["predictions"][0]
    assert [p["index"] for p in predicted] == top.indices.tolist()
    assert [p["label"] for p in predicted] == [CLASSES[i] for i in top.indices.tolist()]
    assert predicted[0]["prob"] == pytest.approx(float(top.values[0]), rel=1e-5)
    table = cli("stats", "resnet18", cat_jpg, "--weights", ft10, "--labels", classes_txt,
                "--layers", "fc")
    assert CLASSES[top.indices[0]] in table.stdout


def test_imagenet_labels_are_dropped_for_another_class_count(ft10) -> None:
    loaded = sources.load("resnet18", LoadOptions(weights=str(ft10)))
    assert loaded.num_classes == 10 and loaded.categories is None
    assert loaded.envelope("x", [])["labels"] is None


@pytest.mark.parametrize("name,classes,extra", [
    ("lraspp_mobilenet_v3_large", 4, {}),
    ("fcn_resnet50", 5, {"aux_loss": True}),
    ("googlenet", 7, {"aux_logits": True, "init_weights": True}),
])
def test_fine_tuned_heads_with_auxiliary_heads(tmp_path, name, classes, extra) -> None:
    torch.manual_seed(0)
    kwargs = {"weights_backbone": None} if "aux_loss" in extra or "lraspp" in name else {}
    original = get_model(name, weights=None, num_classes=classes, **extra, **kwargs).eval()
    path = tmp_path / "ft.pt"
    torch.save(original.state_dict(), path)
    loaded = sources.load(name, LoadOptions(weights=str(path)))
    assert loaded.num_classes == classes
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        want, got = original(x), loaded.model(x)
    want = want["out"] if isinstance(want, dict) else want
    got = got["out"] if isinstance(got, dict) else got
    torch.testing.assert_close(got, want)


def test_load_options_take_only_a_seed_torch_takes() -> None:
    assert LoadOptions(seed=2**64 - 1).seed == 2**64 - 1
    with pytest.raises(HookscopeError, match=r"seed 18446744073709551616 is out of range"):
        LoadOptions(seed=2**64)


def test_num_classes(ft10) -> None:
    loaded = sources.load("resnet18", LoadOptions(weights="none", num_classes=3))
    assert loaded.model.fc.out_features == 3 and loaded.num_classes == 3
    with pytest.raises(HookscopeError, match="classifier has 10 classes, but num_classes is 12"):
        sources.load("resnet18", LoadOptions(weights=str(ft10), num_classes=12))
    with pytest.raises(HookscopeError, match="needs random or checkpoint weights"):
        sources.load("resnet18", LoadOptions(weights="DEFAULT", num_classes=3))


def test_other_mismatches_are_still_refused_by_key(tmp_path) -> None:
    state = get_model("resnet18", weights=None, num_classes=10).state_dict()
    state["layer1.0.conv1.weight"] = torch.zeros(64, 64, 5, 5)
    path = tmp_path / "odd.pt"
    torch.save(state, path)
    with pytest.raises(HookscopeError, match=r"layer1.0.conv1.weight is \[64, 64, 5, 5\]"):
        sources.load("resnet18", LoadOptions(weights=str(path)))


# ------------------------------------------------------------------------- labels


@pytest.mark.parametrize("text,name", [
    ("a\nb\nc\n", "labels.txt"),
    ('["a", "b", "c"]', "labels.json"),
    ('{"2": "c", "0": "a", "1": "b"}', "labels.json"),
    ('{"0": "a", "1": "b", "2": "c"}', "labels.anything"),
])
def test_labels_files(tmp_path, text, name) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert read_labels(path) == ["a", "b", "c"]


@pytest.mark.parametrize("text,name,says", [
    ('{"0": "a", "2": "c"}', "labels.json", "class index 1 has no label"),
    ("a\n\nb\n", "labels.txt", "no empty lines"),
    ("[1, 2]", "labels.json", "expected a list of labels"),
    ("[1, ", "labels.json", "not valid JSON"),
])
def test_bad_labels_files(tmp_path, text, name, says) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(HookscopeError, match=says):
        read_labels(path)


def test_label_count_must_match_the_classes(cli, cat_jpg, ft10, tmp_path) -> None:
    path = tmp_path / "three.txt"
    path.write_text("a\nb\nc\n")
    line = one_line(cli("stats", "resnet18", cat_jpg, "--weights", ft10, "--labels", path))
    assert "has 3 labels, but resnet18 has 10 output classes" in line and "--labels" in line


@pytest.mark.parametrize("key,value", [
    ("classes", CLASSES),
    ("class_names", CLASSES),
    ("idx_to_class", {i: c for i, c in enumerate(CLASSES)}),
    ("class_to_idx", {c: i for i, c in enumerate(CLASSES)}),
])
def test_checkpoint_labels(tmp_path, cat_jpg, cli, key, value) -> None:
    torch.manual_seed(1)
    state = get_model("resnet18", weights=None, num_classes=10).state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": state, key: value, "epoch": 3}, path)
    loaded = sources.load("resnet18", LoadOptions(weights=str(path)))
    assert loaded.categories == CLASSES and loaded.labels_from == f"checkpoint:{key}"
    result = cli("gradcam", "resnet18", cat_jpg, "--weights", path, "--target", "frog",
                 "--size", "64", "--out", tmp_path / "out", "-f", "json")
    assert result.exit_code == 0, result.stderr
    row = json.loads(result.stdout)["results"][0]
    assert (row["target"], row["label"]) == (4, "frog")


# ------------------------------------------------------------------------- preprocessing


def test_preprocessing_options_match_an_independent_pipeline(cat_jpg) -> None:
    image = Image.open(cat_jpg).convert("RGB")
    loaded = sources.load("resnet18", LoadOptions(weights="none", resize=100, crop=80,
                                                  mean=(0.5,), std=(0.25,)))
    got = loaded.preprocess(image)
    want = TF.normalize(TF.to_tensor(TF.center_crop(TF.resize(image, 100), 80)),
                        [0.5] * 3, [0.25] * 3)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=0)  # resize kernels differ slightly
    assert (got - want).abs().mean() < 1e-3
    assert loaded.envelope("x", [])["preprocessing"] == {
        "resize": 100, "crop": 80, "mean": [0.5] * 3, "std": [0.25] * 3, "channels": 3,
        "interpolation": "bilinear", "origin": "options"}


def test_default_preprocessing_is_the_weights_own(cat_jpg) -> None:
    from torchvision.models import ResNet18_Weights

    image = Image.open(cat_jpg).convert("RGB")
    loaded = sources.load("resnet18", LoadOptions(weights="none"))
    torch.testing.assert_close(loaded.preprocess(image),
                               ResNet18_Weights.DEFAULT.transforms()(image))
    assert loaded.preprocess.to_dict()["origin"] == "weights"


@pytest.mark.parametrize("options,says", [
    ({"mean": (0.5, 0.5)}, "mean has 2 values; give 1 or 3"),
    ({"std": (0.0,)}, "std must not be zero"),
    ({"input_channels": 2}, "input_channels must be 1 or 3"),
    ({"crop": 100000}, "crop must be between 8 and 8192"),
])
def test_bad_preprocessing_options(options, says) -> None:
    with pytest.raises(HookscopeError, match=says):
        sources.load("resnet18", LoadOptions(weights="none", **options))


@pytest.mark.slow
@pytest.mark.parametrize("name,options,says", [
    ("vit_b_32", {"size": 64}, r"takes 224x224 inputs only \(its image_size\), not 64x64: "
                               r"choose size 224"),
    ("inception_v3", {"size": 64}, r"inputs of at least 75x75 .*not 64x64: choose size 75 or"),
    ("inception_v3", {"crop": 74}, r"inputs of at least 75x75 .*not 74x74"),
    ("maxvit_t", {"size": 256}, r"224x224 inputs only .*MaxVit is built for one size"),
    ("inception_v3", {"size": 75}, None),
    ("swin_t", {"size": 64}, None),  # declares min_size 224, but pads its windows
])
def test_a_size_the_model_declares_it_cannot_take_is_refused_at_load(name, options,
                                                                     says) -> None:
    from hookscope.core.hooks import hook_count

    if says is None:
        loaded = sources.load(name, LoadOptions(weights="none", **options))
        assert hook_count(loaded.model) == 0
        return
    with pytest.raises(HookscopeError, match=says) as caught:
        sources.load(name, LoadOptions(weights="none", **options))
    assert caught.value.exit_code == 2


def test_a_refused_size_is_one_line_before_the_model_runs_on_the_inputs(cli, cat_jpg) -> None:
    from tests.test_cli_stats import one_error_line

    line = one_error_line(cli("stats", "vit_b_32", cat_jpg, "--weights", "none", "--size", "64"))
    assert line.endswith("takes 224x224 inputs only (its image_size), not 64x64: choose "
                         "--size 224, or leave it out.")


def test_random_weights_are_preprocessed_at_the_size_the_model_is_built_for(
        cli, cat_jpg, monkeypatch, tmp_path) -> None:
    """A ViT whose default weights preprocess at 384 px (as vit_h_14's at 518), built
    without them at its builder's 224: the weights' pipeline, scaled to 224, and a note.
    A tiny ViT stands in for the builder, the weights' own meta and transforms are real."""
    from types import SimpleNamespace

    from torchvision.models import ViT_B_16_Weights
    from torchvision.models.vision_transformer import VisionTransformer

    from hookscope.sources import torchvision as tv

    swag = ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1
    assert swag.transforms().crop_size == [384]  # else this tests nothing

    def build(name, weights, seed, num_classes=None, extra=None):
        assert weights is None  # --weights none: the builder's default size, 224
        torch.manual_seed(seed)
        return VisionTransformer(image_size=224, patch_size=32, num_layers=1, num_heads=2,
                                 hidden_dim=16, mlp_dim=16, num_classes=num_classes or 1000)

    monkeypatch.setattr(tv, "weights_enum", lambda name: SimpleNamespace(DEFAULT=swag))
    monkeypatch.setattr(tv, "_build", build)
    loaded = sources.load("vit_b_16", LoadOptions(weights="none"))
    assert loaded.input_size == (224, 224) and loaded.preprocess.interpolation == "bicubic"
    image = Image.open(cat_jpg).convert("RGB")
    expected = TF.normalize(TF.to_tensor(TF.center_crop(TF.resize(
        image, 224, TF.InterpolationMode.BICUBIC), 224)), swag.transforms().mean,
        swag.transforms().std)
    torch.testing.assert_close(loaded.preprocess(image), expected, atol=2 / 255 / 0.5,
                               rtol=0)  # resampling rounds to 8-bit pixels: a level or two
    r = cli("stats", "vit_b_16", cat_jpg, "--weights", "none", "-f", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["preprocessing"]["crop"] == 224
    assert "built for 224x224" in r.stderr and "384x384" in r.stderr
    cam = cli("gradcam", "vit_b_16", cat_jpg, "--weights", "none", "--out", tmp_path, "-f",
              "json")
    assert cam.exit_code == 0, cam.output
    assert json.loads(cam.stdout)["preprocessing"]["crop"] == 224


GRAY = """
import torch
from torch import nn


class Gray(nn.Module):
    '''A one-channel classifier returning a dict of outputs.'''

    def __init__(self, classes=4, extra=False):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, classes)
        self.extra = extra

    def forward(self, x):
        feats = self.pool(torch.relu(self.conv(x))).flatten(1)
        if self.extra:
            return {"features": feats, "scores": self.fc(feats)}
        return {"logits": self.fc(feats), "features": feats}
"""


@pytest.fixture()
def gray_py(tmp_path) -> Path:
    path = tmp_path / "gray.py"
    path.write_text(GRAY)
    return path


def test_one_channel_model_with_a_dict_output(cli, gray_py, cat_jpg, tmp_path) -> None:
    labels = tmp_path / "four.json"
    labels.write_text('["w", "x", "y", "z"]')
    result = cli("stats", f"{gray_py}:Gray", cat_jpg, "--channels", "1", "--size", "32",
                 "--labels", labels, "-f", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["input_shape"] == [1, 32, 32] and doc["preprocessing"]["channels"] == 1
    assert doc["preprocessing"]["mean"] == [0.449]  # ImageNet's mean, averaged
    assert {p["label"] for p in doc["predictions"][0]} == {"w", "x", "y", "z"}
    three = cli("stats", f"{gray_py}:Gray", cat_jpg, "--size", "32")  # RGB into a 1-channel conv
    assert "conv (Conv2d, input shapes [[1, 3, 32, 32]])" in one_line(three, 1)


def test_ambiguous_outputs_list_their_keys(cli, gray_py, cat_jpg, tmp_path) -> None:
    common = (f"{gray_py}:Gray", cat_jpg, "--channels", "1", "--size", "32",
              "--model-arg", "extra=True")
    line = one_line(cli("grads", *common))
    assert "features [1, 6]" in line and "scores [1, 4]" in line and "--output-key" in line
    ok = cli("grads", *common, "--output-key", "scores", "-f", "json")
    assert ok.exit_code == 0, ok.stderr
    assert json.loads(ok.stdout)["layers"][0]["name"] == "fc"
    missing = one_line(cli("grads", *common, "--output-key", "nope"))
    assert "--output-key 'nope' is not a tensor" in missing


def test_select_logits_forms() -> None:
    from collections import namedtuple
    from dataclasses import dataclass

    t = torch.zeros(2, 3)

    @dataclass
    class Out:
        loss: None
        logits: torch.Tensor

    Pair = namedtuple("Pair", "aux main")
    assert select_logits(t) is t
    assert select_logits(Out(None, t)) is t
    assert select_logits({"out": t, "aux": t + 1}) is t
    assert select_logits((t,)) is t
    assert select_logits(Pair(t + 1, t), "main") is t
    assert select_logits((t, t + 1), "1") is not t
    assert select_logits([t, t + 1], required=False) is None
    with pytest.raises(HookscopeError, match=r"0 \[2, 3\], 1 \[2, 3\]"):
        select_logits((t, t + 1))


# ------------------------------------------------------------------------- every form


@pytest.fixture(scope="module")
def forms(tmp_path_factory, ft10) -> dict[str, list[str]]:
    """MODEL (and options) for each model form, all small."""
    folder = tmp_path_factory.mktemp("forms")
    net = folder / "net.py"
    net.write_text(GRAY.replace("nn.Conv2d(1, 6", "nn.Conv2d(3, 6"))
    torch.manual_seed(0)
    pickled = folder / "whole.pt"
    torch.save(get_model("mobilenet_v3_small", weights=None, num_classes=5), pickled)
    return {
        "torchvision-fine-tuned": ["resnet18", "--weights", str(ft10)],
        "timm": ["timm:resnet18", "--weights", "none"],
        "code": [f"{net}:Gray"],
        "pickle": [str(pickled), "--trust-checkpoint"],
    }


COMMANDS = {
    "stats": ["-f", "json"],
    "layers": ["-f", "json"],
    "debug": ["-f", "json"],
    "gradcam": ["-f", "json", "--out", "{out}"],
    "grads": ["-f", "json"],
    "features": ["-f", "json", "--type", "Conv2d", "--max-channels", "4", "--out", "{out}"],
    "ablate": ["-f", "json", "--layer", "{layer}", "--channels", "0-1"],
}
LAYER = {"torchvision-fine-tuned": "layer4", "timm": "layer4", "code": "conv",
         "pickle": "features"}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("form", list(LAYER))
def test_every_command_on_every_model_form(cli, forms, cat_jpg, tmp_path, form, command) -> None:
    model, *options = forms[form]
    extra = [a.replace("{out}", str(tmp_path / "out")).replace("{layer}", LAYER[form])
             for a in COMMANDS[command]]
    args = [command, model] + ([] if command == "layers" else [str(cat_jpg)])
    result = cli(*args, *options, "--size", "64", *extra)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["command"] == command and doc["source"] == form.split("-")[0]


def test_prefixed_forms_are_never_taken_for_code() -> None:
    from hookscope.sources import SOURCES, _builtin, resolve

    _builtin()
    order = list(SOURCES)
    SOURCES.reverse()  # code and pickles registered first, as when their modules load first
    try:
        assert resolve("hf:tiny").source == "hf" and resolve("timm:resnet18").source == "timm"
    finally:
        SOURCES[:] = order
