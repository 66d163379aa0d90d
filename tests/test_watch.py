"""``hookscope.watch``: the locator (forward, backward, allow_inf), the records against an
independent float64 computation, update ratios by hand, hooks gone in every ending."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import hookscope
from hookscope.core.hooks import hook_count

from .watch_logs import read_log

EPS32 = torch.finfo(torch.float32).eps


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


class Mask(nn.Module):
    """Adds an attention-style mask: -inf where attention is not allowed."""

    def __init__(self, width: int) -> None:
        super().__init__()
        mask = torch.zeros(width)
        mask[1] = float("-inf")
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mask


def positive_linear(n: int, m: int, seed: int = 0) -> nn.Linear:
    """A bias-free linear layer with positive weights: positive inputs stay positive."""
    torch.manual_seed(seed)
    layer = nn.Linear(n, m, bias=False)
    with torch.no_grad():
        layer.weight.abs_().add_(0.05)
    return layer


def log_model() -> nn.Module:
    model = nn.Sequential()
    model.add_module("pre", positive_linear(4, 6))
    model.add_module("blocks", nn.Sequential(nn.Identity(), nn.Identity(), Log()))
    model.add_module("post", nn.Linear(6, 3))
    model.add_module("out", nn.Tanh())
    return model


def batch(step: int, bad: int | None, *, n: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.rand(n, 4, generator=g) + 0.5
    if step == bad:
        x[0, :] = -x[0, :]  # the positive linear layer now gives negative values to log
    return x


def train(model: nn.Module, log_dir: Path, steps: int, *, bad: int | None = None,
          **options) -> hookscope.Watch:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with hookscope.watch(model, log_dir, **options) as w:
        for step in range(steps):
            loss = model(batch(step, bad)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss)
    return w


def no_hooks(model: nn.Module) -> bool:
    plain = hook_count(model) == 0
    params = all(not getattr(p, "_post_accumulate_grad_hooks", None) for p in model.parameters())
    return plain and params


# ----------------------------------------------------------------------------- the locator


def test_forward_locator_names_the_log_module_and_the_step(tmp_path: Path) -> None:
    model = log_model()
    with pytest.raises(hookscope.NonFiniteError) as caught:
        train(model, tmp_path, 10, bad=4, every=3)
    error = caught.value
    assert (error.module, error.phase, error.step, error.call) == ("blocks.2", "forward", 4, 0)
    assert error.type_name == "Log" and error.source == "module" and error.rank is None
    assert isinstance(error, hookscope.HookscopeError) and error.exit_code == 1
    # The modules after it (post, out) saw NaN too but are not blamed; the message is one line.
    message = str(error)
    assert "\n" not in message
    assert message.startswith("step 4, forward: blocks.2 (Log) produced NaN from finite inputs")
    # Its input: the positive layer's output, negative in the first row.
    (given,) = error.inputs
    assert given["shape"] == [5, 6] and given["min"] < 0 < given["max"]
    assert no_hooks(model)
    event = json.loads((tmp_path / "nonfinite.json").read_text())
    assert event["command"] == "watch" and event["event"]["module"] == "blocks.2"
    assert event["event"]["step"] == 4 and event["event"]["message"] == message
    steps = [s["step"] for s in event["steps"]]
    assert steps == [0, 1, 2, 3, 4]  # keep=8 holds every step so far
    last = {(r["name"], r["call"]): r for r in event["steps"][-1]["layers"]}
    assert last[("blocks.2", 0)]["min"] is None  # NaN, written as null
    assert last[("pre", 0)]["min"] < 0
    assert "rows" in event["steps"][3] and "rows" not in event["steps"][2]  # step 3 logged


def test_the_flight_recorder_keeps_the_last_k_steps(tmp_path: Path) -> None:
    with pytest.raises(hookscope.NonFiniteError):
        train(log_model(), tmp_path, 10, bad=6, keep=3)
    event = json.loads((tmp_path / "nonfinite.json").read_text())
    assert [s["step"] for s in event["steps"]] == [4, 5, 6]


def sqrt_model() -> nn.Module:
    model = nn.Sequential()
    model.add_module("pre", positive_linear(4, 4))
    model.add_module("root", Sqrt())
    model.add_module("head", nn.Linear(4, 2))
    return model


def test_backward_locator_names_sqrt_at_exactly_zero(tmp_path: Path) -> None:
    model = sqrt_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(model, tmp_path, every=2) as w:
            for step in range(6):
                x = torch.zeros(3, 4) if step == 3 else batch(step, None, n=3)
                out = model(x)
                assert torch.isfinite(out).all()  # finite forward, even at step 3
                out.sum().backward()
                opt.step()
                opt.zero_grad()
                w.step()
    error = caught.value
    assert (error.module, error.phase, error.step) == ("root", "backward", 3)
    assert error.type_name == "Sqrt" and error.source == "module"
    assert error.inputs[0]["min"] == 0.0 and error.inputs[0]["max"] == 0.0
    assert str(error).startswith("step 3, backward: root (Sqrt) produced ")
    assert no_hooks(model)


def attention_model() -> nn.Module:
    torch.manual_seed(1)
    model = nn.Sequential()
    model.add_module("scores", nn.Linear(4, 4))
    model.add_module("mask", Mask(4))
    model.add_module("softmax", nn.Softmax(dim=-1))
    model.add_module("head", nn.Linear(4, 2))
    return model


@pytest.mark.parametrize("allow", [(), ("mask",), ("m*",)])
def test_allow_inf_spares_an_attention_mask(tmp_path: Path, allow: tuple[str, ...]) -> None:
    model = attention_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def run() -> None:
        with hookscope.watch(model, tmp_path, every=1, allow_inf=allow, force=True) as w:
            for step in range(3):
                model(batch(step, None)).sum().backward()
                opt.step()
                opt.zero_grad()
                w.step()

    if allow:
        run()
        _, lines, event = read_log(tmp_path)
        assert len(lines) == 3 and event is None
    else:
        with pytest.raises(hookscope.NonFiniteError) as caught:
            run()
        assert (caught.value.module, caught.value.phase) == ("mask", "forward")
        assert "produced -inf from finite inputs" in str(caught.value)
    assert no_hooks(model)


def test_allow_inf_still_catches_nan(tmp_path: Path) -> None:
    model = log_model()
    with pytest.raises(hookscope.NonFiniteError) as caught:
        train(model, tmp_path, 4, bad=2, allow_inf=["blocks.*"])
    assert caught.value.module == "blocks.2"


def test_warn_goes_on_and_off_does_not_check(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    w = train(log_model(), tmp_path / "warn", 4, bad=1, nonfinite="warn", every=2)
    assert [(step, f.module) for step, _, f in w.findings][0] == (1, "blocks.2")
    assert any("step 1, forward: blocks.2 (Log)" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "warn" / "nonfinite.json").is_file()
    w = train(log_model(), tmp_path / "off", 4, bad=1, nonfinite="off", every=2)
    assert not w.findings and not (tmp_path / "off" / "nonfinite.json").exists()


def test_the_model_input_is_not_blamed_on_a_module(tmp_path: Path) -> None:
    model = sqrt_model()
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(model, tmp_path) as w:
            x = batch(0, None)
            x[0, 0] = float("nan")
            model(x).sum().backward()
            w.step()
    assert caught.value.module == "pre" and caught.value.source == "outside"
    assert "(the model's input)" in str(caught.value)


# ----------------------------------------------------------------------------- the records


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.fc1 = nn.Linear(6, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        h = self.act(self.fc2(h))  # the shared ReLU, second call
        return self.head(h)


def reference_rows(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Each call's output statistics and output gradient, in float64 with plain hooks."""
    double = Net().double()
    double.load_state_dict(model.state_dict())
    outputs: dict[tuple[str, int], torch.Tensor] = {}
    counts: dict[str, int] = {}
    handles = []
    for name, module in double.named_children():
        def hook(mod, args, out, name=name):
            call = counts.get(name, 0)
            counts[name] = call + 1
            out.retain_grad()
            outputs[(name, call)] = out
        handles.append(module.register_forward_hook(hook))
    loss = nn.functional.cross_entropy(double(x.double()), y)
    loss.backward()
    for h in handles:
        h.remove()
    return {key: (out.detach(), out.grad) for key, out in outputs.items()}


