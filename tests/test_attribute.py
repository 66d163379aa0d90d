"""``hookscope attribute`` and :func:`hookscope.attribute` against captum 0.9 and autograd.

Tolerance: hookscope and captum run the same float32 operations on the same values; they
differ only in the order of the sums (the batch a convolution sees, the order of the steps
of integrated gradients, the windows of occlusion). A float32 sum of n terms moves by about
sqrt(n) eps of the sum of their magnitudes (at most n eps): with eps = 1.2e-7 and the longest
reductions here (4608 terms in resnet18's last convolutions, 50 steps) that is ~1e-5 per
layer at the worst, well under the 1e-4 of the largest |value| asked, while a wrong rule (a
missing ReLU mask, captum's adjacent-module quirk below) moves the values by 10% or more.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hookscope.cam.attribution import AttributionProbe, AttrResult, attr_options, attribute
from hookscope.cam.attrmethods import ATTRIBUTIONS, attribution_names, register
from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count
from hookscope.core.run import drive

captum = pytest.importorskip("captum.attr")
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
TOL = 1e-4
FAST = ("--weights", "none", "--size", "64")


class SmallCNN(nn.Module):
    """Conv, in-place ReLU, max pooling, tanh: no two supported nonlinearities adjacent."""

    def __init__(self, shared: bool = False) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1)
        self.c3, self.c4 = nn.Conv2d(6, 6, 3, padding=1), nn.Conv2d(6, 4, 3, padding=1)
        self.r1 = nn.ReLU(inplace=True)
        self.r2 = self.r1 if shared else nn.ReLU(inplace=True)
        self.pool, self.tanh, self.fc = nn.MaxPool2d(2), nn.Tanh(), nn.Linear(4 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.c2(self.r1(self.c1(x))))
        x = self.tanh(self.c4(self.r2(self.c3(x))))  # r2 is r1 when shared: two calls
        return self.fc(x.flatten(1))


class TinyViT(nn.Module):
    """Patch embedding, one attention block (nn.Softmax), GELU MLP, class token head."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.1)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(len(t), -1, -1), t], dim=1)
        q, k, v = self.qkv(self.norm1(t)).chunk(3, dim=-1)
        t = t + self.proj(self.softmax(q @ k.transpose(1, 2) / 4.0) @ v)
        t = t + self.mlp(self.norm2(t))
        return self.head(t[:, 0])


def _small() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN().eval()


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return TinyViT().eval()


def _resnet() -> nn.Module:
    from torchvision.models import resnet18

    torch.manual_seed(0)
    return resnet18(weights=None).eval()


MODELS = {"cnn": (_small, 16), "vit": (_vit, 16), "resnet18": (_resnet, 64)}


def _captum(name: str, model: nn.Module, x: torch.Tensor, t: int, **o) -> torch.Tensor:
    """captum's attribution for hookscope's method ``name`` and options ``o``."""
    if name == "saliency":
        return captum.Saliency(model).attribute(x, target=t)
    if name == "inputxgradient":
        return captum.InputXGradient(model).attribute(x, target=t)
    if name == "integrated-gradients":
        return captum.IntegratedGradients(model).attribute(x, target=t, n_steps=o["steps"])
    if name in ("smoothgrad", "smoothgrad-sq", "vargrad"):
        torch.manual_seed(o["seed"])  # captum draws from the global generator
        std = o["noise"] * float(x.max() - x.min())
        return captum.NoiseTunnel(captum.Saliency(model)).attribute(
            x, target=t, nt_type=name.replace("-", "_"), nt_samples=o["samples"], stdevs=std,
            abs=False)
    if name == "occlusion":
        return captum.Occlusion(model).attribute(
            x, target=t, sliding_window_shapes=(x.shape[1], *o["window"]),
            strides=(1, *o["stride"]))
    if name == "guided-backprop":
        return captum.GuidedBackprop(model).attribute(x, target=t)
    return captum.DeepLift(model).attribute(x, target=t)


