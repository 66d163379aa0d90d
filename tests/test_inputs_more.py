"""Models of several inputs, keyword inputs and no inputs: Grad-CAM drawn on one input
(``overlay_input``) by its definition, a siamese backbone called twice, ``report`` on
non-image inputs, a forward without arguments, and the gradcam table's peak header."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

import hookscope
from hookscope.core.errors import HookscopeError
from tests.test_cam_layouts import MODELS as LAYOUTS

EPS32 = float(torch.finfo(torch.float32).eps)

MODELS = '''
import torch
from torch import nn


class Siamese(nn.Module):  # two images through one shared backbone
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(12, 4)

    def forward(self, a, b):
        return self.fc(torch.cat([self.backbone(a).mean((2, 3)), self.backbone(b).mean((2, 3))], 1))


class Keyed(nn.Module):  # forward(ids=..., image=...): an integer input first
    def __init__(self):
        super().__init__()
        self.emb, self.conv = nn.Embedding(10, 4), nn.Conv2d(3, 4, 3, padding=1)
        self.act, self.fc = nn.ReLU(), nn.Linear(4, 3)

    def forward(self, ids, image):
        return self.fc(self.act(self.conv(image)).mean((2, 3)) + self.emb(ids).mean(1))


class Tokens(nn.Module):  # token ids: no input a map can be drawn on
    def __init__(self):
        super().__init__()
        self.emb, self.conv, self.fc = nn.Embedding(20, 6), nn.Conv1d(6, 4, 3), nn.Linear(4, 3)

    def forward(self, ids):
        return self.fc(self.conv(self.emb(ids).transpose(1, 2)).mean(-1))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


class Pairs(torch.utils.data.Dataset):  # (image, label)
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(i)), i % 3


def doubled(items):  # a collate function of its own: the images times two
    return torch.stack([x for x, _ in items]) * 2, torch.tensor([y for _, y in items])


ORDER = [5, 3, 1, 0, 2, 4]


def loader():
    return torch.utils.data.DataLoader(Pairs(), batch_size=4, sampler=ORDER, collate_fn=doubled)


class NoArgs(nn.Module):  # forward(self): the input is a parameter of its own
    def __init__(self):
        super().__init__()
        self.image = nn.Parameter(torch.randn(1, 3, 8, 8))
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4, 2)

    def forward(self):
        return self.fc(self.conv(self.image).mean((2, 3)))
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("more")
    source = MODELS + LAYOUTS  # and the signal and clip models of test_cam_layouts
    (folder / "more_models.py").write_text(source)
    namespace: dict = {}
    exec(compile(source, "more_models", "exec"), namespace)
    return folder, namespace


def build(namespace: dict, name: str) -> nn.Module:
    torch.manual_seed(0)  # as hookscope builds file.py:NAME
    return namespace[name]().eval()


def by_definition(model: nn.Module, args: tuple, layer: str, call: int) -> np.ndarray:
    """Grad-CAM's raw map in float64 by its definition at call ``call`` of ``layer``:
    autograd.grad of each input's top logit at that call's output, channel weights the
    gradient's mean over the positions, the ReLU of the weighted sum."""
    m = copy.deepcopy(model).double()
    kept: list[torch.Tensor] = []
    handle = dict(m.named_modules())[layer].register_forward_hook(lambda mod, i, o: kept.append(o))
    try:
        logits = m(*(a.double() if a.is_floating_point() else a for a in args))
    finally:
        handle.remove()
    a = kept[call]
    score = logits.gather(1, logits.argmax(1, keepdim=True)).sum()
    (g,) = torch.autograd.grad(score, a)
    return (g.mean((2, 3), keepdim=True) * a).sum(1).clamp(min=0).detach().numpy()


def untouched(model: nn.Module) -> None:
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters()) and not model.training


def test_siamese_is_explained_at_the_backbones_last_call(models) -> None:
    """A module called twice is explained at its last call (the second image's); the map
    is drawn on the input named by overlay_input, by default the first image."""
    _, ns = models
    model = build(ns, "Siamese")
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 3, 8, 8, generator=gen), torch.randn(2, 3, 8, 8, generator=gen)
    want = by_definition(model, (a, b), "backbone", call=1)
    # The raw map sums 6 channels of a 27-term convolution: eps per term, per layer.
    tol = EPS32 * 6 * 27 * 2 * np.abs(want).max()
    for overlay in (None, 1):
        res = hookscope.gradcam(model, (a, b), "backbone", overlay_input=overlay)
        np.testing.assert_allclose(res.raw, want, rtol=0, atol=tol)
        assert res.targets == model(a, b).argmax(1).tolist()
    untouched(model)
    first = by_definition(model, (a, b), "backbone", call=0)
    assert np.abs(first - want).max() > 100 * tol  # the calls differ: the test can tell them apart


