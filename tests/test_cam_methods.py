"""The methods added to the registry, each against pytorch-grad-cam's (or torchcam's) own
implementation on two architectures, at the layer's resolution, within 1e-4 after min-max
normalisation; noise-based methods get the same noise. Also multi-layer fusion,
``aug_smooth``, ``eigen_smooth`` and guided backpropagation against pytorch-grad-cam.

References run on a deep copy of the model where they change it (pytorch-grad-cam's guided
backpropagation swaps modules, its FullGrad writes ``.grad``), with in-place operations
switched off so their hooks see each layer's own output.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import pytorch_grad_cam as pgc  # the test extra installs it
import torch
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from torch import nn

from hookscope.cam.methods import method_names
from hookscope.cam.probe import explain, gradcam
from hookscope.core.classes import parse_targets
from hookscope.core.hooks import hook_count
from tests.test_cam import TOL, InplaceNet, _minmax, _no_inplace, pgc_cam_image

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def nets():
    from torchvision.models import efficientnet_b0, mobilenet_v3_small, resnet18

    torch.manual_seed(0)
    return {
        "resnet18": resnet18(num_classes=10).eval(),
        "mobilenet": mobilenet_v3_small(num_classes=10).eval(),
        "efficientnet": efficientnet_b0(num_classes=10).eval(),
        "inplace": InplaceNet().eval(),
        "gelunet": GeluNet().eval(),
    }


def _clean(model: nn.Module) -> None:
    assert hook_count(model) == 0
    assert all(p.grad is None for p in model.parameters())


def _signed(cam: np.ndarray) -> np.ndarray:
    """A projection's sign made deterministic as hookscope's: |min| > |max| flips it."""
    cam = np.asarray(cam, dtype=np.float64)
    out = []
    for c in cam:
        out.append(-c if abs(c.min()) > abs(c.max()) else c)
    return np.stack(out)


def pgc_full(cls, model, layers, x, targets, **call):
    """pytorch-grad-cam's whole pipeline (fused over ``layers``, upsampled to the input),
    its hooks released and no ``.grad`` left."""
    modules = [dict(model.named_modules())[n] for n in layers]
    with _no_inplace(model):
        cam = cls(model, modules)
        try:
            return cam(x, [ClassifierOutputTarget(t) for t in targets], **call)
        finally:
            cam.activations_and_grads.release()
            model.zero_grad(set_to_none=True)


def pgc_layer(cls, model, layer, x, targets, *, eigen=False, signed=False, **kw):
    """pytorch-grad-cam's ``get_cam_image`` at the layer's resolution, ReLU'd, scaled."""
    module = dict(model.named_modules())[layer]
    with _no_inplace(model):
        tgs = [ClassifierOutputTarget(t) for t in targets]
        ref, _ = pgc_cam_image(cls(model, [module], **kw), module, x, tgs, eigen=eigen)
    return _minmax(_signed(ref) if signed else ref)


def ours(model, layer, x, targets, method, **options):
    r = gradcam(model, x, layer, method=method, target=list(targets), **options)
    _clean(model)
    return r


# (model, layer, side): two architectures per method
GRAD_CASES = [("resnet18", "layer3", 96), ("mobilenet", "features.8", 96)]
SMALL_CASES = [("inplace", "features.3", 16), ("mobilenet", "features.1", 24)]


@pytest.mark.parametrize(("key", "layer", "side"), GRAD_CASES)
@pytest.mark.parametrize(("method", "cls", "signed"), [
    ("gradcamelementwise", "GradCAMElementWise", False),
    ("eigengradcam", "EigenGradCAM", True),
    ("fem", "FEM", False),
])
def test_layer_methods_match_pytorch_grad_cam(nets, key, layer, side, method, cls, signed):
    model = nets[key]
    torch.manual_seed(1)
    x = torch.randn(2, 3, side, side)
    ref = pgc_layer(getattr(pgc, cls), model, layer, x, [1, 3], signed=signed)
    r = ours(model, layer, x, [1, 3], method)
    assert ref.max() > 0
    np.testing.assert_allclose(_minmax(r.raw), ref, atol=TOL, rtol=0)


