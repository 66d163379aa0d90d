"""CAM methods against independent references, localisation, and model hygiene.

References come from pytorch-grad-cam (a test-only dependency), run on the same model with
every in-place operation switched off, so its forward hook sees the layer's own output and
its gradient: that is the full-graph autograd definition the fast path must reproduce.
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager

import numpy as np
import pytest
import pytorch_grad_cam as pgc  # the test extra installs it
import torch
import torchvision
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from pytorch_grad_cam.utils.svd_on_activations import (
    get_2d_projection_with_sign_correction,
)
from torch import nn

import hookscope
from hookscope.cam.methods import METHODS, method_names, register
from hookscope.cam.probe import default_layer, explain
from hookscope.cam.result import peak_in_box
from hookscope.cam.targets import crop_box
from hookscope.core.classes import parse_targets
from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count

REFERENCE = {
    "gradcam": pgc.GradCAM,
    "gradcam++": pgc.GradCAMPlusPlus,
    "xgradcam": pgc.XGradCAM,
    "layercam": pgc.LayerCAM,
    "hirescam": pgc.HiResCAM,
    "eigencam": pgc.EigenCAM,
    "scorecam": pgc.ScoreCAM,
}
TOL = 1e-4


# One intra-op thread: on a shared 2-core machine, two spinning threads run 10x slower.
pytestmark = pytest.mark.usefixtures("one_thread")


def _minmax(cam: np.ndarray) -> np.ndarray:
    cam = np.maximum(np.asarray(cam, dtype=np.float64), 0)
    flat = cam.reshape(len(cam), -1)
    lo = flat.min(1)[:, None, None]
    span = (flat.max(1) - flat.min(1))[:, None, None]
    return np.where(span > 0, (cam - lo) / np.where(span > 0, span, 1), 0)


@contextmanager
def _no_inplace(model: nn.Module):
    changed = [m for m in model.modules() if getattr(m, "inplace", False) is True]
    for m in changed:
        m.inplace = False
    try:
        yield
    finally:
        for m in changed:
            m.inplace = True


def _vit_reshape(t: torch.Tensor) -> torch.Tensor:
    t = t[:, 1:]
    side = math.isqrt(t.shape[1])
    return t.reshape(t.shape[0], side, side, t.shape[2]).permute(0, 3, 1, 2)


def pgc_cam_image(cam, module, x, targets, *, eigen: bool = False, project=None):
    """pytorch-grad-cam's own map for its ``cam`` object: its hooked forward over ``x``, a
    backward of the ``targets`` (its target objects) when the method uses gradients, then
    ``get_cam_image`` (or ``project`` of the activations). Returns the map and the outputs;
    the hooks are released and no ``.grad`` is left."""
    try:
        outputs = cam.activations_and_grads(x)
        grads = None
        if cam.uses_gradients:
            cam.model.zero_grad(set_to_none=True)
            sum(t(o) for t, o in zip(targets, outputs, strict=True)).backward()
            grads = cam.activations_and_grads.gradients[0].numpy()
        acts = cam.activations_and_grads.activations[0].numpy()
        if project is not None:
            return project(acts), outputs
        return cam.get_cam_image(x, module, targets, acts, grads, eigen), outputs
    finally:
        cam.activations_and_grads.release()
        cam.model.zero_grad(set_to_none=True)


def reference(model, layer: str, x, targets, method, reshape=None) -> np.ndarray:
    """pytorch-grad-cam's map at the layer's resolution, ReLU'd and min-max normalised."""
    module = dict(model.named_modules())[layer]
    with _no_inplace(model):
        cam = REFERENCE[method](model, [module], reshape_transform=reshape)
        tgs = [ClassifierOutputTarget(t) for t in targets]
        # EigenCAM: the sign-corrected projection.
        project = get_2d_projection_with_sign_correction if method == "eigencam" else None
        ref, _ = pgc_cam_image(cam, module, x, tgs, project=project)
    return _minmax(ref)


# ----------------------------------------------------------------------------- models


