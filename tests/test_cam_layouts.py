"""Class activation maps and feature grids of signals (N, C, L) and volumes (N, C, D, H, W):
Grad-CAM by its definition, pytorch-grad-cam's 5-D branch, the files and the refusals."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hookscope
from hookscope.cam.methods import get_method
from hookscope.cam.probe import explain, method_names
from hookscope.core.errors import HookscopeError
from hookscope.numerics.layout import Layout, channel_dim, layout

EPS32 = float(torch.finfo(torch.float32).eps)


def signal_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(2, 6, 5, padding=2), nn.ReLU(), nn.Conv1d(6, 8, 3, stride=2),
                         nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(8, 4)).eval()


def volume_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv3d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv3d(6, 8, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(8, 4)).eval()


class Tokens(nn.Module):
    """A signal model with a token output: a Linear over (N, L, C)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.proj, self.fc = nn.Conv1d(2, 8, 5), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.proj(self.conv(x).transpose(1, 2)).mean(1))


def signal() -> torch.Tensor:
    return torch.randn(2, 2, 40, generator=torch.Generator().manual_seed(1))


def volume() -> torch.Tensor:
    return torch.randn(2, 3, 4, 12, 12, generator=torch.Generator().manual_seed(2))


def by_definition(model: nn.Module, x: torch.Tensor, layer: str) -> tuple[np.ndarray, np.ndarray]:
    """Grad-CAM in float64 from its definition: autograd gradients of each input's top logit
    at the layer's output, channel weights their mean over the positions, the ReLU of the
    weighted sum; then min-max scaled, upsampled (linear in each dimension) and scaled."""
    m = copy.deepcopy(model).double()
    kept = {}
    handle = dict(m.named_modules())[layer].register_forward_hook(
        lambda mod, args, out: kept.update(a=out))
    try:
        logits = m(x.double())
    finally:
        handle.remove()
    a = kept["a"]
    top = logits.argmax(dim=1)
    (g,) = torch.autograd.grad(logits.gather(1, top[:, None]).sum(), a)
    dims = tuple(range(2, a.dim()))
    weights = g.mean(dim=dims, keepdim=True)
    raw = (weights * a).sum(dim=1).clamp(min=0).detach()
    flat = raw.flatten(1)
    scaled = (flat - flat.amin(1, keepdim=True)) / (flat.amax(1, keepdim=True) - flat.amin(
        1, keepdim=True) + 1e-7)
    mode = {1: "linear", 3: "trilinear"}[len(dims)]
    up = F.interpolate(scaled.reshape(raw.shape).unsqueeze(1), size=x.shape[2:], mode=mode)
    up = up.squeeze(1).flatten(1)
    up = (up - up.amin(1, keepdim=True)) / (up.amax(1, keepdim=True) - up.amin(1, keepdim=True)
                                           + 1e-7)
    return raw.numpy(), up.reshape(len(x), *x.shape[2:]).numpy()


def tolerance(model: nn.Module, x: torch.Tensor, layer: str) -> float:
    """float32 rounding of the map's sums, relative to its scale: one eps per summed term
    (channels times positions, for the weight means and the weighted sum) and per layer."""
    with torch.no_grad():
        a = model[: int(layer) + 1](x)
    depth = int(layer) + 1
    return EPS32 * a[0].numel() * depth


@pytest.mark.parametrize("make,data,layer", [(signal_model, signal, "3"),
                                             (volume_model, volume, "3")])
def test_gradcam_by_its_definition(make, data, layer):
    model, x = make(), data()
    before = copy.deepcopy(model.state_dict())
    res = hookscope.gradcam(model, (x,), layer)
    raw, maps = by_definition(model, x, layer)
    tol = tolerance(model, x, layer)
    assert res.raw.shape == raw.shape and res.maps.shape == (len(x), *x.shape[2:])
    scale = np.abs(raw).max()
    np.testing.assert_allclose(res.raw, raw, rtol=0, atol=tol * scale)
    np.testing.assert_allclose(res.maps, maps, rtol=0, atol=tol + 4 * 1e-7)
    assert res.targets == model(x).argmax(1).tolist()
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters()) and not model.training