def _options(name: str, size: int) -> dict:
    if name == "integrated-gradients":
        return {"steps": 20}
    if name in ("smoothgrad", "smoothgrad-sq", "vargrad"):
        return {"samples": 6, "noise": 0.1, "seed": 3}
    if name == "occlusion":
        return {"window": (size // 4, size // 4), "stride": (size // 8, size // 8)}
    return {}


CASES = [(m, a) for m in MODELS for a in attribution_names()
         if not (m == "resnet18" and a == "deeplift")]  # captum refuses resnet's reused ReLU


@pytest.mark.parametrize(("model_name", "method"), CASES)
def test_each_method_equals_captum(model_name: str, method: str) -> None:
    build, size = MODELS[model_name]
    model = build()
    torch.manual_seed(1)
    x = torch.randn(1, 3, size, size)
    target = int(model(x).argmax())
    options = _options(method, size)
    ours = attribute(model, x, method=method, target=target, batch_cap=7, **options)
    ref = _captum(method, model, x.clone(), target, **options).detach().numpy()
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert np.abs(ref).max() > 0
    assert np.abs(ours - ref).max() <= TOL * np.abs(ref).max()


def test_deeplift_with_a_module_called_twice_is_captums_with_two_modules() -> None:
    """captum refuses a module used twice; hookscope gives each call its own rule, so the
    shared model's attributions are captum's on the same weights with two modules."""
    torch.manual_seed(0)
    shared = SmallCNN(shared=True).eval()
    torch.manual_seed(0)
    separate = SmallCNN().eval()
    separate.r2 = nn.ReLU(inplace=True)
    torch.manual_seed(1)
    x = torch.randn(1, 3, 16, 16)
    with pytest.raises(RuntimeError, match="used more than once|only once"):
        captum.DeepLift(shared).attribute(x, target=2)
    ours = attribute(shared, x, method="deeplift", target=2)
    ref = captum.DeepLift(separate).attribute(x, target=2).detach().numpy()
    assert np.abs(ours - ref).max() <= TOL * np.abs(ref).max()
    assert all(m.inplace for m in shared.modules() if isinstance(m, nn.ReLU))


def test_deeplift_sums_to_the_output_change_on_resnet18() -> None:
    """DeepLift's summation-to-delta, exact for the rescale rule with only linear layers
    between the nonlinearities: resnet18 (its max pooling, whose captum rule is not exact,
    replaced) with its ReLUs reused in every block; checked in float64 against the model."""
    model = _resnet().double()
    model.maxpool = nn.Identity()
    torch.manual_seed(2)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    attr = attribute(model, x, method="deeplift", target=7)
    with torch.no_grad():
        delta = (model(x)[:, 7] - model(torch.zeros_like(x))[:, 7]).numpy()
    assert np.allclose(attr.reshape(2, -1).astype(np.float64).sum(1), delta, rtol=1e-4,
                       atol=1e-5 * np.abs(delta).max())


def test_captum_differs_only_where_two_supported_modules_touch() -> None:
    """captum's hooks read a module's output gradient before the next module's rule has
    replaced it when one's output is the other's input (ReLU then MaxPool); with any
    operation between them captum applies the chain rule, and equals hookscope."""

    class One(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 1.0

    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
              nn.Linear(64, 5)]
    model, apart = nn.Sequential(*layers).eval(), nn.Sequential(*layers[:2], One(), *layers[2:])
    x = torch.randn(1, 3, 8, 8)
    ours = attribute(model, x, method="deeplift", target=1)
    ref = captum.DeepLift(apart.eval()).attribute(x, target=1).detach().numpy()
    assert np.abs(ours - ref).max() <= TOL * np.abs(ref).max()


def test_smoothgrad_without_noise_is_the_gradient() -> None:
    model = _small().double()
    torch.manual_seed(4)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    leaf = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(leaf)[:, 3].sum(), leaf)
    for method, want in (("smoothgrad", grad), ("smoothgrad-sq", grad * grad),
                         ("vargrad", torch.zeros_like(grad))):
        found = attribute(model, x, method=method, target=3, noise=0.0, samples=3)
        scale = float(grad.abs().max() if method == "smoothgrad" else (grad * grad).max())
        assert np.abs(found - want.numpy()).max() <= 1e-6 * scale, method


def _ig(model: nn.Module, x: torch.Tensor, **options) -> AttrResult:
    probe = AttributionProbe(model, attr_options(["integrated-gradients"], **options))
    return drive(model, x, probe).results["integrated-gradients"]


def test_integrated_gradients_completeness_gap_shrinks_with_the_steps() -> None:
    model = _small().double()
    torch.manual_seed(5)
    x = torch.randn(1, 3, 16, 16, dtype=torch.float64)
    results = [_ig(model, x, steps=n) for n in (1, 4, 16, 64)]
    gaps = [abs(r.gaps[0]) for r in results]
    assert gaps[0] > gaps[1] > gaps[2] > gaps[3]
    with torch.no_grad():  # the gap is sum - (f(x) - f(0)), f the top class's logit
        t = results[0].targets[0]
        change = float(model(x)[0, t] - model(torch.zeros_like(x))[0, t])
    for r in results:
        assert r.gaps[0] == pytest.approx(r.sums[0] - change, abs=1e-9)
    assert gaps[3] < 0.02 * abs(change)


@pytest.mark.parametrize("method", attribution_names())
def test_any_batching_gives_the_same_numbers(method: str) -> None:
    model = _small()
    torch.manual_seed(6)
    x = torch.randn(3, 3, 16, 16)
    opts = _options(method, 16)
    whole = attribute(model, x, method=method, batch_cap=1000, **opts)
    scale = np.abs(whole).max()
    for cap, parts in ((1, [x]), (5, [x[:1], x[1:]]), (2, [x[:2], x[2:]])):
        found = attribute(model, parts, method=method, batch_cap=cap, **opts)
        assert np.abs(found - whole).max() <= 1e-5 * scale, (cap, len(parts))


class Fails(nn.Module):
    """Raises on its third forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.calls = SmallCNN(), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("boom")
        return self.net(x)


@pytest.mark.parametrize("method", ["guided-backprop", "deeplift", "integrated-gradients"])
def test_the_model_is_left_as_found_also_after_an_exception(method: str) -> None:
    from hookscope.core.errors import ForwardError

    model = Fails()
    model.train()
    flags = [m.training for m in model.modules()]
    x = torch.randn(2, 3, 16, 16)
    attribute(model.net, x, method=method, batch_cap=1)
    with pytest.raises(ForwardError, match="boom"):
        attribute(model, x, method=method, batch_cap=1)
    for m in (model, model.net):
        assert hook_count(m) == 0
        assert all(p.grad is None for p in m.parameters())
    assert [m.training for m in model.modules()] == flags
    assert all(m.inplace for m in model.modules() if isinstance(m, nn.ReLU))


def test_registry_rejects_duplicates_and_is_the_clis_choices() -> None:
    from hookscope import options

    with pytest.raises(ValueError, match="already registered"):
        register("saliency")(lambda run: run.x)
    assert [m.value for m in options.AttrMethod] == list(ATTRIBUTIONS)


@pytest.mark.parametrize(("options", "message"), [
    ({"steps": 0}, "steps"), ({"noise": -1.0}, "noise"), ({"window": "4,x"}, "window"),
    ({"window": 4, "stride": 5}, "stride"), ({"baseline": "nothing.npy"}, "baseline")])
def test_bad_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(HookscopeError, match=message):
        attribute(_small(), torch.randn(1, 3, 16, 16), **options)


def test_a_fixed_baseline_and_its_shape(tmp_path) -> None:
    model, x = _small(), torch.randn(1, 3, 16, 16)
    base = torch.full((3, 16, 16), 0.5)
    np.save(tmp_path / "b.npy", base.numpy())
    ours = attribute(model, x, method="integrated-gradients", target=1,
                     baseline=str(tmp_path / "b.npy"))
    ref = captum.IntegratedGradients(model).attribute(x, base[None], target=1).detach().numpy()
    assert np.abs(ours - ref).max() <= TOL * np.abs(ref).max()
    with pytest.raises(HookscopeError, match="shape"):
        attribute(model, x, method="deeplift", baseline=torch.zeros(3, 8, 8))


def test_command_writes_overlays_raw_and_document(cli, cat_jpg, tmp_path) -> None:
    out = tmp_path / "out"
    r = cli("attribute", "resnet18", cat_jpg, *FAST, "-m", "integrated-gradients", "-m",
            "occlusion", "--steps", "4", "--window", "32", "--stride", "32", "--save-raw",
            "--out", out, "-f", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "attribute" and doc["methods"] == ["integrated-gradients",
                                                                "occlusion"]
    for row in doc["results"]:
        raw = np.load(row["raw"])
        assert raw.shape == (3, 64, 64) and raw.dtype == np.float32
        assert abs(row["sum"] - float(raw.astype(np.float64).sum())) <= \
            1e-6 * float(np.abs(raw).sum())
        assert (tmp_path / "out" / f"cat.{row['method']}.png").is_file()
    ig, occ = doc["results"]
    assert ig["completeness_gap"] == pytest.approx(
        ig["sum"] - (ig["score"] - ig["baseline_score"]), abs=1e-9)
    assert occ["completeness_gap"] is None and occ["target"] == ig["target"]


@pytest.mark.parametrize("args", [("--steps", "0"), ("--window", "x"),
                                  ("--stride", "20", "--window", "8"),
                                  ("--baseline", "missing.npy"), ("-m", "nope")])
def test_bad_options_one_line_exit_2_no_files(cli, cat_jpg, tmp_path, args) -> None:
    r = cli("attribute", "resnet18", cat_jpg, *FAST, "--out", tmp_path / "o", *args)
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_python_api_and_conv_padding_agree_with_torch() -> None:
    """inputxgradient of a single conv + sum is x * (the conv's weights summed), by hand."""
    conv = nn.Conv2d(2, 1, 1, bias=False)

    class Head(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.adaptive_avg_pool2d(conv(x), 1).flatten(1)

    x = torch.randn(1, 2, 4, 4)
    found = attribute(Head(), x, method="inputxgradient", target=0)
    want = x * conv.weight.detach()[0, :, 0, 0][None, :, None, None] / 16
    assert np.allclose(found, want.numpy(), atol=1e-7)
    assert hook_count(conv) == 0


def test_a_segmentation_target_is_the_class_logits_over_its_region() -> None:
    """The objective is Grad-CAM's: for segmentation, the target class's logits summed over
    the pixels where it is predicted; saliency is |d that / dx|, checked with autograd."""
    torch.manual_seed(7)
    seg = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 3, 1)).eval()
    x = torch.randn(1, 3, 8, 8)
    found = attribute(seg, x, method="saliency", target=1, task="segmentation")
    leaf = x.clone().requires_grad_(True)
    out = seg(leaf)
    region = (out.argmax(1) == 1).float().detach()
    (grad,) = torch.autograd.grad((out[:, 1] * region).sum(), leaf)
    assert region.sum() > 0
    assert np.abs(found - grad.abs().numpy()).max() <= 1e-6 * float(grad.abs().max())


def test_progress_counts_the_rows_evaluated() -> None:
    seen: list[int] = []
    x = torch.randn(2, 3, 16, 16)
    attribute(_small(), x, method="integrated-gradients", steps=10, batch_cap=3,
              progress=seen.append)
    assert sum(seen) == 2 * 10 and max(seen) <= 3
    seen.clear()
    attribute(_small(), x, method="occlusion", window=8, stride=4, progress=seen.append)
    assert sum(seen) == 2 * 3 * 3


def test_a_baseline_of_the_wrong_shape_is_one_line_and_leaves_no_file(cli, cat_jpg,
                                                                     tmp_path) -> None:
    np.save(tmp_path / "small.npy", np.zeros((3, 8, 8), np.float32))
    out = tmp_path / "o"
    r = cli("attribute", "resnet18", cat_jpg, *FAST, "-m", "saliency", "-m", "deeplift",
            "--baseline", tmp_path / "small.npy", "--out", out)
    assert r.exit_code == 2 and "shape" in r.stderr and "Traceback" not in r.output
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.slow
def test_integrated_gradients_finish_under_a_memory_cap_where_captums_run_out(tmp_path) -> None:
    """benchmarks/bench_attribute.py's --oom runs, smaller: resnet18 at 96 px, 50 steps, each
    library in a subprocess whose data size is capped at its set-up's + 200 MB. captum's
    default (all 50 steps in one pass) needs about 300 MB more, hookscope's 8 rows per pass
    about 75 MB; hookscope's capped result is captum's uncapped one (same arithmetic)."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_attribute.py"
    outcomes = {}
    for library in ("captum", "hookscope"):
        cmd = [sys.executable, bench, "--child", library, "--size", "96", "--cap", "8",
               "--oom", "200", "--save", tmp_path / f"{library}.npy"]
        done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                              timeout=600, check=False)
        outcomes[library] = json.loads(done.stdout.strip().splitlines()[-1])
    assert not outcomes["captum"]["ok"] and "can't allocate memory" in outcomes["captum"]["error"]
    assert outcomes["hookscope"]["ok"], outcomes
    model = _resnet()  # the subprocesses' model and input: seed 0, resnet18, then x
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        target = int(model(x).argmax())
    ref = captum.IntegratedGradients(model).attribute(x, target=target, n_steps=50)
    ref = ref.detach().numpy()
    found = np.load(tmp_path / "hookscope.npy")
    assert np.abs(found - ref).max() <= TOL * np.abs(ref).max()
