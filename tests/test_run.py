"""The one driver and the promises every analysis inherits from it: the model leaves as it
came (training flags, buffers, no hooks, no .grad), the analysis runs in eval mode unless
asked otherwise, and a model's failure is one error naming the module that raised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import hookscope
from hookscope.core.errors import ForwardError
from hookscope.core.hooks import hook_count
from hookscope.core.run import Probe, Step, drive
from hookscope.core.select import all_sites
from hookscope.probes.ablate import ablate, sweep
from hookscope.probes.features import feature_grids, feature_sites


class ModeSpy(nn.Module):
    """Records the training flag it runs with, and can raise on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.training)
        if self.fail:
            raise ValueError("spy says no")
        return x


class Net(nn.Module):
    """A classifier with BatchNorm, dropout and a spy in the middle of its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.drop = nn.Dropout(0.5)
        self.body = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1), ModeSpy(), nn.ReLU())
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.body(self.drop(self.bn(self.conv(x))))
        return self.fc(x.mean(dim=(2, 3)))

    @property
    def spy(self) -> ModeSpy:
        return self.body[1]  # type: ignore[return-value]


def x4() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(4, 3, 8, 8)


#: Every API function, called on (model, x).
API: dict[str, Callable[[nn.Module, torch.Tensor], Any]] = {
    "collect_stats": lambda m, x: hookscope.collect_stats(m, x),
    "run_debug": lambda m, x: _raise(hookscope.run_debug(m, x).failure),
    "model_structure": lambda m, x: hookscope.model_structure(m, x),
    "collect_grads": lambda m, x: hookscope.collect_grads(m, x),
    "gradcam": lambda m, x: hookscope.gradcam(m, x, "body.0"),
    "scorecam": lambda m, x: hookscope.gradcam(m, x, "body.0", method="scorecam"),
    "ablate": lambda m, x: ablate(m, x, "body.0", channels="0-2"),
    "sweep": lambda m, x: sweep(m, x, "body.0", batch=4),
    "features": lambda m, x: feature_grids(m, x, feature_sites(m, ["body.0"])),
}


def _raise(failure: ForwardError | None) -> None:
    """run_debug reports a failure instead of raising it (its trace is the output)."""
    if failure is not None:
        raise failure


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", list(API))
def test_model_in_train_mode_leaves_as_it_came_and_the_analysis_ran_in_eval(name: str) -> None:
    torch.manual_seed(1)
    model = Net().train()
    before = _state(model)
    API[name](model, x4())
    assert model.spy.seen and not any(model.spy.seen), "the analysis must run in eval mode"
    assert all(m.training for m in model.modules()), "training flags must be restored"
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert hook_count(model) == 0
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("name", list(API))
def test_a_crash_in_the_middle_names_the_module_and_leaves_the_model_alone(name: str) -> None:
    torch.manual_seed(1)
    model = Net().train()
    model.spy.fail = True
    with pytest.raises(ForwardError) as info:
        API[name](model, x4())
    error = info.value
    assert error.exit_code == 1
    assert (error.module, error.type_name) == ("body.1", "ModeSpy")
    assert error.input_shapes == [[4, 6, 8, 8]] or name in ("scorecam",)
    assert "body.1" in str(error) and "spy says no" in str(error)
    assert isinstance(error.cause, ValueError)
    assert all(m.training for m in model.modules())
    assert hook_count(model) == 0


def test_train_mode_runs_in_train_mode_and_restores_buffers() -> None:
    torch.manual_seed(2)
    model = Net().eval()
    before = _state(model)
    report = hookscope.collect_grads(model, x4(), train_mode=True)
    assert model.spy.seen == [True]
    assert report.layers  # BatchNorm used batch statistics and updated its buffers, then
    for key, value in model.state_dict().items():  # every buffer was put back
        assert torch.equal(value, before[key]), key
    assert not any(m.training for m in model.modules())


def test_batchnorm_in_train_mode_couples_batch_elements_only_with_train_mode() -> None:
    """The reason every analysis runs in eval mode: an ablation sweep's batch elements
    must not see each other through BatchNorm's batch statistics."""
    torch.manual_seed(3)
    model = Net().train()
    x = x4()
    batched = ablate(model, x, "conv", channels="0")
    single = [ablate(model, x[i:i + 1], "conv", channels="0")[0] for i in range(4)]
    for b, s in zip(batched, single, strict=True):
        assert b.delta_logit == pytest.approx(s.delta_logit, abs=1e-5)