@pytest.mark.parametrize("method", ["gradcam", "scorecam", "ablationcam", "gradcam++"])
def test_each_row_runs_with_its_own_other_inputs(models, method) -> None:
    """Methods that run extra passes (masked copies, ablated channels) hand each copy its
    own row of the other inputs: a batch of two equals each sample explained alone, with
    its ids fixed in a one-input wrapper."""
    _, ns = models
    model = build(ns, "Keyed")
    ids = torch.tensor([[1, 2, 3], [7, 8, 9]])
    image = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(2))
    both = hookscope.gradcam(model, {"ids": ids, "image": image}, "act", method=method)

    class Alone(nn.Module):
        def __init__(self, row: int) -> None:
            super().__init__()
            self.inner, self.row = model, row

        def forward(self, x):
            return self.inner(ids[self.row : self.row + 1].expand(len(x), -1), x)

    for row in range(2):
        alone = hookscope.gradcam(Alone(row).eval(), image[row : row + 1], "inner.act", method=method)
        # One sample's float32 map either way; the masked passes' softmax weights: ~1e-6.
        np.testing.assert_allclose(both.maps[row], alone.maps[0], rtol=0, atol=1e-4)
        assert both.targets[row] == alone.targets[0]
    untouched(model)


def test_overlay_input_refusals(models) -> None:
    _, ns = models
    ids = torch.tensor([[1, 2, 3]])
    image = torch.randn(1, 3, 6, 6)
    model = build(ns, "Keyed")
    with pytest.raises(HookscopeError, match="overlay_input.*ids.*is \\(1, 3\\) int64"):
        hookscope.gradcam(model, {"ids": ids, "image": image}, "act", overlay_input="ids")
    with pytest.raises(HookscopeError, match="overlay_input.*the inputs are ids, image"):
        hookscope.gradcam(model, {"ids": ids, "image": image}, "act", overlay_input="mask")
    with pytest.raises(HookscopeError, match="none of the inputs"):
        hookscope.gradcam(build(ns, "Tokens"), (torch.tensor([[1, 2, 3, 4]]),), "conv")


def test_gradcam_command_on_two_and_keyword_inputs(cli, models) -> None:
    from PIL import Image

    folder, _ = models
    gen = torch.Generator().manual_seed(3)
    torch.save((torch.randn(2, 3, 8, 8, generator=gen), torch.randn(2, 3, 8, 8, generator=gen)),
               folder / "pair.pt")
    torch.save({"ids": torch.randint(0, 10, (2, 5), generator=gen),
                "image": torch.randn(2, 3, 12, 10, generator=gen)}, folder / "keyed.pt")
    for name, data, extra in (("Siamese", "pair.pt", ["--overlay-input", "1"]),
                              ("Keyed", "keyed.pt", [])):
        out = folder / f"cams-{name}"
        r = cli("gradcam", f"{folder}/more_models.py:{name}", folder / data, "--out", out,
                "--save-raw", *extra, "-f", "json")
        assert r.exit_code == 0, r.output
        size = (8, 8) if name == "Siamese" else (12, 10)
        for row in json.loads(r.stdout)["results"]:
            assert Image.open(row["heatmap"]).size == size[::-1]
    r = cli("gradcam", f"{folder}/more_models.py:Keyed", folder / "keyed.pt", "--out",
            folder / "no", "--overlay-input", "ids")
    assert r.exit_code == 2 and "--overlay-input ids: is (1, 5) int64" in r.stderr
    assert "Traceback" not in r.output and not (folder / "no").exists()


@pytest.mark.parametrize("name,shape,header", [("Signal", (2, 2, 32), "peak l"),
                                               ("Clip", (2, 3, 2, 8, 8), "peak d,y,x")])
def test_the_peak_header_names_the_maps_axes(cli, models, name, shape, header) -> None:
    folder, _ = models
    torch.save((torch.randn(*shape),), folder / f"{name}.pt")
    r = cli("gradcam", f"{folder}/more_models.py:{name}", folder / f"{name}.pt", "--out",
            folder / f"peaks-{name}", "--layer", "act")
    assert r.exit_code == 0, r.output
    head = next(line for line in r.stdout.splitlines() if line.startswith("input"))
    assert header in head and "y,x" not in head.replace("d,y,x", "")