class InplaceNet(nn.Module):
    """A small CNN whose target conv is followed by ReLU(inplace=True), like VGG."""

    def __init__(self, classes: int = 6) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 12, 3, padding=1), nn.ReLU(inplace=True),
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(48, classes))

    def forward(self, x):
        return self.head(self.features(x))


def _tiny_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                            hidden_dim=16, mlp_dim=32, num_classes=7).eval()
    nn.init.normal_(vit.heads.head.weight, std=0.5)  # torchvision zero-initialises the head
    return vit


def _tiny_swin():
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return SwinTransformer(patch_size=[4, 4], embed_dim=8, depths=[1, 1], num_heads=[1, 1],
                           window_size=[2, 2], num_classes=5).eval()


@pytest.fixture(scope="module")
def models():
    from torchvision.models import mobilenet_v3_small, resnet18

    torch.manual_seed(0)
    built = {
        "resnet18": resnet18(num_classes=10).eval(),
        "mobilenet_v3_small": mobilenet_v3_small(num_classes=10).eval(),
        "inplace": InplaceNet().eval(),
        "vit": _tiny_vit(),
        "swin": _tiny_swin(),
    }
    return built


class SmallVGG(nn.Module):
    """torchvision's VGG-11 feature stack (conv, ReLU(inplace=True), ...) with a small head;
    the real 4096-wide classifier only costs start-up time here."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models.vgg import cfgs, make_layers

        self.features = make_layers(cfgs["A"])
        self.avgpool = nn.AdaptiveAvgPool2d((2, 2))
        self.classifier = nn.Linear(512 * 4, 10)

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


@pytest.fixture(scope="module")
def vgg():
    torch.manual_seed(0)
    return SmallVGG().eval()


# (model key, layer, input side, methods)
CASES = [
    ("resnet18", "layer3", 96, ["gradcam", "gradcam++", "xgradcam", "layercam", "hirescam",
                                "eigencam"]),
    ("resnet18", "layer4.1.conv1", 96, ["gradcam", "gradcam++", "hirescam"]),
    ("mobilenet_v3_small", "features.8", 96, ["gradcam", "gradcam++", "xgradcam", "layercam",
                                              "hirescam", "eigencam"]),
    ("inplace", "features.3", 16, list(REFERENCE)),
    ("vit", "encoder.layers.encoder_layer_0.mlp", 32, list(REFERENCE)),
    # torchvision Swin stages are channels-last (N, H, W, C): laid out automatically
    ("swin", "features.1", 32, ["gradcam", "gradcam++", "layercam", "hirescam", "eigencam"]),
    # A block output feeds the next block's LayerNorm, which is scale-invariant, so
    # sum_c G*A (HiResCAM) cancels to rounding noise there: leave it out of this case.
    ("vit", "encoder.layers.encoder_layer_0", 32, [m for m in list(REFERENCE)
                                                   if m != "hirescam"]),
]


@pytest.mark.parametrize(("key", "layer", "side", "methods"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_methods_match_reference(models, key, layer, side, methods):
    model = models[key]
    torch.manual_seed(1)
    x = torch.randn(2, 3, side, side)
    targets = [1, 3]
    reshape = {"vit": _vit_reshape, "swin": lambda t: t.permute(0, 3, 1, 2)}.get(key)
    results = explain(model, x, layer=layer, methods=methods, targets=parse_targets("1,3", None),
                      score_batch=5).results
    for method in methods:
        ref = reference(model, layer, x, targets, method, reshape)
        ours = _minmax(results[method].raw)
        assert ours.shape == ref.shape, method
        assert ref.max() > 0, f"{method}: degenerate reference"
        np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0, err_msg=method)
        assert results[method].targets == targets
    assert hook_count(model) == 0
    assert all(p.grad is None for p in model.parameters())


def test_vgg_layer_followed_by_inplace_relu(vgg):
    """features.18 is a conv whose output ReLU(inplace=True) overwrites: use the conv's own."""
    torch.manual_seed(2)
    x = torch.randn(2, 3, 64, 64)
    methods = ["gradcam", "layercam", "hirescam"]
    results = explain(vgg, x, layer="features.18", methods=methods,
                      targets=parse_targets("5", None)).results
    for method in methods:
        ref = reference(vgg, "features.18", x, [5, 5], method)
        np.testing.assert_allclose(_minmax(results[method].raw), ref, atol=TOL, rtol=0,
                                   err_msg=method)
    # The conv output has negative values; the post-ReLU tensor would not, so the
    # pre-in-place snapshot is what HiResCAM's signed sum must see.
    assert hook_count(vgg) == 0