class Counter(Probe[list[int]]):
    """Counts forward passes and batch sizes; fails on demand from a hook callback."""

    def __init__(self, model: nn.Module, fail_in_callback: BaseException | None = None) -> None:
        self.sites = [s for s in all_sites(model) if s.name == "fc"]
        self.sizes: list[int] = []
        self.fail = fail_in_callback

    def on_exit(self, call: Any, args: Any, kwargs: Any, output: Any) -> None:
        if self.fail is not None:
            raise self.fail

    def observe(self, step: Step, output: Any) -> None:
        self.sizes.append(len(step))

    def finish(self) -> list[int]:
        return self.sizes


def test_drive_streams_batches_and_reports_progress() -> None:
    model = Net()
    done: list[int] = []
    sizes = drive(model, [x4(), x4()[:3], (x4()[:1],)], Counter(model), progress=done.append)
    assert sizes == [4, 3, 1] and done == [4, 3, 1]


def test_a_probe_callback_error_is_not_blamed_on_the_model() -> None:
    """A closed pipe while printing a trace event is not the model's fault: it passes through
    as it is, so the command line can exit quietly."""
    model = Net()
    with pytest.raises(BrokenPipeError):
        drive(model, x4(), Counter(model, BrokenPipeError("reader left")))
    assert hook_count(model) == 0


def test_ctrl_c_passes_through_and_removes_hooks() -> None:
    model = Net()
    with pytest.raises(KeyboardInterrupt):
        drive(model, x4(), Counter(model, KeyboardInterrupt()))
    assert hook_count(model) == 0


def test_grad_modes_are_per_forward_pass() -> None:
    seen: list[tuple[bool, bool]] = []

    class Modes(Probe[None]):
        grad = "off"

        def step(self, step: Step) -> None:
            seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
            step.forward()
            step.forward(grad="inference")

        def on_exit(self, *args: Any) -> None:
            seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

        def finish(self) -> None:
            return None

    model = Net()
    probe = Modes()
    probe.sites = [s for s in all_sites(model) if s.name == "fc"]
    drive(model, x4(), probe)
    # outside a forward: the caller's mode; in the forwards: "off", then inference
    assert seen == [(True, False), (False, False), (False, True)]


class HookCounter(Probe[list[int]]):
    """Hooks one module and records how many forward hooks the whole model holds per pass."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.sites = hookscope.select_sites(model, layers=["fc"])
        self.seen: list[int] = []
        self.entered = 0

    def on_enter(self, call: Any, args: Any, kwargs: Any) -> None:
        self.entered += 1

    def observe(self, step: Step, output: Any) -> None:
        self.seen.append(sum(len(m._forward_hooks) for m in self.model.modules()))

    def finish(self) -> list[int]:
        return self.seen


def test_a_run_that_succeeds_hooks_only_the_selected_modules() -> None:
    """Success pays nothing for failure: one forward hook (on ``fc``), no locator."""
    model = Net()
    assert drive(model, [x4(), x4()], HookCounter(model)) == [1, 1]


def test_the_failing_pass_runs_again_with_the_locator_and_silent_callbacks() -> None:
    model = Net()
    model.spy.fail = True
    probe = HookCounter(model)
    probe.sites = hookscope.select_sites(model, layers=["conv"])
    with pytest.raises(ForwardError) as info:
        drive(model, x4(), probe)
    assert (info.value.module, info.value.call, info.value.input_shapes) == \
        ("body.1", 0, [[4, 6, 8, 8]])
    assert probe.entered == 1, "the second pass must not reach the probe"
    assert len(model.spy.seen) == 2 and hook_count(model) == 0


class FailsOnce(nn.Module):
    """Raises on its first call only: a failure that does not repeat."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def helper(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("only once")
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.helper(x)


def test_a_failure_that_does_not_repeat_is_named_from_the_traceback() -> None:
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.Sequential(FailsOnce()), nn.ReLU())
    with pytest.raises(ForwardError) as info:
        hookscope.collect_stats(model, x4())
    assert (info.value.module, info.value.type_name) == ("1.0", "FailsOnce")
    assert "only once" in str(info.value) and hook_count(model) == 0