def test_a_forward_of_no_arguments_runs_without_input(cli, models) -> None:
    """``forward(self)``: stats and layers run it once, with no INPUT, and their numbers are
    the model's own (float64 hooks); a model that needs inputs still says so in one line."""
    folder, ns = models
    model = build(ns, "NoArgs").double()
    found: dict[str, list[float]] = {}
    for name in ("conv", "fc"):
        getattr(model, name).register_forward_hook(
            lambda m, i, o, n=name: found.update({n: [o.mean().item(), o.min().item(), o.max().item()]}))
    with torch.no_grad():
        model()
    doc = json.loads(cli("stats", f"{folder}/more_models.py:NoArgs", "-f", "json").stdout)
    assert doc["inputs"] == ["forward()"] and doc["input_shape"] is None
    for row in doc["layers"]:
        # A 27-term float32 convolution: eps per term of relative error; 1e-5 leaves room.
        got = [row["mean"], row["min"], row["max"]]
        np.testing.assert_allclose(got, found[row["name"]], rtol=1e-5, atol=1e-6)
    layers = json.loads(cli("layers", f"{folder}/more_models.py:NoArgs", "-f", "json").stdout)
    rows = {r["name"]: r for r in layers["layers"]}
    assert layers["root"]["params_total"] == sum(p.numel() for p in model.parameters())
    assert rows["conv"]["calls"][0]["output_shape"] == [1, 4, 6, 6]
    # MACs of a 3x3 convolution of 3 channels into 4 over a 6x6 output, and of Linear(4, 2).
    assert rows["conv"]["macs"] == 4 * 6 * 6 * 3 * 9 and rows["fc"]["macs"] == 4 * 2
    assert json.loads(cli("stats", f"{folder}/more_models.py:NoArgs", "-f", "json").stdout) \
        ["predictions"][0][0]["index"] == int(model().argmax())
    r = cli("stats", f"{folder}/more_models.py:Signal")
    assert r.exit_code == 2 and r.stderr.strip().endswith("or --data.") and "Traceback" not in r.output
    assert hookscope.collect_stats(build(ns, "NoArgs"), ()).layers[0].name == "conv"


def _report(folder, name: str, batch):
    from hookscope.inputs.resolve import iter_batches, resolve_inputs
    from hookscope.report import build_report
    from hookscope.sources import LoadOptions, load

    torch.save(batch, folder / f"report-{name}.pt")
    loaded = load(f"{folder}/more_models.py:{name}", LoadOptions())
    inputs = resolve_inputs([str(folder / f"report-{name}.pt")])
    report = build_report(loaded, lambda: iter_batches(inputs, loaded.preprocess, keep_images=True),
                          inputs.names)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in loaded.model.modules())
    return loaded, report


@pytest.mark.parametrize("name,batch,grid", [
    ("Signal", (torch.randn(2, 2, 32),), (32,)),
    ("Clip", (torch.randn(2, 3, 2, 8, 8),), (2, 8, 8)),
    ("Siamese", (torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)), (8, 8)),
    ("Tokens", (torch.randint(0, 20, (2, 9)),), None)])
def test_report_on_inputs_that_are_not_one_image(models, name, batch, grid) -> None:
    """Signals, volumes, two images and token ids each get the page: statistics, gradients,
    the FLOPs of their first input, and Grad-CAM where a map can be drawn (a signal's curve,
    a volume's contact sheet), else the section left out with why."""
    from torch.utils.flop_counter import FlopCounterMode

    from hookscope.render.report import report_html

    folder, _ = models
    loaded, report = _report(folder, name, batch)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        loaded.model(*(t[:1] for t in batch))
    # Convolutions and Linear layers only, which FlopCounterMode counts by their formulas.
    assert report.flops == counter.get_total_flops() > 0
    assert len(report.stats.layers) > 0 and report.grads is not None
    page = report_html(report)
    if grid is None:
        assert "drawn on" in report.left_out["gradcam"] and report.inputs == []
        assert 'id="gradcam"' not in page and "Gradcam left out: A CAM is drawn on" in page
        return
    assert [m.shape for item in report.inputs for m in item.maps.values()] == [grid, grid]
    # One overlay per input; an image input also shows the input alone.
    assert page.count("<img") == 2 * (2 if len(grid) == 2 else 1)


def test_a_data_loader_is_read_through_its_sampler_and_collate_function(cli, models) -> None:
    """--data with a DataLoader: its sampler's order and its collate function's batches (here
    the images doubled), split into samples; the labels follow the same order."""
    folder, ns = models
    model = build(ns, "Net").double()
    images = torch.stack([ns["Pairs"]()[i][0] for i in ns["ORDER"]]) * 2
    with torch.no_grad():
        probs = model(images.double()).softmax(1)
    spec = f"{folder}/more_models.py"
    doc = json.loads(cli("stats", f"{spec}:Net", "--data", f"{spec}:loader", "-f", "json").stdout)
    assert doc["inputs"] == [f"{spec}:loader[{i}]" for i in range(6)]
    for i, preds in enumerate(doc["predictions"]):
        assert preds[0]["index"] == int(probs[i].argmax())
        # float32 softmax of a 3-class head over 27-term convolutions: ~1e-6; 1e-5 leaves room.
        assert abs(preds[0]["prob"] - float(probs[i].max())) < 1e-5
    r = cli("grads", f"{spec}:Net", "--data", f"{spec}:loader", "--loss", "ce", "-f", "json")
    assert r.exit_code == 0, r.output
    assert [int(t) for t in json.loads(r.stdout)["targets"]] == [i % 3 for i in ns["ORDER"]]
    from hookscope.inputs.data import DataSource

    sharded = torch.utils.data.DataLoader(ns["Pairs"](), sampler=torch.utils.data.DistributedSampler(
        ns["Pairs"](), num_replicas=2, rank=0))
    with pytest.raises(HookscopeError, match="DistributedSampler shards the data set"):
        DataSource(sharded, "x.py:sharded")
