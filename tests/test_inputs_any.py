"""Inputs of any structure: tuple and dict tensor files, integer and 1-D inputs, ``--data``
data sets of (image, label) pairs, the label rule, and malformed tensor files.

Per-layer statistics are checked against an independent float64 computation: the same
seeded model in float64, its leaf modules' first output tensors gathered by plain hooks.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hookscope.core.arguments import split_label
from hookscope.core.errors import HookscopeError

MODELS = '''
import torch
from torch import nn


class Two(nn.Module):  # RGB + depth
    def __init__(self):
        super().__init__()
        self.rgb, self.depth = nn.Conv2d(3, 4, 3), nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(8, 5)

    def forward(self, rgb, depth):
        return self.fc(torch.cat([self.rgb(rgb).mean((2, 3)), self.depth(depth).mean((2, 3))], 1))


class Masked(nn.Module):  # an image and an optional keyword mask
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, 3)

    def forward(self, image, mask=None):
        y = self.conv(image)
        if mask is not None:
            y = y * mask
        return self.fc(y.mean((2, 3)))


class Tokens(nn.Module):  # int64 token ids
    def __init__(self):
        super().__init__()
        self.emb, self.lstm = nn.Embedding(20, 6), nn.LSTM(6, 5, batch_first=True)
        self.fc = nn.Linear(5, 4)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.fc(out[:, -1])


class Signal(nn.Module):  # (N, C, L)
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv1d(2, 4, 3), nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.conv(x).mean(-1))


class Pairs(torch.utils.data.Dataset):  # (image, label) as torchvision's datasets give them
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(i)), i % 3


class Many(nn.Module):  # forward(*xs): is an integer second value a label or an input?
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, *xs):
        return self.fc(xs[0].mean((2, 3)))


class Broken(Pairs):
    def __getitem__(self, i):
        raise KeyError(f"no item {i}")


def stream():  # an iterable without a length: read once, up front
    return ((torch.full((3, 4, 4), float(i)), i) for i in range(100))


def pairs_loader():
    return torch.utils.data.DataLoader(Pairs(), batch_size=4)
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("any") / "any_models.py"
    path.write_text(MODELS)
    return path


def _module(path: Path):
    spec = importlib.util.spec_from_file_location("any_models_ref", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(models: Path, name: str, args: tuple, kwargs: dict | None = None) -> dict:
    """Each leaf's (mean, unbiased std, min, max) of its first output tensor, in float64,
    for the model hookscope builds from ``file.py:NAME`` (seed 0)."""
    torch.manual_seed(0)
    model = getattr(_module(models), name)().double().eval()
    found: dict[str, tuple[float, float, float, float]] = {}

    def hook(name, module, inp, out):
        t = out[0] if isinstance(out, tuple) else out
        found[name] = (t.mean().item(), t.std().item(), t.min().item(), t.max().item())

    handles = [m.register_forward_hook(lambda m, i, o, n=n: hook(n, m, i, o))
               for n, m in model.named_modules() if n and not list(m.children())]
    cast = [a.double() if a.is_floating_point() else a for a in args]
    with torch.no_grad():
        model(*cast, **{k: v.double() if v.is_floating_point() else v
                        for k, v in (kwargs or {}).items()})
    for h in handles:
        h.remove()
    return found


def assert_matches(doc: dict, ref: dict) -> None:
    rows = {row["name"]: row for row in doc["layers"]}
    assert set(rows) == set(ref)
    for name, values in ref.items():
        got = [rows[name][k] for k in ("mean", "std", "min", "max")]
        # A float32 forward of these few-term sums: ~1e-6 relative; 1e-4 leaves room.
        for g, want in zip(got, values, strict=True):
            assert math.isclose(g, want, rel_tol=1e-4, abs_tol=1e-5), (name, got, values)


def run(cli, *args) -> dict:
    result = cli(*args, "-f", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def one_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    return lines[0]


def test_two_inputs_from_a_tuple_file(cli, models, tmp_path) -> None:
    rgb, depth = torch.randn(3, 3, 8, 8), torch.randn(3, 1, 8, 8)
    torch.save((rgb, depth), tmp_path / "two.pt")
    doc = run(cli, "stats", f"{models}:Two", tmp_path / "two.pt", "-b", "2")
    assert doc["inputs"][-1].endswith("two.pt[2]") and len(doc["predictions"]) == 3
    assert_matches(doc, reference(models, "Two", (rgb, depth)))
    assert run(cli, "check", f"{models}:Two", tmp_path / "two.pt")["passed"]
    grads = run(cli, "grads", f"{models}:Two", tmp_path / "two.pt")
    assert {row["name"] for row in grads["layers"]} == {"rgb", "depth", "fc"}


def test_keyword_inputs_from_a_dict_file(cli, models, tmp_path) -> None:
    image = torch.randn(2, 3, 6, 6)
    mask = torch.rand(2, 1, 6, 6) > 0.5  # a bool mask
    torch.save({"image": image, "mask": mask}, tmp_path / "kw.pt")
    doc = run(cli, "stats", f"{models}:Masked", tmp_path / "kw.pt")
    assert_matches(doc, reference(models, "Masked", (image,), {"mask": mask}))
    assert run(cli, "check", f"{models}:Masked", tmp_path / "kw.pt")["passed"]


def test_token_ids_into_embedding_and_lstm(cli, models, tmp_path) -> None:
    ids = torch.randint(0, 20, (3, 7))
    torch.save(ids, tmp_path / "ids.pt")
    doc = run(cli, "stats", f"{models}:Tokens", tmp_path / "ids.pt")
    assert doc["layers"][0]["input_shapes"] == [[3, 7]]
    assert_matches(doc, reference(models, "Tokens", (ids,)))
    assert run(cli, "check", f"{models}:Tokens", tmp_path / "ids.pt")["passed"]
    grads = run(cli, "grads", f"{models}:Tokens", tmp_path / "ids.pt")
    assert grads["first_nonfinite"] is None and len(grads["targets"]) == 3


def test_signal_from_a_tuple_or_safetensors(cli, models, tmp_path) -> None:
    from safetensors.torch import save_file

    x = torch.randn(4, 2, 16)
    torch.save((x,), tmp_path / "sig.pt")  # in a tuple: samples first, not one image
    save_file({"0": x}, str(tmp_path / "sig.safetensors"))  # names 0, 1...: positional
    ref = reference(models, "Signal", (x,))
    for path in (tmp_path / "sig.pt", tmp_path / "sig.safetensors"):
        doc = run(cli, "stats", f"{models}:Signal", path)
        assert len(doc["inputs"]) == 4
        assert_matches(doc, ref)
    assert run(cli, "check", f"{models}:Signal", tmp_path / "sig.pt")["passed"]
    cams = run(cli, "gradcam", f"{models}:Signal", tmp_path / "sig.pt", "--out",
               tmp_path / "cam")  # 1-D maps: tests/test_cam_layouts.py
    assert cams["layer"] == "conv" and cams["layer_shape"] == [4, 14]
    assert [len(r["peak"]) for r in cams["results"]] == [1] * 4


def test_data_set_of_image_label_pairs(cli, models, tmp_path) -> None:
    data = ("--data", f"{models}:Pairs")
    dataset = _module(models).Pairs()
    images = torch.stack([dataset[i][0] for i in range(6)])
    doc = run(cli, "stats", f"{models}:Masked", *data, "-b", "4")
    assert doc["inputs"][0] == f"{models}:Pairs[0]" and len(doc["inputs"]) == 6
    assert_matches(doc, reference(models, "Masked", (images,)))
    workers = run(cli, "stats", f"{models}:Masked", *data, "-b", "4", "--workers", "2")
    assert workers["layers"] == doc["layers"]
    # The labels are the expected classes of check and the true classes of grads.
    check = cli("check", f"{models}:Masked", *data, "-f", "json")
    expect = next(r for r in json.loads(check.stdout)["rules"] if r["rule"] == "expect")
    top1 = [p[0]["index"] for p in doc["predictions"]]
    assert check.exit_code == (0 if top1 == [i % 3 for i in range(6)] else 1)
    assert expect["limit"] == {f"{models}:Pairs[{i}]": str(i % 3) for i in range(6)}
    grads = run(cli, "grads", f"{models}:Masked", *data, "--loss", "ce")
    assert grads["targets"] == [i % 3 for i in range(6)]
    cam = run(cli, "gradcam", f"{models}:Masked", *data, "--out", tmp_path / "cam")
    assert len(cam["results"]) == 6 and (tmp_path / "cam" / "data_5.gradcam.png").is_file()
    streamed = run(cli, "stats", f"{models}:Masked", "--data", f"{models}:stream", "--limit", "3")
    assert len(streamed["inputs"]) == 3
    assert streamed["layers"][-1]["output_shape"] == [3, 3]
    # A DataLoader (a callable returning one) is read as its data set.
    loader = run(cli, "stats", f"{models}:Masked", "--data", f"{models}:pairs_loader", "-b", "4")
    assert loader["layers"] == doc["layers"]


def test_bad_data_is_one_line(cli, models, tmp_path) -> None:
    assert "not both" in one_line(cli("stats", f"{models}:Masked", tmp_path, "--data",
                                      f"{models}:Pairs"))
    assert "has no attribute 'Nope'" in one_line(cli("stats", f"{models}:Masked", "--data",
                                                    f"{models}:Nope"))
    line = one_line(cli("stats", f"{models}:Many", "--data", f"{models}:Pairs"))
    assert "could be a label or an input" in line
    line = one_line(cli("stats", f"{models}:Masked", "--data", f"{models}:Broken"))
    assert "item 0 raised KeyError" in line


@pytest.mark.parametrize("content,message", [
    ((torch.zeros(2, 3), torch.zeros(3, 3)), "disagree on the number of samples"),
    ((torch.zeros(2, 3), "text"), "is a string"),
    ((), "holds no tensor"),
    ({"a": {"b": torch.zeros(2, 3), "c": [b"raw"]}}, "['a']['c'][0]: is a bytes"),
    (torch.tensor(1.0), "0-d tensor"),
])
def test_malformed_tensor_files(cli, models, tmp_path, content, message) -> None:
    torch.save(content, tmp_path / "bad.pt")
    assert message in one_line(cli("stats", f"{models}:Signal", tmp_path / "bad.pt"))


def test_the_label_rule() -> None:
    from hookscope.core.arguments import arity

    class One(nn.Module):
        def forward(self, x, mask=None):
            return x

    class Pair(nn.Module):
        def forward(self, a, b):
            return a

    class Many(nn.Module):
        def forward(self, *xs):
            return xs[0]

    x = torch.zeros(3)
    assert split_label((x, 2), arity(One())) == (x, 2)
    inputs, label = split_label((x, torch.tensor(1)), arity(Pair()))
    assert label is None and len(inputs) == 2  # both are needed as inputs
    assert split_label({"image": x, "label": 4}, arity(One()))[1] == 4
    assert split_label((x, x), arity(One()))[1] is None  # a float second: an input
    with pytest.raises(HookscopeError, match="could be a label or an input"):
        split_label((x, 1), arity(Many()))


def test_python_api_takes_tuples_dicts_and_data_sets(models) -> None:
    import hookscope

    module = _module(models)
    torch.manual_seed(0)
    model = module.Masked().eval()
    image, mask = torch.randn(2, 3, 6, 6), torch.ones(2, 1, 6, 6)
    a = hookscope.collect_stats(model, (image, mask))
    b = hookscope.collect_stats(model, {"image": image, "mask": mask})
    assert [r.mean for r in a.layers] == [r.mean for r in b.layers]
    ref = reference(models, "Masked", (image,), {"mask": mask})
    assert math.isclose(a.layers[0].mean, ref["conv"][0], rel_tol=1e-4, abs_tol=1e-6)
    loader = hookscope.collect_stats(model, module.pairs_loader())  # (image, label) batches
    dataset = hookscope.collect_stats(model, module.Pairs())
    images = torch.stack([module.Pairs()[i][0] for i in range(6)])
    whole = reference(models, "Masked", (images,))
    for report in (loader, dataset):
        assert math.isclose(report.layers[0].std, whole["conv"][1], rel_tol=1e-4)


def test_which_files_are_one_sample_and_which_are_rows(tmp_path) -> None:
    from hookscope.inputs.resolve import iter_batches, resolve_inputs

    image, table = torch.randn(3, 8, 8), torch.randn(5, 4)
    ids = torch.randint(0, 9, (3, 8, 8))  # 3-D but integer: rows, not one image
    for name, value in (("image.pt", image), ("table.pt", table), ("ids.pt", ids)):
        torch.save(value, tmp_path / name)
    counts = [len(resolve_inputs([str(tmp_path / n)])) for n in ("image.pt", "table.pt", "ids.pt")]
    assert counts == [1, 5, 3]
    both = {"a": torch.arange(6).reshape(3, 2), "b": torch.ones(3, 1, dtype=torch.bool)}
    torch.save(both, tmp_path / "both.pt")
    batches = list(iter_batches(resolve_inputs([str(tmp_path / "both.pt")]), lambda i: i,
                                batch_size=2))
    assert [len(b) for b in batches] == [2, 1]
    assert torch.equal(torch.cat([b.tensor["a"] for b in batches]), both["a"])
    assert batches[0].tensor["b"].dtype == torch.bool


@pytest.mark.slow
def test_data_under_torchrun_equals_one_process(models, tmp_path) -> None:
    import os
    import subprocess
    import sys

    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HOOKSCOPE_OFFLINE": "1"}
    docs = []
    for launcher in ([sys.executable, "-m"],
                     [str(torchrun), "--nproc-per-node", "2", "--standalone", "-m"]):
        out = tmp_path / f"{len(docs)}.json"
        done = subprocess.run([*launcher, "hookscope", "grads", f"{models}:Masked", "--data",
                               f"{models}:Pairs", "--loss", "ce", "-b", "2", "-f", "json",
                               "-o", str(out)], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr
        docs.append(json.loads(out.read_text()))
    assert docs[0]["targets"] == docs[1]["targets"] == [i % 3 for i in range(6)]
    assert math.isclose(docs[0]["objective"], docs[1]["objective"], rel_tol=1e-6)


def _shapes_and_macs(models: Path, name: str, args: tuple, kwargs: dict) -> tuple[dict, int, int]:
    """Each leaf's first output shape for one sample, the parameter count, and the MACs of
    one sample's forward by ``FlopCounterMode`` (FLOPs / 2), from the seed-0 model."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = getattr(_module(models), name)().eval()
    shapes: dict[str, list[int]] = {}

    def hook(name: str, output: Any) -> None:
        shapes.setdefault(name, list((output[0] if isinstance(output, tuple) else output).shape))

    handles = [m.register_forward_hook(lambda m, i, o, n=n: hook(n, o))
               for n, m in model.named_modules() if n and not list(m.children())]
    one = tuple(a[:1] for a in args), {k: v[:1] for k, v in kwargs.items()}
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*one[0], **one[1])
    for h in handles:
        h.remove()
    return shapes, sum(p.numel() for p in model.parameters()), counter.get_total_flops() // 2