@pytest.mark.parametrize(("key", "layer", "side"), [
    ("resnet18", "layer3", 96), ("mobilenet", "features.2", 96), ("mobilenet", "features.1", 64)])
def test_kpcacam_matches_pytorch_grad_cam(nets, key, layer, side):
    """pytorch-grad-cam's KPCA_CAM projection (``get_2d_projection_kernel``, scikit-learn's
    KernelPCA) of the activations it captured, fed in float64: in float32, scikit-learn's
    kernel loses ~3 digits on small activations. Compared before the ReLU (scikit-learn's
    eigenvector sign can leave nothing positive), then end to end; 16x16 positions make
    scikit-learn use ARPACK."""
    from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection_kernel

    from hookscope.cam.methods import CamInputs, kpcacam

    model = nets[key]
    torch.manual_seed(1)
    x = torch.randn(2, 3, side, side)
    module = dict(model.named_modules())[layer]
    with _no_inplace(model):
        cam = pgc.KPCA_CAM(model, [module])
        try:
            cam.activations_and_grads(x)
            acts = cam.activations_and_grads.activations[0].numpy()
        finally:
            cam.activations_and_grads.release()
    ref = get_2d_projection_kernel(acts.astype(np.float64), cam.kernel, cam.gamma)
    mine = kpcacam(CamInputs(torch.from_numpy(acts), None, x, [1, 3])).numpy()
    scale = np.abs(ref).max()
    assert scale > 0
    np.testing.assert_allclose(mine / scale, ref / scale, atol=TOL, rtol=0)
    r = ours(model, layer, x, [1, 3], "kpcacam")
    np.testing.assert_allclose(_minmax(r.raw), _minmax(ref), atol=TOL, rtol=0)


@pytest.mark.parametrize(("key", "layer", "side", "batch"), [
    ("inplace", "features.3", 16, 1),  # a conv output, below zero: ablated to min - 1e7
    ("mobilenet", "features.1", 32, 1),
    ("resnet18", "layer2", 32, 32),  # a block's ReLU output: ablated to 0, in batches
])
def test_ablationcam_matches_pytorch_grad_cam(nets, key, layer, side, batch):
    """pytorch-grad-cam lowers its ablation value by 1e7 at every row of a batch; one row
    per batch is the AblationLayer's definition, which hookscope follows at any batch."""
    model = nets[key]
    torch.manual_seed(2)
    x = torch.randn(2, 3, side, side)
    ref = pgc_layer(pgc.AblationCAM, model, layer, x, [1, 3], batch_size=batch)
    r = ours(model, layer, x, [1, 3], "ablationcam", score_batch=5)
    np.testing.assert_allclose(_minmax(r.raw), ref, atol=TOL, rtol=0)


def test_ablationcam_runs_the_layer_once_per_batch_of_channels(nets):
    """The ablated passes start from one copy of the input: 12 channels in chunks of 5."""
    model = nets["inplace"]
    sizes: list[int] = []
    handle = model.features[0].register_forward_pre_hook(
        lambda _m, args: sizes.append(args[0].shape[0]))
    try:
        gradcam(model, torch.randn(2, 3, 16, 16), "features.3", method="ablationcam",
                score_batch=5)
    finally:
        handle.remove()
    assert sizes == [2, 1, 1, 1, 1, 1, 1]