def test_a_logging_step_equals_an_independent_float64_computation(tmp_path: Path) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(9)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    expected = reference_rows(model, x, y)
    with hookscope.watch(model, tmp_path, every=5) as w:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        w.step(loss)
    envelope, lines, _ = read_log(tmp_path)
    assert envelope["every"] == 5 and envelope["selection"]["modules"] == ["fc1", "act", "fc2",
                                                                          "head"]
    (line,) = lines
    assert line["step"] == 0 and line["loss"] == pytest.approx(float(loss.detach()), rel=1e-6)
    rows = line["layers"]
    assert [(r["name"], r["call"]) for r in rows] == list(expected)
    for row in rows:
        out, grad = expected[(row["name"], row["call"])]
        n = out.numel()
        scale = float(out.abs().max())
        tol = 4 * n * EPS32 * scale + 1e-12  # a float32 sum of n terms drifts by n*eps*max|x|
        assert row["mean"] == pytest.approx(float(out.mean()), abs=tol)
        assert row["std"] == pytest.approx(float(out.std()), abs=tol + 1e-6 * float(out.std()))
        assert row["min"] == pytest.approx(float(out.min()), abs=8 * EPS32 * scale)
        assert row["max"] == pytest.approx(float(out.max()), abs=8 * EPS32 * scale)
        assert row["zero_fraction"] == float((out == 0).double().mean())
        assert row["nonfinite"] == 0 and row["grad_nonfinite"] == 0
        gscale = float(grad.abs().max())
        gtol = 4 * n * EPS32 * gscale + 1e-12
        assert row["grad_norm"] == pytest.approx(float(grad.norm()), rel=1e-5, abs=gtol)
        assert row["grad_mean"] == pytest.approx(float(grad.mean()), abs=gtol)
        assert row["grad_std"] == pytest.approx(float(grad.std()), rel=1e-5, abs=gtol)
        for key in ("type", "output_shape", "input_shapes", "output_shapes"):
            assert key in row
    assert row["drift"] == 0.0  # the first logging step is the reference


