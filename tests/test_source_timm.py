"""The timm source (``timm:NAME``): weights modes, preprocessing, checkpoints, the commands
and the catalog. Nothing downloads: any socket connection fails the test."""

from __future__ import annotations

import json
import math
import socket
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import timm  # the test extra installs it
import torch
from PIL import Image

from hookscope import sources
from hookscope.core.errors import HookscopeError
from hookscope.sources.base import LoadOptions

FAST = ("--weights", "none", "--size", "64")

# One intra-op thread: on a shared 2-core machine, two spinning threads run 10x slower.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    """Fail on any connection; empty Hugging Face and torch hub caches."""
    from huggingface_hub import constants

    def refuse(*args):
        pytest.fail(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))


def _load(name: str = "timm:resnet18", **options) -> sources.LoadedModel:
    return sources.load(name, LoadOptions(**options))


def _seeded(name: str, seed: int, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(name, **kwargs).eval()


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_none_is_seeded_like_timm_and_leaves_the_global_rng() -> None:
    before = torch.get_rng_state()
    a = _load(weights="none", seed=3)
    assert torch.equal(torch.get_rng_state(), before)
    b, c = _load(weights="none", seed=3), _load(weights="none", seed=4)
    assert _same_weights(a.model, b.model) and not _same_weights(a.model, c.model)
    assert _same_weights(a.model, _seeded("resnet18", 3))
    assert a.weights_loaded == "random (seed 3)" and a.weights_requested == "none"
    assert (a.source, a.task, a.num_classes, a.input_ndim) == ("timm", "classification", 1000, 4)
    assert a.categories is None and not a.model.training


@pytest.mark.parametrize("name", ["resnet18", "convnext_atto", "vit_tiny_patch16_224"])
def test_preprocessing_is_timms_data_config(name, cat_jpg) -> None:
    from timm.data import create_transform, resolve_data_config

    loaded = _load(f"timm:{name}", weights="none")
    config = resolve_data_config({}, model=timm.create_model(name))
    image = Image.open(cat_jpg).convert("RGB")
    theirs = create_transform(**config)(image)
    assert torch.equal(loaded.preprocess(image), theirs)
    p = loaded.preprocess
    assert p.crop == config["input_size"][-1] and p.channels == config["input_size"][0]
    assert p.resize == math.floor(p.crop / config["crop_pct"])
    assert (p.mean, p.std) == (tuple(config["mean"]), tuple(config["std"]))
    assert (p.interpolation, p.origin) == (config["interpolation"], "timm")
    # The description alone (hookscope's own pipeline) reproduces timm's transform.
    assert torch.allclose(replace(p, transform=None)(image), theirs, atol=1e-5)


def test_size_rescales_timms_transform(cat_jpg) -> None:
    from timm.data import create_transform, resolve_data_config

    loaded = _load(weights="none", size=64)
    config = resolve_data_config({}, model=timm.create_model("resnet18"))
    config["input_size"] = (3, 64, 64)
    image = Image.open(cat_jpg).convert("RGB")
    assert torch.equal(loaded.preprocess(image), create_transform(**config)(image))
    assert (loaded.input_size, loaded.preprocess.resize) == ((64, 64), math.floor(64 / 0.95))
    with pytest.raises(HookscopeError, match="size must be between"):
        _load(weights="none", size=4)


@pytest.mark.slow
@pytest.mark.parametrize("name,size,says", [
    ("levit_128s", 64, r"timm:levit_128s takes 224x224 inputs only \(its pretrained_cfg has "
                       r"fixed_input_size\), not 64x64: choose size 224"),
    ("vit_tiny_patch16_224", 96, "takes 224x224 inputs only"),
    ("xcit_nano_12_p16_224", 64, None),  # declares a fixed size, but takes others
])
def test_a_fixed_input_size_is_refused_at_load(name, size, says) -> None:
    from hookscope import sources
    from hookscope.sources import LoadOptions

    options = LoadOptions(weights="none", size=size)
    if says is None:
        assert sources.load(f"timm:{name}", options).input_size == (size, size)
        return
    with pytest.raises(HookscopeError, match=says):
        sources.load(f"timm:{name}", options)


def test_auto_offline_is_random_with_one_warning(caplog) -> None:
    with caplog.at_level("WARNING", logger="hookscope"):
        loaded = _load(weights="auto", seed=2)
    assert loaded.weights_loaded == "random (seed 2)" and loaded.weights_requested == "auto"
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "random initialisation" in warnings[0].getMessage()
    assert "resnet18.a1_in1k" in warnings[0].getMessage()
    assert _same_weights(loaded.model, _seeded("resnet18", 2))


def test_auto_probes_the_hub_only_when_online(monkeypatch, caplog) -> None:
    probed = []

    def unreachable(address, timeout=None, *args):
        probed.append((address, timeout))
        raise OSError("unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    _load(weights="auto")
    assert probed == []  # HOOKSCOPE_OFFLINE (conftest) forbids even the probe
    monkeypatch.delenv("HOOKSCOPE_OFFLINE")
    caplog.clear()
    with caplog.at_level("WARNING", logger="hookscope"):
        loaded = _load(weights="auto")
    assert probed == [(("huggingface.co", 443), 2.0)]
    assert loaded.weights_loaded == "random (seed 0)"
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


def _hf_cached(tmp_path: Path, repo: str, state: dict[str, torch.Tensor]) -> Path:
    """Write ``state`` where huggingface_hub's cache keeps ``repo``'s model.safetensors."""
    from safetensors.torch import save_file

    folder = tmp_path / "hf" / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, snapshot / "model.safetensors")
    return snapshot / "model.safetensors"


@pytest.mark.parametrize("weights", ["auto", "DEFAULT", "a1_in1k", "resnet18.a1_in1k"])
def test_pretrained_from_the_hugging_face_cache(tmp_path, weights) -> None:
    source = _seeded("resnet18", 11)
    _hf_cached(tmp_path, "timm/resnet18.a1_in1k", source.state_dict())
    loaded = _load(weights=weights)
    assert loaded.weights_loaded == "a1_in1k"
    assert _same_weights(loaded.model, source)
    from timm.data import ImageNetInfo

    assert loaded.categories == ImageNetInfo().label_descriptions()
    assert loaded.labels_from == "weights" and loaded.categories[1].startswith("goldfish")


def test_pretrained_tag_from_the_torch_hub_cache(tmp_path) -> None:
    from timm.models import get_pretrained_cfg

    source = _seeded("resnet18", 12)
    url = get_pretrained_cfg("resnet18.tv_in1k").url
    cached = tmp_path / "torch" / "hub" / "checkpoints" / Path(url).name
    cached.parent.mkdir(parents=True)
    torch.save(source.state_dict(), cached)
    loaded = _load("timm:resnet18.tv_in1k", weights="auto")
    assert loaded.weights_loaded == "tv_in1k" and _same_weights(loaded.model, source)
    # tv_in1k's own data config: torchvision's 0.875 crop and bilinear resize.
    assert (loaded.preprocess.resize, loaded.preprocess.interpolation) == (256, "bilinear")


def test_named_weights_errors() -> None:
    with pytest.raises(HookscopeError, match="cannot be downloaded") as err:
        _load(weights="DEFAULT")
    assert "a1_in1k" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(HookscopeError, match="tv_in1k") as err:
        _load(weights="tv_in1kk")
    assert "Did you mean" in str(err.value)
    with pytest.raises(HookscopeError, match="num_classes 10 needs random"):
        _load(weights="tv_in1k", num_classes=10)
    with pytest.raises(HookscopeError, match="a1_in1k"):
        _load("timm:resnet18.zzz", weights="none")


def test_auto_with_num_classes_is_random_without_warning(caplog) -> None:
    with caplog.at_level("WARNING", logger="hookscope"):
        loaded = _load(weights="auto", num_classes=7)
    assert loaded.num_classes == 7 and loaded.weights_loaded == "random (seed 0)"
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert loaded.model(torch.zeros(1, 3, 32, 32)).shape == (1, 7)


def test_unknown_name_suggests_close_timm_names() -> None:
    with pytest.raises(HookscopeError, match="resnet18") as err:
        _load("timm:resnet81", weights="none")
    assert "Unknown timm model" in str(err.value) and "\n" not in str(err.value)


def test_checkpoint_loads_exactly(tmp_path) -> None:
    source = _seeded("resnet18", 7)
    path = tmp_path / "resnet18.pt"
    torch.save(source.state_dict(), path)
    loaded = _load(weights=str(path))
    assert loaded.weights_loaded == f"file:{path}" and _same_weights(loaded.model, source)
    assert loaded.categories is None and loaded.num_classes == 1000


def test_fine_tuned_checkpoint_rebuilds_the_head(tmp_path) -> None:
    source = _seeded("resnet18", 8, num_classes=10)
    path = tmp_path / "finetuned.pth"
    labels = [f"class{i}" for i in range(10)]
    torch.save({"state_dict": source.state_dict(), "classes": labels}, path)
    loaded = _load(weights=str(path))
    assert loaded.num_classes == 10 and loaded.model.get_classifier().out_features == 10
    assert _same_weights(loaded.model, source)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), source(x))
    assert loaded.categories == labels and loaded.labels_from == "checkpoint:classes"
    with pytest.raises(HookscopeError, match="10 classes, but num_classes is 5"):
        _load(weights=str(path), num_classes=5)