def test_gradcam_matches_full_graph_autograd(models):
    """A reference written here from scratch: retain_grad on a non-inplace full graph."""
    model = models["inplace"]
    torch.manual_seed(3)
    x = torch.randn(3, 3, 16, 16)
    store = {}

    def keep(_m, _i, out):
        out.retain_grad()
        store["a"] = out

    with _no_inplace(model):
        handle = model.features[3].register_forward_hook(keep)
        try:
            logits = model(x)
            logits[torch.arange(3), torch.tensor([0, 2, 4])].sum().backward()
        finally:
            handle.remove()
            model.zero_grad(set_to_none=True)
    a, g = store["a"].detach(), store["a"].grad
    ref = torch.relu((g.mean(dim=(2, 3), keepdim=True) * a).sum(1)).numpy()
    ours = hookscope.gradcam(model, x, "features.3", target=[0, 2, 4])
    np.testing.assert_allclose(_minmax(ours.raw), _minmax(ref), atol=TOL, rtol=0)
    np.testing.assert_allclose(ours.raw, ref, rtol=1e-4, atol=1e-6)  # raw is ReLU'd, unscaled


def test_scorecam_runs_masked_inputs_batched(models):
    model = models["inplace"]
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(lambda _m, args: sizes.append(args[0].shape[0]))
    try:
        hookscope.gradcam(model, torch.randn(2, 3, 16, 16), "features.3", method="scorecam",
                          score_batch=5)
    finally:
        handle.remove()
    # one forward for the batch, then 12 channels per image in chunks of 5, 5, 2
    assert sizes == [2, 5, 5, 2, 5, 5, 2]


def test_eigencam_is_sign_independent(models):
    """The SVD's sign is arbitrary; the corrected map must not depend on it. Negating the
    activations flips that sign (an uncorrected projection comes out negated), so the maps
    of A and -A must be equal, and equal to a numpy principal component oriented the same way."""
    from hookscope.cam.methods import CamInputs, eigencam

    torch.manual_seed(4)
    acts = torch.randn(2, 6, 4, 4) + torch.linspace(0, 3, 16).reshape(1, 1, 4, 4)
    x = torch.randn(2, 3, 16, 16)
    p1 = eigencam(CamInputs(acts, None, x, [0, 0]))
    p2 = eigencam(CamInputs(-acts, None, x, [0, 0]))
    torch.testing.assert_close(p1, p2, rtol=1e-5, atol=1e-6)
    for n in range(2):
        flat = acts[n].double().reshape(6, 16).T.numpy()
        centred = flat - flat.mean(axis=0)
        proj = centred @ np.linalg.svd(centred, full_matrices=False)[2][0]
        proj = -proj if abs(proj.min()) > abs(proj.max()) else proj
        np.testing.assert_allclose(p1[n].reshape(-1).numpy(), proj, rtol=1e-5, atol=1e-6)
    raw = explain(models["resnet18"], torch.randn(1, 3, 64, 64), layer="layer3",
                  methods=["eigencam"]).results["eigencam"].raw
    assert raw.shape == (1, 4, 4) and raw.max() > 0


# ----------------------------------------------------------------------------- API