def test_update_ratio_and_grad_norm_by_hand(tmp_path: Path) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    snapshots, grads = {}, {}
    with hookscope.watch(model, tmp_path, every=3) as w:
        for step in range(7):
            torch.manual_seed(step)
            x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
            nn.functional.cross_entropy(model(x), y).backward()
            grads[step] = {n: p.grad.double().norm().item() for n, p in model.named_parameters()}
            opt.step()
            opt.zero_grad()
            snapshots[step] = {n: p.detach().double().clone() for n, p in model.named_parameters()}
            w.step()
    _, lines, _ = read_log(tmp_path)
    assert [line["step"] for line in lines] == [0, 3, 6]
    assert all(p["update_ratio"] is None for p in lines[0]["params"])
    for line, before in ((lines[1], 0), (lines[2], 3)):
        step = line["step"]
        for row in line["params"]:
            now, then = snapshots[step][row["name"]], snapshots[before][row["name"]]
            assert row["norm"] == pytest.approx(now.norm().item(), rel=1e-5)
            ratio = (now - then).norm().item() / now.norm().item()
            assert row["update_ratio"] == pytest.approx(ratio, rel=1e-4)
            assert row["grad_norm"] == pytest.approx(grads[step][row["name"]], rel=1e-5)


def test_drift_against_a_reference_flags_the_shifted_layer(tmp_path: Path) -> None:
    model = Net()
    x = torch.randn(32, 6)
    stats = hookscope.collect_stats(model, x)
    reference = tmp_path / "stats.json"
    reference.write_text(json.dumps({"command": "stats", **stats.to_dict()}))
    with hookscope.watch(model, tmp_path / "log", every=1, reference=reference,
                         max_drift=0.5) as w:
        for shift in (0.0, 10.0):
            model(x + shift).sum().backward()
            model.zero_grad()
            w.step()
    _, (same, shifted), _ = read_log(tmp_path / "log")
    assert all(r["drift"] == pytest.approx(0.0, abs=1e-5) for r in same["layers"])
    assert not same["flagged"]
    fc1 = shifted["layers"][0]
    base = stats.layers[0]
    want = max(abs(fc1["mean"] - base.mean) / max(abs(base.mean), base.std),
               abs(fc1["std"] - base.std) / base.std)
    assert fc1["drift"] == pytest.approx(want, rel=1e-6) and "drift" in fc1["flags"]
    assert {"name": "fc1", "call": 0, "flags": fc1["flags"]} in shifted["flagged"]