def test_wrong_architecture_checkpoint_is_one_clear_error(tmp_path) -> None:
    path = tmp_path / "convnext.pt"
    torch.save(timm.create_model("convnext_atto").state_dict(), path)
    with pytest.raises(HookscopeError, match="does not fit timm:resnet18") as err:
        _load(weights=str(path))
    assert "another architecture" in str(err.value) and "\n" not in str(err.value)


def test_without_timm_one_line_names_the_install_command(monkeypatch) -> None:
    from hookscope.catalog import find_timm_models

    monkeypatch.setitem(sys.modules, "timm", None)
    for call in (lambda: _load(weights="none"), lambda: find_timm_models("resnet*")):
        with pytest.raises(HookscopeError) as err:
            call()
        message = str(err.value)
        assert "pip install 'hookscope[timm]'" in message and "\n" not in message


def test_cli_stats(cli, cat_jpg) -> None:
    r = cli("stats", "timm:mobilenetv3_small_050", cat_jpg, *FAST, "-f", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["model"], doc["source"]) == ("timm:mobilenetv3_small_050", "timm")
    assert doc["weights"] == {"requested": "none", "loaded": "random (seed 0)",
                              "num_classes": 1000}
    assert doc["preprocessing"]["origin"] == "timm" and doc["preprocessing"]["crop"] == 64
    top = doc["predictions"][0]
    assert len(top) == 5 and all(0 <= p["index"] < 1000 and 0 < p["prob"] < 1 for p in top)
    names = {name for name, _ in timm.create_model("mobilenetv3_small_050").named_modules()}
    assert {row["name"] for row in doc["layers"]} <= names