class SkipNet(nn.Module):
    """Concatenates a tensor from before the layer with the layer's output, so ablated
    passes cannot start from one copy of the input."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layer = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(10, 3)

    def forward(self, x):
        s = self.stem(x)
        both = torch.cat([s, self.layer(s)], dim=1).mean(dim=(2, 3))
        return self.head(both)


def test_ablationcam_falls_back_to_copies():
    torch.manual_seed(3)
    model = SkipNet().eval()
    x = torch.randn(2, 3, 8, 8)
    ref = pgc_layer(pgc.AblationCAM, model, "layer", x, [0, 2], batch_size=4)
    r = ours(model, "layer", x, [0, 2], "ablationcam", score_batch=4)
    np.testing.assert_allclose(_minmax(r.raw), ref, atol=TOL, rtol=0)


@pytest.mark.parametrize("key", ["resnet18", "inplace"])
def test_fullgrad_matches_pytorch_grad_cam(nets, key):
    model = nets[key]
    torch.manual_seed(4)
    x = torch.randn(2, 3, 32, 32)
    twin = copy.deepcopy(model)
    ref = pgc.FullGrad(twin, [])(x, [ClassifierOutputTarget(t) for t in (1, 3)])
    r = ours(model, None, x, [1, 3], "fullgrad")
    assert r.raw.shape == (2, 32, 32)
    np.testing.assert_allclose(r.maps, _minmax(ref), atol=TOL, rtol=0)


def _shapley_reference(model, layer, x, targets):
    module = dict(model.named_modules())[layer]
    with _no_inplace(model):
        cam = pgc.ShapleyCAM(model, [module])
        try:
            leaf = x.clone().requires_grad_(True)
            outputs = cam.activations_and_grads(leaf)
            tgs = [ClassifierOutputTarget(t) for t in targets]
            loss = sum(t(o) for t, o in zip(tgs, outputs, strict=True))
            torch.autograd.grad(loss, leaf, retain_graph=True, create_graph=True)
            acts = cam.activations_and_grads.activations[0]
            grads = cam.activations_and_grads.gradients[0]
            ref = cam.get_cam_image(leaf, module, tgs, acts, grads, False)
        finally:
            cam.activations_and_grads.release()
    return _minmax(ref)


class GeluNet(nn.Module):
    """A small CNN with GELU and Tanh: smooth, so second derivatives are not zero."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.GELU(), nn.Conv2d(8, 16, 3, padding=1),
            nn.Tanh(), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1), nn.GELU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 5))

    def forward(self, x):
        return self.head(self.features(x))


@pytest.mark.parametrize(("key", "layer", "side"), [
    ("gelunet", "features.2", 16), ("efficientnet", "features.5", 64)])
def test_shapleycam_matches_pytorch_grad_cam(nets, key, layer, side):
    """GELU, Tanh and SiLU after the layer: the Hessian-vector product is not zero."""
    model = nets[key]
    torch.manual_seed(5)
    x = torch.randn(2, 3, side, side)
    ref = _shapley_reference(model, layer, x, [1, 3])
    r = ours(model, layer, x, [1, 3], "shapleycam")
    grad = ours(model, layer, x, [1, 3], "gradcam")
    np.testing.assert_allclose(_minmax(r.raw), ref, atol=TOL, rtol=0)
    if key == "gelunet":  # random-init EfficientNet's activations are ~1e-14: H A vanishes
        assert np.abs(_minmax(r.raw) - _minmax(grad.raw)).max() > 1e-3  # not just Grad-CAM


def test_shapleycam_without_second_derivatives_says_why(nets):
    """MobileNetV3's Hardsigmoid has no double backward in PyTorch."""
    from hookscope.core.errors import HookscopeError

    with pytest.raises(HookscopeError, match="second derivatives"):
        gradcam(nets["mobilenet"], torch.randn(1, 3, 32, 32), "features.2", method="shapleycam")
    _clean(nets["mobilenet"])


@pytest.mark.parametrize(("key", "layer", "side"), GRAD_CASES)
@pytest.mark.parametrize("target", [1, 3])
def test_finercam_matches_pytorch_grad_cam(nets, key, layer, side, target):
    """At the input's resolution: pytorch-grad-cam's FinerCAM chooses the comparison
    classes inside its forward."""
    model = nets[key]
    torch.manual_seed(6)
    x = torch.randn(2, 3, side, side)
    module = dict(model.named_modules())[layer]
    with _no_inplace(model):
        finer = pgc.FinerCAM(model, [module])
        try:
            ref = finer(x, target_idx=target)
        finally:
            finer.base_cam.activations_and_grads.release()
            model.zero_grad(set_to_none=True)
    r = ours(model, layer, x, [target, target], "finercam")
    np.testing.assert_allclose(r.maps, _minmax(ref), atol=TOL, rtol=0)