def test_quantile_drift_of_a_shifted_input_is_the_shift_in_stds(tmp_path: Path) -> None:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Identity(), nn.Linear(6, 2))
    x = torch.randn(4096, 6)
    stats = hookscope.collect_stats(model, x, percentiles=[1, 5, 25, 50, 75, 95, 99])
    reference = tmp_path / "stats.json"
    reference.write_text(json.dumps({"command": "stats", **stats.to_dict()}))
    with hookscope.watch(model, tmp_path / "log", every=1, reference=reference) as w:
        for shift in (0.0, 3.0):
            model(x + shift).sum().backward()
            model.zero_grad()
            w.step()
    envelope, (same, shifted), _ = read_log(tmp_path / "log")
    assert envelope["drift_measure"] == "quantile"
    assert set(shifted["layers"][0]["percentiles"]) == {"1", "5", "25", "50", "75", "95", "99"}
    # Every quantile moves by the shift, so the drift is shift / std of the reference; each
    # sketched quantile is within 1% of its value (the sketch's relative error), |q| <= 6.
    assert same["layers"][0]["drift"] == pytest.approx(0.0, abs=1e-9)
    assert shifted["layers"][0]["drift"] == pytest.approx(3.0 / float(x.std()), abs=0.12)
    assert "drift" in shifted["layers"][0]["flags"]


def test_the_default_reference_is_the_first_logging_step(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Identity(), nn.Linear(6, 2))
    torch.manual_seed(5)
    x = torch.randn(2048, 6)
    for percentiles, measure in (("1,5,25,50,75,95,99", "quantile"), (None, "mean_std")):
        folder = tmp_path / measure
        with hookscope.watch(model, folder, every=2, percentiles=percentiles) as w:
            for step in range(3):
                model(x + (2.0 if step == 2 else 0.0)).sum().backward()
                model.zero_grad()
                w.step()
        envelope, (first, later), _ = read_log(folder)
        assert envelope["drift_measure"] == measure and envelope["reference"] is None
        assert first["layers"][0]["drift"] == 0.0
        # A pure shift by 2: 2 / std in quantile drift (each sketched quantile within 1%);
        # the mean's change over max(|mean|, std) in mean/std drift.
        mean, std = float(x.mean()), float(x.std())
        want = 2.0 / std if measure == "quantile" else 2.0 / max(abs(mean), std)
        tol = 0.1 if measure == "quantile" else 1e-4
        assert later["layers"][0]["drift"] == pytest.approx(want, abs=tol)
        assert ("percentiles" in later["layers"][0]) == (measure == "quantile")


# ----------------------------------------------------------------------------- hooks, errors


@pytest.mark.parametrize("ending", ["normal", "error", "interrupt", "nonfinite"])
def test_every_hook_is_gone_and_the_model_untouched(tmp_path: Path, ending: str) -> None:
    model, twin = Net(), Net()
    model.train()
    model.fc2.eval()  # a mixed state, to see that nothing changes it
    kept: list[torch.Tensor] = []
    for m in (model, twin):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        watched = m is model
        try:
            with (hookscope.watch(m, tmp_path, every=2) if watched else
                  _null()) as w:
                for step in range(4):
                    torch.manual_seed(step)
                    out = m(torch.randn(4, 6))
                    if watched:
                        kept.append(out)
                    out.pow(2).mean().backward()
                    opt.step()
                    opt.zero_grad()
                    if ending == "error" and step == 2:
                        raise ValueError("boom")
                    if ending == "interrupt" and step == 2:
                        raise KeyboardInterrupt
                    if ending == "nonfinite" and step == 2 and watched:
                        m.fc1.weight.data[0, 0] = float("nan")
                    if w is not None:
                        w.step()
        except (ValueError, KeyboardInterrupt, hookscope.NonFiniteError):
            pass
    assert no_hooks(model)
    assert all(not t._backward_hooks for t in kept)
    assert model.training and not model.fc2.training and model.fc1.training
    if ending != "nonfinite":  # the same updates as without the watch
        for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
            assert torch.equal(p, q), name


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_validation_forwards_are_not_watched(tmp_path: Path) -> None:
    model = log_model()
    with hookscope.watch(model, tmp_path, every=1) as w:
        with torch.no_grad():
            model(batch(0, 0))  # NaN, but under no_grad: validation, not training
        model(batch(1, None)).sum().backward()
        w.step()
    _, (line,), _ = read_log(tmp_path)
    assert all(r["nonfinite"] == 0 for r in line["layers"])


def test_bad_arguments_are_one_clear_error(tmp_path: Path) -> None:
    model = Net()
    cases = [({"nonfinite": "loud"}, "nonfinite 'loud': choose one of raise, warn, off."),
             ({"every": 0}, "every must be a whole number of at least 1, not 0."),
             ({"keep": 1.5}, "keep must be a whole number"),
             ({"layers": ["nope"]}, "layers nope matches no module"),
             ({"reference": tmp_path / "missing.json"}, "not found")]
    for options, message in cases:
        with pytest.raises(hookscope.HookscopeError, match=None) as caught:
            hookscope.watch(model, tmp_path, **options)
        assert message in str(caught.value), str(caught.value)
    with hookscope.watch(model, tmp_path / "log") as w:
        pass
    with pytest.raises(hookscope.HookscopeError, match="already holds a watch log"):
        with hookscope.watch(model, tmp_path / "log"):
            pass
    with pytest.raises(hookscope.HookscopeError, match="outside the watch's"):
        w.step()
    assert no_hooks(model)