def test_cli_gradcam_default_layer(cli, cat_jpg, tmp_path) -> None:
    out = tmp_path / "out"
    r = cli("gradcam", "timm:resnet18", cat_jpg, "--out", out, *FAST, "-f", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["source"] == "timm" and doc["layer_default"] is True
    # The last module with a spatial output, found independently on timm's own model.
    model, outputs = timm.create_model("resnet18").eval(), {}
    for name, module in model.named_modules():
        module.register_forward_hook(lambda m, i, o, name=name: outputs.__setitem__(name, o))
    model(torch.zeros(1, 3, 64, 64))
    spatial = [n for n, o in outputs.items()
               if isinstance(o, torch.Tensor) and o.dim() == 4 and o.shape[2] * o.shape[3] > 1]
    assert doc["layer"] == spatial[-1] and doc["layer_shape"] == list(outputs[spatial[-1]].shape[1:])
    assert len(doc["results"]) == 1
    overlay = Path(doc["results"][0]["overlay"])
    assert overlay.suffix == ".png" and Image.open(overlay).size == Image.open(cat_jpg).size


def test_cli_layers_match_timm_and_torchinfo(cli) -> None:
    import torchinfo

    r = cli("layers", "timm:resnet18", "--weights", "none", "-f", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["source"] == "timm" and doc["input_shape"] == [3, 224, 224]
    model = timm.create_model("resnet18")
    assert [row["name"] for row in doc["layers"]] == [n for n, _ in model.named_modules()][1:]
    theirs = torchinfo.summary(model, input_data=torch.zeros(1, 3, 224, 224), verbose=0)
    totals = doc["totals"]
    assert totals["params"] == sum(p.numel() for p in model.parameters())
    # torchinfo also counts bias and BatchNorm terms as multiply-adds: they differ by little.
    assert totals["flops"] / 2 == pytest.approx(theirs.total_mult_adds, rel=0.02)


def test_find_timm_models() -> None:
    from timm.models import get_pretrained_cfg

    from hookscope.catalog import find_timm_models

    found = {m.name: m for m in find_timm_models("resnet1*")}
    assert set(found) == {f"timm:{n}" for n in timm.list_models("resnet1*")}
    info = found["timm:resnet18"]
    assert info.task == "classification"
    assert set(info.weights) == {n.split(".", 1)[1] for n in timm.list_pretrained("resnet18.*")}
    assert info.default == info.weights[0] == get_pretrained_cfg("resnet18").tag
    assert "timm:convnext_atto" in {m.name for m in find_timm_models("convnext_at")}
    assert all(sources.resolve(name).source == "timm" for name in found)
    with pytest.raises(HookscopeError, match="No timm model matches"):
        find_timm_models("resnxt99*")
    with pytest.raises(HookscopeError, match="classification"):
        find_timm_models("resnet*", task="detection")


def test_cli_models_source_timm(cli) -> None:
    r = cli("models", "--source", "timm", "resnet1*", "-f", "json")
    assert r.exit_code == 0, r.output
    names = {m["name"].removeprefix("timm:") for m in json.loads(r.stdout)["models"]}
    assert names == set(timm.list_models("resnet1*"))
