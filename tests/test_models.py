"""Model names, every --weights mode, devices. Nothing downloads (see conftest)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision.models import get_model

from hookscope.core.errors import HookscopeError
from hookscope.sources import load_model
from hookscope.sources.base import resolve_device
from hookscope.sources.checkpoints import open_checkpoint


def _weights_of(model: torch.nn.Module) -> torch.Tensor:
    return next(model.parameters()).detach().clone()


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(HookscopeError, match="resnet18"):
        load_model("resnet81", weights="none")


def test_none_is_seeded_and_reproducible() -> None:
    a = load_model("resnet18", weights="none", seed=3)
    b = load_model("resnet18", weights="none", seed=3)
    c = load_model("resnet18", weights="none", seed=4)
    assert torch.equal(_weights_of(a.model), _weights_of(b.model))
    assert not torch.equal(_weights_of(a.model), _weights_of(c.model))
    assert a.weights_loaded == "random (seed 3)" and not a.model.training
    # Labels and preprocessing still come from the DEFAULT weights' metadata.
    assert a.categories is not None and len(a.categories) == 1000
    assert a.input_size == (224, 224) and a.mean == (0.485, 0.456, 0.406)


def test_auto_without_cache_or_network_falls_back_with_one_warning(caplog) -> None:
    with caplog.at_level("WARNING", logger="hookscope"):
        loaded = load_model("resnet18", weights="auto")
    assert loaded.weights_loaded.startswith("random")
    assert loaded.weights_requested == "auto"
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "random initialisation" in warnings[0].getMessage()


def test_auto_uses_cached_default_weights(tmp_path, monkeypatch) -> None:
    import torchvision.models as tvm

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    torch.manual_seed(11)
    source = get_model("resnet18", weights=None)
    weights = tvm.ResNet18_Weights.DEFAULT
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
    cached.parent.mkdir(parents=True)
    torch.save(source.state_dict(), cached)
    monkeypatch.setattr(tvm.ResNet18_Weights.IMAGENET1K_V1.value, "url", weights.url)
    # torchvision checks the file hash; a file we wrote ourselves cannot match it.
    monkeypatch.setattr("torch.hub.load_state_dict_from_url",
                        lambda url, *a, **k: torch.load(cached, weights_only=True))
    loaded = load_model("resnet18", weights="auto")
    assert loaded.weights_loaded == "IMAGENET1K_V1"
    assert torch.equal(_weights_of(loaded.model), _weights_of(source))


def test_enum_names_and_errors() -> None:
    with pytest.raises(HookscopeError, match="IMAGENET1K_V1"):
        load_model("resnet18", weights="IMAGENET1K_V9")
    with pytest.raises(HookscopeError, match="cannot be downloaded"):
        load_model("resnet18", weights="DEFAULT")


def _save_state(tmp_path: Path, name: str, obj) -> Path:
    path = tmp_path / name
    torch.save(obj, path)
    return path


@pytest.mark.parametrize("wrap", ["plain", "state_dict", "model", "dataparallel"])
def test_checkpoint_forms(tmp_path, wrap) -> None:
    torch.manual_seed(5)
    source = get_model("resnet18", weights=None)
    state = source.state_dict()
    obj = {
        "plain": state,
        "state_dict": {"state_dict": state, "epoch": 3},
        "model": {"model": state},
        "dataparallel": {f"module.{k}": v for k, v in state.items()},
    }[wrap]
    loaded = load_model("resnet18", weights=str(_save_state(tmp_path, "ckpt.pt", obj)))
    assert torch.equal(_weights_of(loaded.model), _weights_of(source))
    assert loaded.weights_loaded.startswith("file:")


def test_safetensors_checkpoint(tmp_path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(6)
    source = get_model("resnet18", weights=None)
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    loaded = load_model("resnet18", weights=str(path))
    assert torch.equal(_weights_of(loaded.model), _weights_of(source))


class Custom:
    pass


def test_untrusted_pickle_refused_then_allowed(tmp_path) -> None:
    import __main__

    __main__.Custom = Custom  # picklable by reference
    torch.manual_seed(7)
    state = get_model("resnet18", weights=None).state_dict()
    path = _save_state(tmp_path, "pickled.pt", {"state_dict": state, "extra": Custom()})
    with pytest.raises(HookscopeError, match="set trust_checkpoint"):
        load_model("resnet18", weights=str(path))
    loaded = load_model("resnet18", weights=str(path), trust_checkpoint=True)
    assert torch.equal(_weights_of(loaded.model), state["conv1.weight"])


def test_checkpoint_errors(tmp_path) -> None:
    with pytest.raises(HookscopeError, match="not found"):
        load_model("resnet18", weights=str(tmp_path / "missing.pt"))
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint at all")
    with pytest.raises(HookscopeError, match="not a PyTorch checkpoint"):
        load_model("resnet18", weights=str(junk))
    other = _save_state(tmp_path, "r34.pt", get_model("resnet34", weights=None).state_dict())
    with pytest.raises(HookscopeError, match="unexpected key"):
        load_model("resnet18", weights=str(other))
    mobilenet = _save_state(tmp_path, "m.pt", get_model("mobilenet_v3_small", weights=None)
                            .state_dict())
    with pytest.raises(HookscopeError, match="another architecture"):
        load_model("resnet18", weights=str(mobilenet))
    wide = get_model("resnet18", weights=None).state_dict()
    wide["fc.weight"] = torch.zeros(1000, 256)  # not a fine-tuned head: the features differ
    # Whole shapes, never cut mid-number.
    with pytest.raises(HookscopeError,
                       match=r"fc.weight is \[1000, 256\] in the file and \[1000, 512\] in the model"):
        load_model("resnet18", weights=str(_save_state(tmp_path, "wide.pt", wide)))
    with pytest.raises(HookscopeError, match="not a checkpoint"):
        open_checkpoint(_save_state(tmp_path, "list.pt", [1, 2, 3]))


def test_size_override_rescales_crop_and_resize() -> None:
    loaded = load_model("resnet18", weights="none", size=112)
    assert loaded.input_size == (112, 112)
    assert loaded.preprocess.resize_size == [128]


def test_detection_and_segmentation_build_without_downloading_a_backbone(monkeypatch) -> None:
    """torchvision's detection and segmentation builders download a backbone even with
    weights=None unless told not to; watch every way a download could start."""
    import socket

    import torchvision.models._api as api

    attempts: list[object] = []

    def forbidden(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(api, "load_state_dict_from_url", forbidden)
    monkeypatch.setattr(torch.hub, "download_url_to_file", forbidden)
    monkeypatch.setattr(socket.socket, "connect", forbidden)
    assert load_model("deeplabv3_mobilenet_v3_large", weights="none").task == "segmentation"
    assert load_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights="none").task == "detection"
    assert load_model("resnet18", weights="auto").weights_loaded == "random (seed 0)"
    assert attempts == []


def test_devices() -> None:
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(HookscopeError, match="not a device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(HookscopeError, match="CUDA is not available"):
            resolve_device("cuda:1")
    else:
        with pytest.raises(HookscopeError, match="CUDA device"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")


@pytest.mark.parametrize("name", [
    "resnet18", "vgg11", "alexnet", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny",
    pytest.param("resnet50", marks=pytest.mark.slow),
    pytest.param("densenet121", marks=pytest.mark.slow),
    pytest.param("inception_v3", marks=pytest.mark.slow),
    pytest.param("googlenet", marks=pytest.mark.slow),
    pytest.param("shufflenet_v2_x1_0", marks=pytest.mark.slow),
    pytest.param("squeezenet1_1", marks=pytest.mark.slow),
    pytest.param("regnet_y_400mf", marks=pytest.mark.slow),
    pytest.param("mnasnet1_0", marks=pytest.mark.slow),
])
def test_the_memory_estimate_covers_every_call_the_forward_makes(name) -> None:
    """A call's input and output are live together: the estimate must cover the largest
    such pair, from the shape pass (at 96 px, scaled as the estimate is per pixel)."""
    from hookscope.probes.structure import model_structure
    from hookscope.sources import batch_memory

    loaded = load_model(name, weights="none", size=96)
    h, w = loaded.input_size
    found = model_structure(loaded.model, torch.zeros(1, 3, h, w))
    pair = max(4 * sum(torch.Size(s).numel() for s in call.input_shapes) + call.output_bytes
               for layer in found.layers for call in layer.calls)
    assert pair <= batch_memory(loaded, 1)


def test_a_batch_over_the_memory_budget_is_refused_before_it_runs(cli, cat_jpg,
                                                                  monkeypatch) -> None:
    import hookscope.core.run
    import hookscope.sources
    from hookscope.sources import batch_memory, check_batch_memory
    from tests.test_cli_stats import one_error_line

    loaded = load_model("vgg11", weights="none", size=64)
    need = batch_memory(loaded, 2)
    monkeypatch.setattr(hookscope.sources, "available_memory", lambda device: need)
    check_batch_memory(loaded, 2)  # exactly enough
    monkeypatch.setattr(hookscope.sources, "available_memory", lambda device: need - 1)
    with pytest.raises(HookscopeError, match="need about"):
        check_batch_memory(loaded, 2)

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model ran")

    monkeypatch.setattr(hookscope.core.run, "drive", no_run)
    monkeypatch.setattr(hookscope.sources, "available_memory", lambda device: 10 * 2**30)
    line = one_error_line(cli("stats", "vgg11", cat_jpg, "--weights", "none", "--size", "8192",
                              "--batch-size", "1"))
    assert "need about 64.0 GiB" in line and "10.0 GiB available" in line