@pytest.mark.parametrize(("name", "args", "kwargs", "grid_type"), [
    ("Two", (torch.randn(3, 3, 8, 8), torch.randn(3, 1, 8, 8)), {}, "Conv2d"),
    ("Masked", (torch.randn(2, 3, 6, 6),), {"mask": torch.rand(2, 1, 6, 6) > 0.5}, "Conv2d"),
    ("Tokens", (torch.randint(0, 20, (3, 7)),), {}, None),  # a sequence: no grid to draw
    ("Signal", (torch.randn(4, 2, 16),), {}, "Conv1d"),
])
def test_layers_and_features_on_every_input_form(cli, models, tmp_path, name, args, kwargs,
                                                 grid_type) -> None:
    path = tmp_path / "in.pt"
    torch.save(kwargs | {"image": args[0]} if kwargs else args, path)
    shapes, params, macs = _shapes_and_macs(models, name, args, kwargs)
    layers = run(cli, "layers", f"{models}:{name}", path)
    if name == "Tokens":  # FlopCounterMode counts no LSTM: by hand, T x 4 gates x (in*h + h*h)
        macs += 7 * 4 * (6 * 5 + 5 * 5)
    assert layers["totals"]["params"] == params and layers["totals"]["macs"] == macs
    assert {row["name"]: row["calls"][0]["output_shape"][1:] for row in layers["layers"]} == \
        {n: s[1:] for n, s in shapes.items()}
    if grid_type is None:
        line = one_line(cli("features", f"{models}:{name}", path, "--type", "Embedding",
                            "--out", tmp_path / "f"))
        assert "feature grids need an image grid" in line
        assert "tokens are not image patches (the input has no image grid)" in line  # not "0x0"
        return
    doc = run(cli, "features", f"{models}:{name}", path, "--type", grid_type, "--out", tmp_path / "f")
    samples = len(args[0])
    grids = doc["grids"]
    assert len(grids) == samples * sum(1 for r in layers["layers"] if r["type"] == grid_type)
    for grid in grids:
        assert grid["shape"] == shapes[grid["layer"]][1:] and grid["nonfinite"] == 0
        assert Path(grid["path"]).is_file()