# ----------------------------------------------------------------------------- torchcam


class SameNoise:
    """Stands in for torchcam's ``Normal(0, std)``: the same draws as hookscope's seeded
    generator (``randn`` in the same order, times ``std``)."""

    def __init__(self, std: float, seed: int) -> None:
        self.std, self.gen = std, torch.Generator().manual_seed(seed)

    def sample(self, size):
        return torch.randn(tuple(size), generator=self.gen) * self.std


def torchcam_layer(name, model, layer, x, targets, std=None, seed=0):
    from torchcam import methods

    with _no_inplace(model), getattr(methods, name)(model, target_layer=layer) as extractor:
        if std is not None:
            extractor._distrib = SameNoise(std, seed)
        out = model(x)
        cams = extractor(class_idx=list(targets), scores=out)
    model.zero_grad(set_to_none=True)
    return _minmax(cams[0].detach().numpy())


@pytest.mark.parametrize(("key", "layer", "side"), SMALL_CASES)
@pytest.mark.parametrize(("method", "name", "std"), [
    ("sscam", "SSCAM", 2.0), ("iscam", "ISCAM", None), ("smoothgradcam++", "SmoothGradCAMpp", 0.3)])
def test_torchcam_methods_with_the_same_noise(nets, key, layer, side, method, name, std):
    model = nets[key]
    torch.manual_seed(7)
    x = torch.randn(2 if key == "inplace" else 1, 3, side, side)
    targets = [1, 3][: len(x)]
    ref = torchcam_layer(name, model, layer, x, targets, std=std, seed=11)
    r = ours(model, layer, x, targets, method, seed=11, score_batch=64)
    assert ref.max() > 0
    np.testing.assert_allclose(_minmax(r.raw), ref, atol=TOL, rtol=0)


def test_noise_is_seeded(nets):
    model, x = nets["inplace"], torch.randn(1, 3, 16, 16)
    a = ours(model, "features.3", x, [2], "smoothgradcam++", seed=1).raw
    b = ours(model, "features.3", x, [2], "smoothgradcam++", seed=1).raw
    c = ours(model, "features.3", x, [2], "smoothgradcam++", seed=2).raw
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 0


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(("key", "layers", "side"), [
    ("resnet18", ["layer2", "layer3"], 64), ("mobilenet", ["features.4", "features.8"], 96)])
@pytest.mark.parametrize("method", ["gradcam", "layercam"])
def test_multi_layer_fusion_matches_pytorch_grad_cam(nets, key, layers, side, method):
    model = nets[key]
    torch.manual_seed(8)
    x = torch.randn(2, 3, side, side)
    cls = {"gradcam": pgc.GradCAM, "layercam": pgc.LayerCAM}[method]
    ref = pgc_full(cls, model, layers, x, (1, 3))
    r = ours(model, layers, x, [1, 3], method)
    assert r.layers == layers and [a.shape for a in r.raws] != []
    np.testing.assert_allclose(r.maps, _minmax(ref), atol=TOL, rtol=0)


@pytest.mark.parametrize(("key", "layers", "side"), [
    ("resnet18", ["layer3"], 48), ("mobilenet", ["features.4", "features.8"], 64)])
@pytest.mark.parametrize("method", ["gradcam", "gradcam++"])
def test_aug_smooth_matches_pytorch_grad_cam(nets, key, layers, side, method):
    model = nets[key]
    torch.manual_seed(9)
    x = torch.randn(2, 3, side, side)
    cls = {"gradcam": pgc.GradCAM, "gradcam++": pgc.GradCAMPlusPlus}[method]
    ref = pgc_full(cls, model, layers, x, (1, 3), aug_smooth=True)
    r = ours(model, layers, x, [1, 3], method, aug_smooth=True)
    np.testing.assert_allclose(r.maps, _minmax(ref), atol=TOL, rtol=0)


@pytest.mark.parametrize(("key", "layer", "side"), [("resnet18", "layer3", 64),
                                               ("mobilenet", "features.8", 64)])
@pytest.mark.parametrize(("method", "cls"), [
    ("gradcam", "GradCAM"), ("layercam", "LayerCAM"), ("gradcamelementwise", "GradCAMElementWise")])