def test_api_result_shapes_and_ranges(models):
    model = models["resnet18"]
    x = torch.randn(3, 3, 64, 80)
    r = hookscope.gradcam(model, x, "layer3", target=2)
    assert r.maps.shape == (3, 64, 80) and r.maps.dtype == np.float32
    assert r.raw.shape == (3, 4, 5)
    assert r.maps.min() >= 0 and r.maps.max() <= 1
    assert r.targets == [2, 2, 2]
    with torch.no_grad():
        logits = model(x)
    np.testing.assert_allclose(r.scores, logits[:, 2].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r.probs, logits.softmax(1)[:, 2].numpy(), rtol=1e-5, atol=1e-6)
    top = hookscope.gradcam(model, x, model.layer3)  # a module works as the layer too
    assert top.targets == logits.argmax(1).tolist()


def test_batches_stream_like_one_batch(models):
    model = models["resnet18"]
    x = torch.randn(4, 3, 64, 64)
    whole = hookscope.gradcam(model, x, "layer3", method="gradcam++", target="3,1,4,1")
    parts = hookscope.gradcam(model, [x[:1], x[1:3], x[3:]], "layer3", method="gradcam++",
                              target=[3, 1, 4, 1])
    assert parts.targets == [3, 1, 4, 1]
    np.testing.assert_allclose(parts.maps, whole.maps, atol=1e-5)


def test_default_layer(models, vgg):
    assert default_layer(models["resnet18"], torch.randn(1, 3, 64, 64))[0] == "layer4"
    # VGG's AdaptiveAvgPool2d((7, 7)) is still spatial, and the last such module
    assert default_layer(vgg, torch.randn(1, 3, 64, 64))[0] == "avgpool"
    head = nn.Sequential(nn.Conv2d(3, 4, 8), nn.Flatten(), nn.Linear(4, 2))  # 1x1 conv output
    with pytest.raises(HookscopeError, match="no module with a spatial"):
        default_layer(head, torch.randn(1, 3, 8, 8))


