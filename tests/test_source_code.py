"""Models from the user's code (``file.py:NAME``, ``package.module:NAME``) and whole pickled
models: loading, model arguments, weights, and one line for every wrong form."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

from hookscope import sources
from hookscope.core.errors import HookscopeError
from hookscope.sources import LoadOptions
from hookscope.sources.code import parse_model_args

BLOCKS = """
from torch import nn

def head(width, classes):
    return nn.Linear(width, classes)
"""

NET = """
from torch import nn
from hookscope_test_blocks import head  # a sibling module, found beside this file


class Net(nn.Module):
    def __init__(self, width=8, classes=3):
        super().__init__()
        if width <= 0:
            raise ValueError(f"width must be positive, not {width}")
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = head(width, classes)

    def forward(self, x):
        return self.fc(self.pool(self.relu(self.conv(x))).flatten(1))


def make(width: int) -> Net:
    return Net(width=width)


class Zoo:
    @staticmethod
    def small():
        return Net(width=2)


def nothing():
    pass


def broken(width=1):
    raise RuntimeError("no GPU kernels for this layer")


class Config:
    pass


model = Net()
"""


def write_code(folder: Path) -> Path:
    """``net.py`` and its sibling ``hookscope_test_blocks.py`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hookscope_test_blocks.py").write_text(BLOCKS)
    (folder / "net.py").write_text(NET)
    return folder / "net.py"


@pytest.fixture(autouse=True)
def forget_user_modules(tmp_path: Path):
    """Each test imports its own copy of the user's modules; sys.path is left as it was."""
    path = list(sys.path)
    yield
    for name, module in list(sys.modules.items()):
        if str(tmp_path) in str(getattr(module, "__file__", None) or ""):
            del sys.modules[name]
    assert sys.path == path  # loading the user's code removes what it put on sys.path
    sys.path[:] = path


@pytest.fixture()
def net_py(tmp_path: Path) -> Path:
    return write_code(tmp_path / "code")


def reference_net(width: int, seed: int = 0) -> nn.Module:
    """The same architecture, built here independently with the same seed."""
    namespace: dict = {}
    exec(BLOCKS, namespace)
    exec(NET.replace("from hookscope_test_blocks import head", ""), namespace)
    torch.manual_seed(seed)
    return namespace["Net"](width=width)


def one_line(result, code: int = 2) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("hookscope: error: "), result.stderr
    return lines[0]


# ------------------------------------------------------------------ file.py:NAME, module:NAME


def test_file_class_with_model_args(net_py: Path) -> None:
    rng = torch.get_rng_state()
    loaded = sources.load(f"{net_py}:Net", LoadOptions(model_args=("width=16",)))
    assert torch.equal(torch.get_rng_state(), rng)  # seeded in a forked RNG
    model = loaded.model
    assert type(model).__name__ == "Net" and not model.training
    assert model.conv.out_channels == 16 and model.fc.in_features == 16
    assert (loaded.source, loaded.task, loaded.input_ndim) == ("code", "custom", 4)
    assert loaded.weights_requested == "auto"
    assert loaded.weights_loaded == "as constructed (seed 0)"
    assert (loaded.preprocess.resize, loaded.preprocess.crop) == (256, 224)
    want = reference_net(16).state_dict()
    got = model.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_seed_and_size(net_py: Path) -> None:
    loaded = sources.load(f"{net_py}:Net", LoadOptions(seed=3, size=64))
    assert loaded.weights_loaded == "as constructed (seed 3)"
    assert torch.equal(loaded.model.conv.weight, reference_net(8, seed=3).conv.weight)
    assert loaded.preprocess.crop == 64 and loaded.input_size == (64, 64)


def test_factory_and_dotted_name(net_py: Path) -> None:
    made = sources.load(f"{net_py}:make", LoadOptions(model_args=("width=4",))).model
    assert made.conv.out_channels == 4
    assert sources.load(f"{net_py}:Zoo.small").model.conv.out_channels == 2
    assert sources.load(f"{net_py}:model").model.conv.out_channels == 8  # an instance


def test_package_module_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "hookscope_test_pkg"
    write_code(package)
    (package / "net.py").write_text(NET.replace("from hookscope_test_blocks", "from ."
                                                "hookscope_test_blocks"))
    (package / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    loaded = sources.load("hookscope_test_pkg.net:make", LoadOptions(model_args=("width=5",)))
    assert loaded.model.conv.out_channels == 5 and loaded.source == "code"
    assert str(tmp_path) not in sys.path


def test_code_model_pickles(net_py: Path, tmp_path: Path) -> None:
    """The imported module is registered in sys.modules, so its models pickle."""
    model = sources.load(f"{net_py}:Net").model
    torch.save(model, tmp_path / "saved.pt")
    again = sources.load(str(tmp_path / "saved.pt"), LoadOptions(trust_checkpoint=True))
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(again.model(x), model(x))


@pytest.mark.parametrize(("text", "value"), [
    ("width=32", 32), ("lr=1e-3", 0.001), ("act=relu", "relu"), ("path=a/b.pt", "a/b.pt"),
    ("sizes=(1, 2)", (1, 2)), ("name='x y'", "x y"), ("flag=True", True), ("extra=None", None),
    ("cfg={'a': [1]}", {"a": [1]}), (" depth = 4 ", 4),
])
def test_parse_model_args(text: str, value: object) -> None:
    key = text.split("=")[0].strip()
    assert parse_model_args([text]) == {key: value}


@pytest.mark.parametrize(("args", "says"), [
    (["width=[1,"], "'width=[1,'"), (["width32"], "not key=value"), (["1x=3"], "not key=value"),
    (["x=a b"], "not a Python literal"), (["w=1", "w=2"], "given twice"),
])
def test_parse_model_args_refuses(args: list[str], says: str) -> None:
    with pytest.raises(HookscopeError, match=r"^model_args .*") as info:
        parse_model_args(args)
    assert says in str(info.value)


# ------------------------------------------------------------------ weights for code models


def test_weights_file(net_py: Path, tmp_path: Path) -> None:
    saved = reference_net(8, seed=7).state_dict()
    torch.save({"state_dict": saved, "classes": ["a", "b", "c"]}, tmp_path / "w.pt")
    loaded = sources.load(f"{net_py}:Net", LoadOptions(weights=str(tmp_path / "w.pt")))
    got = loaded.model.state_dict()
    assert all(torch.equal(got[k], saved[k]) for k in saved)
    assert loaded.weights_loaded == f"file:{tmp_path / 'w.pt'}"
    assert loaded.categories == ["a", "b", "c"] and loaded.labels_from == "checkpoint:classes"


def test_fine_tuned_weights_name_the_model_arg(net_py: Path, tmp_path: Path) -> None:
    torch.save(reference_net(8).state_dict() | {"fc.weight": torch.zeros(7, 8),
                                                 "fc.bias": torch.zeros(7)}, tmp_path / "ft.pt")
    with pytest.raises(HookscopeError, match="num_classes=7"):
        sources.load(f"{net_py}:Net", LoadOptions(weights=str(tmp_path / "ft.pt")))
    ok = sources.load(f"{net_py}:Net", LoadOptions(weights=str(tmp_path / "ft.pt"),
                                                    model_args=("classes=7",)))
    assert ok.model.fc.out_features == 7


def test_named_weights_and_num_classes_are_refused(net_py: Path) -> None:
    with pytest.raises(HookscopeError, match="no named weights"):
        sources.load(f"{net_py}:Net", LoadOptions(weights="DEFAULT"))
    with pytest.raises(HookscopeError, match="model_args num_classes=N"):
        sources.load(f"{net_py}:Net", LoadOptions(num_classes=4))


# ------------------------------------------------------------------ the command line


def test_gradcam_done_when(cli, net_py: Path, cat_jpg: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = cli("gradcam", f"{net_py}:Net", cat_jpg, "--model-arg", "width=32", "--mean", "0.5",
                 "--std", "0.5", "--size", "64", "--out", out)
    assert result.exit_code == 0, result.stderr
    overlays = sorted(out.glob("*.png"))
    assert overlays and all(Image.open(p).size == Image.open(cat_jpg).size for p in overlays)
    assert "as constructed (seed 0)" in result.stdout


def test_stats_values_match_independent_forward(cli, net_py: Path, tmp_path: Path) -> None:
    x = torch.randn(3, 20, 20, generator=torch.Generator().manual_seed(1))
    torch.save(x, tmp_path / "x.pt")
    result = cli("stats", f"{net_py}:Net", tmp_path / "x.pt", "--model-arg", "width=16",
                 "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["model"] == f"{net_py}:Net" and doc["source"] == "code"
    assert doc["weights"]["loaded"] == "as constructed (seed 0)"
    net = reference_net(16).double().eval()
    with torch.no_grad():
        conv = net.conv(x.double().unsqueeze(0))
    row = next(r for r in doc["layers"] if r["name"] == "conv")
    assert row["output_shape"] == [1, 16, 20, 20]
    for key, want in (("mean", conv.mean()), ("min", conv.min()), ("max", conv.max()),
                      ("std", conv.std(correction=0))):
        assert row[key] == pytest.approx(float(want), rel=1e-4, abs=1e-6), key


def test_layers_on_code_model(cli, net_py: Path) -> None:
    result = cli("layers", f"{net_py}:Net", "--model-arg", "width=16", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["root"]["type"] == "Net"
    assert doc["root"]["params_total"] == (3 * 9 * 16 + 16) + (16 * 3 + 3)


@pytest.mark.parametrize(("model", "args", "says"), [
    ("missing/net.py:Net", [], "Model file not found"),
    ("{net}:Nett", [], "has no attribute 'Nett'. Did you mean: Net?"),
    ("{net}:Net", ["--model-arg", "width=-1"],
     "Net(width=-1) raised ValueError: width must be positive, not -1 (at net.py:"),
    ("{net}:broken", [], "broken() raised RuntimeError: no GPU kernels for this layer"),
    ("{net}:nothing", [], "returned None"),
    ("{net}:Config", [], "not an nn.Module subclass"),
    ("{net}:Net", ["--model-arg", "width=[1,"], "--model-arg 'width=[1,'"),
    ("{net}:Net", ["--model-arg", "widht=3"],
     "unexpected argument 'widht'. Did you mean: width? It accepts: width=8, classes=3."),
    ("{net}:make", [], "missing a required argument: 'width'"),
    ("{net}:model", ["--model-arg", "width=3"], "a model instance"),
    ("hookscope_no_such_module:Net", [], "No module named 'hookscope_no_such_module'"),
    ("{bad}:Net", [], "raised ModuleNotFoundError: No module named 'hookscope_nope'"),
    ("{syntax}:Net", [], "raised SyntaxError"),
])
def test_bad_code_models_get_one_line(cli, net_py: Path, cat_jpg: Path, model: str,
                                      args: list[str], says: str) -> None:
    (net_py.parent / "bad.py").write_text("import hookscope_nope\n")
    (net_py.parent / "syntax.py").write_text("class Net(:\n")
    spec = model.format(net=net_py, bad=net_py.parent / "bad.py",
                        syntax=net_py.parent / "syntax.py")
    line = one_line(cli("stats", spec, cat_jpg, *args))
    assert says in line, line


# ------------------------------------------------------------------ whole pickled models


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)).eval()


def test_pickled_model_matches_the_original(tmp_path: Path) -> None:
    model = small_model()
    with torch.no_grad():  # BatchNorm statistics that are not the defaults
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    torch.save(model, tmp_path / "whole.pt")
    loaded = sources.load(str(tmp_path / "whole.pt"), LoadOptions(trust_checkpoint=True))
    assert loaded.source == "pickle" and loaded.weights_loaded == f"file:{tmp_path / 'whole.pt'}"
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), model(x))


def test_pickled_model_in_a_dict_with_labels(tmp_path: Path) -> None:
    torch.save({"model": small_model(), "classes": ["cat", "dog"]}, tmp_path / "ck.pt")
    loaded = sources.load(str(tmp_path / "ck.pt"), LoadOptions(trust_checkpoint=True))
    assert loaded.categories == ["cat", "dog"] and loaded.labels_from == "checkpoint:classes"


def test_pickled_model_with_a_weights_file(tmp_path: Path) -> None:
    torch.save(small_model(), tmp_path / "whole.pt")
    other = small_model()
    torch.nn.init.normal_(other[0].weight)
    torch.save(other.state_dict(), tmp_path / "w.pt")
    loaded = sources.load(str(tmp_path / "whole.pt"),
                          LoadOptions(trust_checkpoint=True, weights=str(tmp_path / "w.pt")))
    assert torch.equal(loaded.model[0].weight, other[0].weight)
    assert loaded.weights_loaded == f"file:{tmp_path / 'w.pt'}"


def test_pickled_model_on_the_command_line(cli, tmp_path: Path, cat_jpg: Path) -> None:
    torch.save(small_model(), tmp_path / "whole.pt")
    result = cli("layers", tmp_path / "whole.pt", "--trust-checkpoint", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["root"]["params_total"] == 112 + 8 + 10


def compiled(tmp_path: Path, kind: str) -> Path:
    model, x = small_model(), torch.randn(1, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated
        if kind == "script":
            torch.jit.script(model).save(tmp_path / "s.pt")
            return tmp_path / "s.pt"
        torch.export.save(torch.export.export(model, (x,)), tmp_path / "e.pt2")
        return tmp_path / "e.pt2"


@pytest.mark.parametrize(("make", "flags", "says"), [
    ("whole", [], "holds a whole pickled model, and loading it runs code the file names. If "
     "you trust the file, set --trust-checkpoint."),
    ("script", ["--trust-checkpoint"], "is a TorchScript archive; hooks need an eager nn.Module"),
    ("script", [], "is a TorchScript archive"),
    ("export", ["--trust-checkpoint"], "is a torch.export program; hooks need an eager nn.Module"),
    ("state", [], "holds a state_dict (weights without their architecture)"),
    ("state", ["--trust-checkpoint"], "use MODEL file.py:NAME (or a torchvision name) with "
     "--weights"),
    ("missing", [], "Model file not found"),
    ("whole", ["--trust-checkpoint", "--weights", "DEFAULT"], "no named weights"),
    ("unimportable", ["--trust-checkpoint"], "the pickled model's code cannot be imported"),
])
def test_bad_pickles_get_one_line(cli, tmp_path: Path, cat_jpg: Path, make: str,
                                  flags: list[str], says: str) -> None:
    path = tmp_path / f"{make}.pt"
    if make == "whole":
        torch.save(small_model(), path)
    elif make == "state":
        torch.save(small_model().state_dict(), path)
    elif make in ("script", "export"):
        path = compiled(tmp_path, make)
    elif make == "unimportable":  # its class's module is gone when it is loaded
        net_py = write_code(tmp_path / "gone")
        torch.save(sources.load(f"{net_py}:Net").model, path)
        for name in [n for n, m in sys.modules.items()
                     if str(tmp_path) in str(getattr(m, "__file__", None) or "")]:
            del sys.modules[name]
    line = one_line(cli("stats", path, cat_jpg, *flags))
    assert says in line, line
