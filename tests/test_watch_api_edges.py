"""#28 finding 10: every bad argument of ``hookscope.watch`` and ``w.step`` is one
``HookscopeError`` line, raised before the log directory is touched; a str for ``layers``,
``types`` or ``allow_inf`` is one name; a lazy model's failed watch leaves nothing that blocks
the retry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


BAD_OPTIONS = [
    ({"percentiles": True}, "percentiles: 'True' is not a number"),
    ({"percentiles": [50, False]}, "percentiles: 'False' is not a number"),
    ({"percentiles": {"a": 1}}, "percentiles: 'a' is not a number"),
    ({"layers": [1]}, "layers must be a name or a list of names"),
    ({"layers": 3}, "layers must be a name or a list of names"),
    ({"types": [nn.Linear]}, "types must be a name or a list of names"),
    ({"allow_inf": 3}, "allow_inf must be a name or a list of names"),
    ({"allow_inf": [""]}, "allow_inf must be a name or a list of names"),
    ({"keep": 0}, "keep must be a whole number of at least 1"),
    ({"every": True}, "every must be a whole number of at least 1"),
    ({"every": 2.5}, "every must be a whole number of at least 1"),
    ({"max_drift": True}, "max_drift must be a non-negative number"),
    ({"max_drift": float("nan")}, "max_drift must be a non-negative number"),
    ({"nonfinite": None}, "nonfinite None: choose one of raise, warn, off"),
    ({"name": 3}, "name must be a string, not 3."),
    ({"force": "no"}, "force must be True or False, not 'no'."),
    ({"tensorboard": 1}, "tensorboard must be True or False, not 1."),
    ({"reference": 3}, "reference must be a path, not 3."),
    ({"reference": "missing.json"}, "reference 'missing.json' not found"),
    ({"log_dir": None}, "log_dir must be a path, not None."),
    ({"log_dir": 7}, "log_dir must be a path, not 7."),
    ({"model": lambda x: x}, "model must be a torch.nn.Module, not <function"),
    ({"model": None}, "model must be a torch.nn.Module, not None."),
    ({"model": nn.Sequential(nn.LazyLinear(3))}, "model has lazy parameters not yet materialised "
                                                 "(0.weight, 0.bias)"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS,
                         ids=[next(iter(o)) + "=" + repr(v)[:20] for o in (c[0] for c in BAD_OPTIONS)
                              for v in o.values()])
def test_bad_argument_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  options: dict[str, Any], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    args: dict[str, Any] = {"model": _net(), "log_dir": tmp_path / "log"} | options
    model = args.pop("model")
    count = hook_count(model) if isinstance(model, nn.Module) else None  # LazyLinear has its own
    with pytest.raises(HookscopeError) as caught:
        with hookscope.watch(model, args.pop("log_dir"), **args):
            pass
    assert type(caught.value) is HookscopeError and caught.value.__cause__ is None
    text = str(caught.value)
    assert "\n" not in text and text.startswith(message), text
    assert not (tmp_path / "log").exists()  # checked before the log directory is made
    assert count is None or hook_count(model) == count


def test_log_dir_a_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    with pytest.raises(HookscopeError, match="is a file, not a directory"):
        hookscope.watch(_net(), path).__enter__()
    assert path.read_text() == "x"


def _envelope(log_dir: Path) -> dict[str, Any]:
    return json.loads((log_dir / "watch.jsonl").read_text().splitlines()[0])


@pytest.mark.parametrize(("options", "field", "want"), [
    ({"layers": "2"}, "modules", ["2"]),
    ({"types": "Linear"}, "modules", ["0", "2"]),
    ({"layers": ("0", "2")}, "modules", ["0", "2"]),
    ({"allow_inf": "1"}, "allow_inf", ["1"]),
    ({"percentiles": 50}, "percentiles", [50.0]),
])
def test_single_string_is_one_name(tmp_path: Path, options: dict[str, Any], field: str,
                                   want: list[Any]) -> None:
    """A str is one pattern (not its characters); one number is one percentile."""
    with hookscope.watch(_net(), tmp_path, **options):
        pass
    envelope = _envelope(tmp_path)
    assert (envelope["selection"] if field == "modules" else envelope)[field] == want


def test_lazy_model_retry_works(tmp_path: Path) -> None:
    model = nn.Sequential(nn.LazyLinear(3))
    with pytest.raises(HookscopeError, match="run one forward pass"):
        with hookscope.watch(model, tmp_path):
            pass
    model(torch.randn(2, 5))  # materialised: the same directory, without force
    with hookscope.watch(model, tmp_path) as w:
        model(torch.randn(2, 5)).sum().backward()
        w.step()
    assert _envelope(tmp_path)["selection"]["modules"] == ["0"]


@pytest.mark.parametrize(("loss", "message"), [
    ("none", "loss must be a number or a one-element tensor, not a tensor of shape (6,) (reduction="),
    ("abc", "loss must be a number or a one-element tensor, not str 'abc'"),
    ([1.0], "loss must be a number or a one-element tensor, not list [1.0]"),
    (True, "loss must be a number or a one-element tensor, not bool True"),
    (1j, "loss must be a number or a one-element tensor, not complex 1j"),
])
def test_bad_loss_is_one_line_and_the_step_stays_open(tmp_path: Path, loss: Any,
                                                      message: str) -> None:
    model = _net()
    with hookscope.watch(model, tmp_path, every=1) as w:
        x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
        losses = nn.functional.cross_entropy(model(x), y, reduction="none")
        losses.mean().backward()
        with pytest.raises(HookscopeError) as caught:
            w.step(losses if loss == "none" else loss)
        assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
        w.step(losses.mean())  # the same step, ended with a good loss
        assert w.index == 1
    assert hook_count(model) == 0
    lines = (tmp_path / "watch.jsonl").read_text().splitlines()
    step = json.loads(lines[1])
    assert step["step"] == 0
    assert step["loss"] == float(losses.mean().detach())