class OneCell(nn.Module):
    """A 1x1 grid repeated to 4x4 (as AlexNet's avgpool does on a small input)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.up = nn.Upsample(size=4)
        self.fc = nn.Linear(6 * 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.up(self.pool(self.relu(self.conv(x)))).flatten(1))


def test_a_map_repeated_from_one_cell_is_not_the_default_layer() -> None:
    torch.manual_seed(0)
    assert default_layer(OneCell().eval(), torch.randn(1, 3, 8, 8))[0] == "relu"
    alexnet = torchvision.models.alexnet(weights=None).eval()
    # At 64 px AlexNet's features end 1x1 (15, 7, 3, 3, 3, 1): avgpool repeats that one
    # cell to 6x6, so the last grid of its own is features.11, the ReLU after conv5 (3x3).
    layer, shape = default_layer(alexnet, torch.randn(1, 3, 64, 64))
    assert (layer, shape[2:]) == ("features.11", [3, 3])


def test_a_constant_map_is_blank_and_flagged_not_stretched(caplog) -> None:
    torch.manual_seed(0)
    model = OneCell().eval()
    x = torch.randn(2, 3, 8, 8)
    flat = explain(model, x, layer="up", methods=["gradcam"]).results["gradcam"]
    # Its raw map is one value per input repeated: any range it has is rounding.
    raw = flat.raw.astype(np.float64)
    assert np.all(raw.max((1, 2)) - raw.min((1, 2)) <= 1e-5 * np.abs(raw).max((1, 2)))
    assert flat.constant == [True, True]
    assert not flat.maps.any()  # drawn blank
    assert any("constant" in note for note in flat.notes)
    grid = explain(model, x, layer="relu", methods=["gradcam"]).results["gradcam"]
    assert grid.constant == [False, False] and grid.maps.max() == 1
    assert not any("constant" in note for note in grid.notes)


def test_vit_tokens_reshaped_automatically(models):
    model = models["vit"]
    r = hookscope.gradcam(model, torch.randn(2, 3, 32, 32), "encoder.layers.encoder_layer_0")
    assert r.raw.shape == (2, 4, 4) and r.maps.shape == (2, 32, 32)


def test_target_count_mismatch_is_an_error(models):
    with pytest.raises(HookscopeError, match="3 targets for 2 input"):
        hookscope.gradcam(models["inplace"], torch.randn(2, 3, 16, 16), "features.3",
                          target=[0, 1, 2])
    with pytest.raises(HookscopeError, match="2 targets for 3 input"):
        hookscope.gradcam(models["inplace"], [torch.randn(2, 3, 16, 16), torch.randn(1, 3, 16, 16)],
                          "features.3", target="0,1")


@pytest.mark.parametrize(("layer", "why"), [
    ("head.2", "no spatial dimensions"),
    ("head.0", "spatial size is 2x2"),  # still spatial: allowed
])
def test_non_spatial_layer(models, layer, why):
    model = models["inplace"]
    x = torch.randn(1, 3, 16, 16)
    if layer == "head.0":
        assert hookscope.gradcam(model, x, layer).raw.shape == (1, 2, 2)
        return
    with pytest.raises(HookscopeError, match=why) as info:
        hookscope.gradcam(model, x, layer)
    assert "cannot give a class activation map" in str(info.value)
    assert hook_count(model) == 0


def test_one_by_one_layer_says_why(models):
    with pytest.raises(HookscopeError, match="spatial size is 1x1"):
        hookscope.gradcam(models["resnet18"], torch.randn(1, 3, 64, 64), "avgpool")


def test_unknown_layer_and_method(models):
    with pytest.raises(HookscopeError, match=r"no module named 'layer5'.*hookscope layers"):
        hookscope.gradcam(models["resnet18"], torch.randn(1, 3, 64, 64), "layer5")
    with pytest.raises(HookscopeError, match="Did you mean: gradcam"):
        hookscope.gradcam(models["resnet18"], torch.randn(1, 3, 64, 64), "layer4",
                          method="gradcm")


def test_registry_rejects_duplicates():
    assert method_names()[:7] == ["gradcam", "gradcam++", "xgradcam", "layercam", "hirescam",
                                  "eigencam", "scorecam"]
    with pytest.raises(ValueError, match="already registered"):
        register("gradcam")(lambda inp: inp.acts.sum(1))
    assert METHODS["gradcam"].gradients and not METHODS["eigencam"].gradients


# ----------------------------------------------------------------------------- hygiene


def _snapshot(model):
    return ([m.training for m in model.modules()], [p.requires_grad for p in model.parameters()])


def test_model_left_as_found(models):
    model = models["resnet18"]
    model.train()
    model.layer2.eval()  # mixed flags must come back exactly
    before = _snapshot(model)
    grad_mode = torch.is_grad_enabled()
    for method in ("gradcam", "eigencam"):
        hookscope.gradcam(model, torch.randn(2, 3, 64, 64), "layer3", method=method)
    assert _snapshot(model) == before
    assert torch.is_grad_enabled() == grad_mode
    assert hook_count(model) == 0
    assert all(p.grad is None for p in model.parameters())
    model.eval()


def test_nothing_left_after_an_exception_mid_forward():
    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True), Boom(), nn.Flatten())
    before = _snapshot(model)
    with torch.no_grad():
        with pytest.raises(HookscopeError, match="boom"):
            hookscope.gradcam(model, torch.randn(1, 3, 8, 8), "0")
        assert not torch.is_grad_enabled()  # the hook's grad switch did not leak out
    assert torch.is_grad_enabled()
    assert hook_count(model) == 0
    assert _snapshot(model) == before
    assert all(p.grad is None for p in model.parameters())


def test_works_inside_inference_mode(models):
    with torch.inference_mode():
        r = hookscope.gradcam(models["inplace"], torch.randn(1, 3, 16, 16), "features.3")
    assert r.raw.shape == (1, 8, 8)


# ----------------------------------------------------------------------------- localisation


def _shapes_dataset(n: int, rng: np.random.Generator, side: int = 32):
    """Noise images holding one bright square (class 0), one plus sign (class 1), or no
    shape (class 2), at a random place; masks mark the shape's pixels."""
    x = rng.normal(0.0, 0.15, size=(n, 1, side, side)).astype(np.float32)
    y = rng.integers(0, 3, size=n)
    masks = np.zeros((n, side, side), dtype=bool)
    for i in range(n):
        if y[i] == 2:
            continue
        top, left = rng.integers(1, side - 9, size=2)
        m = np.zeros((9, 9), dtype=bool)
        if y[i] == 0:
            m[1:8, 1:8] = True
        else:
            m[3:6, :] = True
            m[:, 3:6] = True
        masks[i, top:top + 9, left:left + 9] = m
        x[i, 0][masks[i]] += 1.0
    return torch.from_numpy(x), torch.from_numpy(y), masks