def test_eigen_smooth_matches_pytorch_grad_cam(nets, key, layer, side, method, cls):
    model = nets[key]
    torch.manual_seed(10)
    x = torch.randn(2, 3, side, side)
    ref = pgc_layer(getattr(pgc, cls), model, layer, x, [1, 3], eigen=True, signed=True)
    r = ours(model, layer, x, [1, 3], method, eigen_smooth=True)
    np.testing.assert_allclose(_minmax(r.raw), ref, atol=TOL, rtol=0)


def _relus(model):
    return [(name, type(m), getattr(m, "inplace", None)) for name, m in model.named_modules()]


@pytest.mark.parametrize(("key", "layer"), [("resnet18", "layer3"), ("inplace", "features.3")])
def test_guided_backprop_matches_pytorch_grad_cam(nets, key, layer):
    model = nets[key]
    torch.manual_seed(12)
    x = torch.randn(2, 3, 32, 32)
    before = _relus(model)
    r = ours(model, layer, x, [1, 3], "gradcam", guided=True)
    assert _relus(model) == before  # no module swapped, in-place flags kept
    assert r.guided is not None and r.guided.shape == (2, 32, 32, 3)
    twin = copy.deepcopy(model)
    for i, t in enumerate((1, 3)):
        gb = pgc.GuidedBackpropReLUModel(twin, device="cpu")(x[i : i + 1], target_category=t)
        ref = r.maps[i][..., None] * gb
        scale = np.abs(ref).max()
        assert scale > 0
        np.testing.assert_allclose(r.guided[i] / scale, ref / scale, atol=TOL, rtol=0)


def test_help_counts_and_registry():
    assert len(method_names()) >= 18
    for name in ("gradcamelementwise", "eigengradcam", "ablationcam", "fullgrad", "kpcacam",
                 "shapleycam", "finercam", "fem", "sscam", "iscam", "smoothgradcam++"):
        assert name in method_names()


def test_explain_several_methods_and_layers_at_once(nets):
    model = nets["resnet18"]
    x = torch.randn(2, 3, 32, 32)
    methods = ["gradcam", "shapleycam", "finercam", "fullgrad", "ablationcam"]
    report = explain(model, x, layer=["layer2", "layer3"], methods=methods,
                     targets=parse_targets("1,3", None), score_batch=128)
    assert report.layers == ["layer2", "layer3"]
    assert report.layer_shapes == [[128, 4, 4], [256, 2, 2]]
    for name in methods:
        res = report.results[name]
        assert res.maps.shape == (2, 32, 32) and len(res.raws) == 2
    single = gradcam(model, x, ["layer2", "layer3"], method="finercam", target=[1, 3])
    np.testing.assert_allclose(report.results["finercam"].maps, single.maps, atol=1e-6)
    _clean(model)


def test_scorecam_scores_dead_channels_once(nets):
    """resnet18's layer2 output is a ReLU's: channels that are zero everywhere mask the input
    to zero; they are scored with one pass of zero inputs and match pytorch-grad-cam."""
    model = nets["resnet18"]
    torch.manual_seed(13)
    x = torch.randn(2, 3, 16, 16)  # layer2 is 2x2 here: many channels are all zero
    acts = {}
    handle = model.layer2.register_forward_hook(lambda _m, _i, out: acts.update(a=out))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    sizes: list[int] = []
    pre = model.register_forward_pre_hook(lambda _m, args: sizes.append(args[0].shape[0]))
    try:
        r = gradcam(model, x, "layer2", method="scorecam", target=[1, 3], score_batch=64)
    finally:
        pre.remove()
    flat = acts["a"].flatten(2)
    dead = int((flat.amax(2) == flat.amin(2)).sum())
    assert dead > 10
    assert sum(sizes) == 2 + 2 + 2 * 128 - dead  # the batch, the zero inputs, live channels
    ref = pgc_layer(pgc.ScoreCAM, model, "layer2", x, [1, 3])
    np.testing.assert_allclose(_minmax(r.raw), ref, atol=TOL, rtol=0)