def test_pytorch_grad_cam_3d_branch():
    """pytorch-grad-cam's GradCAM on 5-D activations (at a layer of the input's size, where
    its spline zoom is the identity) gives the same map after its min-max scaling."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    model, x = volume_model(), volume()
    ours = hookscope.gradcam(model, x, "3", target=[1, 3])
    with GradCAM(model=model, target_layers=[model[3]]) as cam:
        theirs = cam(input_tensor=x, targets=[ClassifierOutputTarget(1), ClassifierOutputTarget(3)])
    assert theirs.shape == ours.maps.shape == (2, 4, 12, 12)
    np.testing.assert_allclose(ours.maps, theirs, rtol=0, atol=tolerance(model, x, "3") + 1e-6)


@pytest.mark.parametrize("make,data", [(signal_model, signal), (volume_model, volume)])
def test_every_method_or_a_reason(make, data):
    model, x = make(), data()[:1]
    for name in method_names():
        if get_method(name).image_only:
            with pytest.raises(HookscopeError, match="the input is|vision transformers"):
                explain(model, (x,), layer="3", methods=(name,))
            continue
        res = explain(model, (x,), layer="3", methods=(name,)).results[name]
        assert res.maps.shape == (len(x), *x.shape[2:]), name
        assert np.isfinite(res.maps).all() and res.maps.min() >= 0 and res.maps.max() <= 1, name
    smooth = explain(model, (x,), layer="3", eigen_smooth=True).results["gradcam"]
    assert smooth.raw.shape == (1, *model[:4](x).shape[2:])


def test_refusals():
    model, x = signal_model(), signal()
    with pytest.raises(HookscopeError, match="the inputs are 0, 1"):
        explain(model, (x, x), layer="3", overlay_input=2)
    with pytest.raises(HookscopeError, match="A CAM is drawn on"):
        explain(model, torch.zeros(2, 40, dtype=torch.long), layer="3")
    with pytest.raises(HookscopeError, match="not .N, C, L. as the input is"):
        explain(model, (x,), layer="6")
    tokens = Tokens().eval()
    with pytest.raises(HookscopeError, match="channels last .Linear output"):
        explain(tokens, (x,), layer="proj")
    assert explain(tokens, (x,), layer="conv").results["gradcam"].maps.shape == (2, 40)
    with pytest.raises(HookscopeError, match="aug_smooth"):
        explain(model, (x,), layer="3", aug_smooth=True)
    assert all(not m._forward_hooks for m in model.modules())


def test_channel_rule():
    assert channel_dim([2, 8, 19], "ReLU", (40,)) == 1  # after a Conv1d: (N, C, L)
    assert channel_dim([2, 19, 8], "Linear", (40,)) == 2
    assert channel_dim([2, 19, 8], "GELU") == 2  # tokens without a signal input
    assert channel_dim([2, 8, 4, 6, 6], "ReLU", (4, 12, 12)) == 1
    assert channel_dim([2, 8, 4, 6, 6], "ReLU") == 1
    found = layout([2, 8, 2, 6, 6], (4, 12, 12), type_name="Conv3d")
    assert isinstance(found, Layout) and found.grid == (2, 6, 6) and found.channel_dim == 1
    assert "not (N, C, L)" in str(layout([2, 8], (40,), type_name="Linear"))


def test_default_layer_on_a_signal(caplog):
    model, x = signal_model(), signal()
    res = hookscope.gradcam(model, (x,))
    assert res.layer == "3" and res.raw.shape == (2, 19)


@pytest.mark.parametrize("make,data", [(signal_model, signal), (volume_model, volume)])
def test_per_channel_stats(make, data):
    """Every output of the input's rank has its channels on dimension 1 (the ReLUs too), and
    each channel's mean and std equal a float64 reference."""
    model, x = make(), data()
    rows = hookscope.collect_stats(model, (x,), per_channel=True).layers
    outs = []
    handles = [m.register_forward_hook(lambda mod, a, out: outs.append(out.detach().double()))
               for m in model]
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    ranked = [(r, o) for r, o in zip(rows, outs, strict=True) if o.dim() == x.dim()]
    assert len(ranked) == 5 and all(r.channel_dim == 1 for r, _ in ranked)  # with the pool
    for row, out in ranked:
        per = out.movedim(1, 0).flatten(1)
        means = np.array([c["mean"] for c in row.to_dict()["channels"]])
        stds = np.array([c["std"] for c in row.to_dict()["channels"]])
        scale = float(per.abs().max())
        np.testing.assert_allclose(means, per.mean(1).numpy(), rtol=0,
                                   atol=EPS32 * per.shape[1] * scale)
        np.testing.assert_allclose(stds, per.std(1).numpy(), rtol=0,
                                   atol=EPS32 * per.shape[1] * scale)


MODELS = '''
import torch
from torch import nn


class Signal(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.act, self.fc = nn.Conv1d(2, 8, 5), nn.ReLU(), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.act(self.conv(x)).mean(-1))


class Clip(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.act = nn.Conv3d(3, 8, 3, padding=1), nn.ReLU()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.act(self.conv(x)).mean((2, 3, 4)))


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv1d(2, 8, 5), nn.Linear(16, 4)

    def forward(self, a, b):
        return self.fc(torch.cat([self.conv(a).mean(-1), self.conv(b).mean(-1)], 1))
'''


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "layout_models.py").write_text(MODELS)
    gen = torch.Generator().manual_seed(3)
    torch.save((torch.randn(3, 2, 64, generator=gen),), tmp_path / "signal.pt")
    torch.save((torch.randn(2, 3, 4, 16, 16, generator=gen),), tmp_path / "clip.pt")
    torch.save((torch.randn(2, 2, 64), torch.randn(2, 2, 64)), tmp_path / "pair.pt")
    return tmp_path


@pytest.mark.parametrize("name,data,raw,size", [("Signal", "signal.pt", (60,), (64,)),
                                                ("Clip", "clip.pt", (4, 16, 16), (4, 16, 16))])