@functools.cache
def shapes_model() -> nn.Module:
    """A tiny CNN trained for a few seconds on synthetic shapes (square, plus, none), once per
    session; its layer "5" is the last convolution, followed by an in-place ReLU."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 3),
    )
    x, y, _ = _shapes_dataset(1536, np.random.default_rng(0))
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _epoch in range(2):
        for i in range(0, len(x), 64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
    model.eval()
    model.zero_grad(set_to_none=True)
    return model


def test_gradcam_localises_the_deciding_shape():
    """Catches sign and weighting errors an equivalence test can share with the reference."""
    model = shapes_model()
    xt, yt, masks = _shapes_dataset(300, np.random.default_rng(1))
    with torch.no_grad():
        pred = model(xt).argmax(1)
    presence = ((pred == 2) == (yt == 2)).float().mean().item()
    assert presence > 0.9, f"the tiny CNN did not learn where shapes are ({presence:.0%})"
    keep = yt != 2  # held-out images that hold a shape
    xt, yt, masks = xt[keep], yt[keep], masks[keep.numpy()]
    # layer "5" is the last conv, followed by ReLU(inplace=True)
    for method in ("gradcam", "gradcam++", "layercam"):
        r = hookscope.gradcam(model, xt, "5", method=method, target=yt.tolist())
        hits = [masks[i][peak] for i, peak in enumerate(r.peaks)]
        assert np.mean(hits) >= 0.9, f"{method}: peak inside the shape on {np.mean(hits):.0%}"


# ----------------------------------------------------------------------------- geometry


def test_crop_box_matches_resize_and_centre_crop():
    from torchvision.transforms._presets import ImageClassification

    t = ImageClassification(crop_size=224, resize_size=256)
    # 451x300: the short side 300 -> 256, so 384x256; the 224 crop starts at (80, 16).
    left, top, right, bottom = crop_box(t, (451, 300))
    assert left == pytest.approx(80 * 451 / 384) and top == pytest.approx(16 * 300 / 256)
    assert right - left == pytest.approx(224 * 451 / 384)
    assert bottom - top == pytest.approx(224 * 300 / 256)
    assert crop_box(object(), (50, 40)) == (0, 0, 50, 40)
    assert peak_in_box((0, 0), (224, 224), (10.0, 20.0, 234.0, 244.0)) == (20, 10)


def test_module_called_twice_is_explained_at_its_last_call(tiny_net):
    """conftest's TinyNet runs one ReLU module twice; the map is the second call's."""
    x = torch.randn(2, 3, 12, 12)
    calls = []

    def keep(_m, _i, out):
        out.retain_grad()
        calls.append(out)

    with _no_inplace(tiny_net):
        handle = tiny_net.relu.register_forward_hook(keep)
        try:
            tiny_net(x)[:, 1].sum().backward()
        finally:
            handle.remove()
            tiny_net.zero_grad(set_to_none=True)
    a, g = calls[-1].detach(), calls[-1].grad
    ref = torch.relu((g.mean(dim=(2, 3), keepdim=True) * a).sum(1)).numpy()
    ours = hookscope.gradcam(tiny_net, x, "relu", target=1)
    np.testing.assert_allclose(_minmax(ours.raw), _minmax(ref), atol=TOL, rtol=0)
    assert hook_count(tiny_net) == 0


def test_api_default_layer_is_logged(models):
    import logging

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("hookscope")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        r = hookscope.gradcam(models["resnet18"], torch.randn(1, 3, 64, 64))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert r.layer == "layer4" and r.raw.shape == (1, 2, 2)
    assert any("using layer layer4" in m for m in records)