def test_the_package_root_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import hookscope, sys; hookscope.__version__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert callable(hookscope.watch) and issubclass(hookscope.NonFiniteError,
                                                    hookscope.HookscopeError)


def test_an_unended_step_is_checked_on_exit(tmp_path: Path) -> None:
    model = log_model()
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(model, tmp_path):
            model(batch(0, 0)).sum().backward()
    assert caught.value.step == 0 and math.isfinite(len(caught.value.inputs))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_off_steps_never_synchronise_inside_the_step(tmp_path: Path) -> None:
    model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 6, device="cuda"), torch.randint(0, 3, (8,), device="cuda")
    with hookscope.watch(model, tmp_path, every=100) as w:
        for step in range(4):
            # The step's work, hooks included, runs with every host synchronisation an error;
            # .step() reads the one flag of the step, so it runs outside that mode.
            if step:
                torch.cuda.set_sync_debug_mode("error")
            try:
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=False)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            w.step()
    assert no_hooks(model)


def test_tensorboard_scalars_are_the_logged_numbers(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookscope.watch(model, tmp_path, every=1, tensorboard=True) as w:
        for step in range(2):
            torch.manual_seed(step)
            loss = model(torch.randn(8, 6)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss)
    _, lines, _ = read_log(tmp_path)
    events = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0}).Reload()
    for line in lines:
        step = line["step"]
        got = {e.step: e.value for e in events.Scalars("layers/fc2/mean")}
        assert got[step] == pytest.approx(line["layers"][2]["mean"], rel=1e-6)
        got = {e.step: e.value for e in events.Scalars("params/fc1.weight/grad_norm")}
        assert got[step] == pytest.approx(line["params"][0]["grad_norm"], rel=1e-6)
        assert {e.step: e.value for e in events.Scalars("loss")}[step] == \
            pytest.approx(line["loss"], rel=1e-6)
    assert "params/head.bias" in events.Tags()["histograms"]
    assert no_hooks(model)


@pytest.mark.slow  # dynamo traces the model (seconds)
def test_a_compiled_model_is_watched_and_left_clean(tmp_path: Path) -> None:
    model = log_model()
    compiled = torch.compile(model, backend="eager")  # dynamo only: no C++ compiler needed
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(compiled, tmp_path, every=2) as w:
            for step in range(4):
                compiled(batch(step, 2)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                w.step()
    assert (caught.value.module, caught.value.step) == ("_orig_mod.blocks.2", 2)
    _, lines, _ = read_log(tmp_path)
    assert [r["name"] for r in lines[0]["layers"]][0] == "_orig_mod.pre"
    assert no_hooks(model)


def test_a_compiled_model_is_logged_under_its_own_class(tmp_path: Path) -> None:
    compiled = torch.compile(log_model(), backend="eager")  # nothing traced until it runs
    with hookscope.watch(compiled, tmp_path):
        pass
    envelope, _, _ = read_log(tmp_path)
    assert type(compiled).__name__ == "OptimizedModule"
    assert envelope["model"] == type(log_model()).__name__


class PassThrough(nn.Module):
    """Returns its input itself: its output is the tensor it was given."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Gate(nn.Module):
    """Code between modules (a functional log), then a module that passes it on, then one
    that masks NaN away: only the pass-through module's output shows the NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = positive_linear(4, 4)
        self.through = PassThrough()
        self.clean = nn.Hardtanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.through(torch.log(self.pre(x)))
        return self.clean(torch.nan_to_num(h))


def test_a_value_made_outside_the_modules_is_caught_where_a_module_returns_it(
        tmp_path: Path) -> None:
    model = Gate()
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(model, tmp_path) as w:
            model(batch(0, 0)).sum().backward()
            w.step()
    # The model's own code made it, between pre and through (issue 28: blame by production).
    assert (caught.value.module, caught.value.source) == ("", "code")
    assert "the model (Gate) made NaN in its own code (between its children pre and through) " \
        "from finite inputs" in str(caught.value)