def test_gradcam_command_writes_maps(cli, files, name, data, raw, size):
    from PIL import Image

    out = files / "cams"
    r = cli("gradcam", f"{files}/layout_models.py:{name}", files / data, "--out", out,
            "--save-raw", "-m", "gradcam", "-m", "layercam", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["layer"] == "act" and doc["layer_shape"] == [8, *raw]
    for row in doc["results"]:
        assert np.load(row["raw"]).shape == raw and len(row["peak"]) == len(size)
        assert all(0 <= p < s for p, s in zip(row["peak"], size, strict=True))
        over, heat = Image.open(row["overlay"]), Image.open(row["heatmap"])
        if len(size) == 1:  # the curve over the signal, and its colour band
            assert over.size == (800, 300) and heat.size == (256, 24)
        else:  # 4 frames of 96 x 96 pixels, 2 by 2, 2 pixels apart
            assert over.size == heat.size == (2 * 96 + 3 * 2, 2 * 96 + 3 * 2)
    assert not [p for p in out.iterdir() if p.name.endswith(".part")]


def test_gradcam_command_refusals(cli, files):
    r = cli("gradcam", f"{files}/layout_models.py:Pair", files / "pair.pt", "--out",
            files / "no", "--overlay-input", "2")
    assert r.exit_code == 2 and "the inputs are 0, 1" in r.stderr and "Traceback" not in r.output
    r = cli("gradcam", f"{files}/layout_models.py:Signal", files / "signal.pt", "--out",
            files / "no", "--layer", "fc")
    assert r.exit_code == 2 and "not (N, C, L)" in r.stderr
    assert not (files / "no").exists() or not list((files / "no").iterdir())


@pytest.mark.parametrize("name,data,grid", [("Signal", "signal.pt", (8 * 8, 256)),
                                            ("Clip", "clip.pt", None)])
def test_features_command(cli, files, name, data, grid):
    from PIL import Image

    r = cli("features", f"{files}/layout_models.py:{name}", files / data, "--layer", "act",
            "--out", files / "feats", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    for row in doc["grids"]:
        width, height = Image.open(row["path"]).size
        assert row["grid_size"] == [width, height]
        if grid is not None:  # 8 rows of 8 pixels, each of 60 values widened 5 times
            assert row["shape"] == [8, 60] and (height, width) == (grid[0], 300)
        else:  # 4 frames, each a 3 x 3 grid of 16 x 16 tiles
            assert row["shape"] == [8, 4, 16, 16]
            frame = 3 * 16 + 4 * 2
            assert (width, height) == (2 * frame + 3 * 6, 2 * frame + 3 * 6)


@pytest.mark.slow
def test_r3d_18_by_definition():
    """torchvision's r3d_18 (random weights) on a 1 x 3 x 4 x 32 x 32 clip, its default
    layer (layer4, 2 x 2 x 2... cells) against the definition."""
    from torchvision.models.video import r3d_18

    torch.manual_seed(0)
    model = r3d_18(weights=None).eval()
    x = torch.randn(1, 3, 4, 32, 32, generator=torch.Generator().manual_seed(4))
    res = hookscope.gradcam(model, x)
    raw, maps = by_definition(model, x, res.layer)
    assert res.layer == "layer4" and res.maps.shape == (1, 4, 32, 32)
    tol = EPS32 * 512 * 8 * 18  # channels x positions, through 18 layers
    np.testing.assert_allclose(res.raw, raw, rtol=0, atol=tol * np.abs(raw).max())
    np.testing.assert_allclose(res.maps, maps, rtol=0, atol=tol + 4e-7)


@pytest.mark.parametrize("make,data", [(signal_model, signal), (volume_model, volume)])
def test_feature_grids_hold_the_channels(make, data):
    """A strip's rows (a sheet's tiles) are the layer's channels, each min-max scaled."""
    from hookscope.core.select import find_site
    from hookscope.probes.features import STRIP_ROW, feature_grids

    model, x = make(), data()
    (grid, *_) = feature_grids(model, (x[:1],), [find_site(model, "1")], max_channels=3)
    with torch.no_grad():
        out = model[:2](x[:1])[0, :3].double()
    flat = out.flatten(1)
    scaled = ((flat - flat.amin(1, keepdim=True)) / (flat.amax(1, keepdim=True)
                                                    - flat.amin(1, keepdim=True))).float()
    assert grid.channels == [0, 1, 2] and grid.shape == list(model[:2](x[:1]).shape[1:])
    if x.dim() == 3:  # rows 1, 9, 17 (below each white line), each value widened
        widen = grid.image.shape[2] // x.shape[2]
        rows = grid.image[0, 1::STRIP_ROW][:, ::widen]
        np.testing.assert_allclose(rows.numpy(), scaled.numpy(), atol=4 * EPS32)
    else:  # the first frame's first tile, inside the 2-pixel border of both grids
        h, w = x.shape[3:]
        tile = grid.image[0, 8 : 8 + h, 8 : 8 + w]
        np.testing.assert_allclose(tile.numpy(), scaled[0].reshape(*x.shape[2:])[0].numpy(),
                                   atol=4 * EPS32)
    assert all(not m._forward_hooks for m in model.modules())
