"""The hook engine: removal in every case, names bound per module, per-call indices."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import Hooks, Tracer, hook_count
from hookscope.core.select import find_site, select_sites


def handles_empty(model: nn.Module) -> bool:
    return all(
        not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
        and not m._backward_pre_hooks
        for m in model.modules()
    )


def test_hooks_removed_on_normal_exit_exception_and_interrupt(tiny_net) -> None:
    x = torch.randn(1, 3, 8, 8)
    with Hooks() as hooks:
        hooks.keep(tiny_net.conv1.register_forward_hook(lambda m, a, o: None))
        hooks.keep(tiny_net.fc.register_forward_pre_hook(lambda m, a: None))
        hooks.keep(tiny_net.fc.register_full_backward_hook(lambda m, gi, go: None))
        assert hook_count(tiny_net) == 3
    assert handles_empty(tiny_net)

    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with Tracer(tiny_net, select_sites(tiny_net)):
                tiny_net(x)
                raise exc
        assert handles_empty(tiny_net)


def test_tensor_hooks_removed() -> None:
    t = torch.ones(3, requires_grad=True)
    seen = []
    with Hooks() as hooks:
        hooks.keep(t.register_hook(lambda g: seen.append(g)))
        (t * 2).sum().backward()
    (t * 2).sum().backward()
    assert len(seen) == 1


def test_names_bound_per_module_not_late(tiny_net) -> None:
    seen: list[tuple[str, str]] = []

    def on_exit(call, args, kwargs, output):
        seen.append((call.name, type(call.site.module).__name__))

    with Tracer(tiny_net, select_sites(tiny_net), on_exit=on_exit):
        tiny_net(torch.randn(1, 3, 8, 8))
    named = dict(tiny_net.named_modules())
    assert all(type(named[name]).__name__ == kind for name, kind in seen)
    assert [n for n, _ in seen] == ["conv1", "relu", "block.0", "block.1", "relu", "pool", "fc"]


def test_call_index_restarts_each_forward(tiny_net) -> None:
    calls: list[tuple[str, int]] = []
    with Tracer(tiny_net, select_sites(tiny_net, layers=["relu"]),
                on_exit=lambda c, a, k, o: calls.append(c.key)):
        tiny_net(torch.randn(1, 3, 8, 8))
        tiny_net(torch.randn(1, 3, 8, 8))
    assert calls == [("relu", 0), ("relu", 1), ("relu", 0), ("relu", 1)]


def test_enter_sees_input_before_inplace_module_changes_it(tiny_net) -> None:
    mins: dict[str, float] = {}

    def on_enter(call, args, kwargs) -> None:
        mins[f"in{call.index}"] = float(args[0].min())

    def on_exit(call, args, kwargs, output) -> None:
        mins[f"out{call.index}"] = float(output.min())

    with torch.no_grad(), Tracer(tiny_net, select_sites(tiny_net, layers=["relu"]),
                                 on_enter=on_enter, on_exit=on_exit):
        tiny_net(torch.randn(1, 3, 8, 8))
    assert mins["in0"] < 0 and mins["out0"] == 0


def test_on_exit_can_replace_output(tiny_net) -> None:
    with torch.no_grad(), Tracer(tiny_net, select_sites(tiny_net, layers=["fc"]),
                                 on_exit=lambda c, a, k, o: torch.zeros_like(o)):
        out = tiny_net(torch.randn(2, 3, 8, 8))
    assert torch.count_nonzero(out) == 0


def test_innermost_after_crash() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 3), nn.Linear(4, 2)))
    tracer = Tracer(model, select_sites(model, all_modules=True))
    with pytest.raises(RuntimeError), tracer:
        model(torch.randn(1, 4))
    call = tracer.active[-1][0]  # the innermost call still running: the one that raised
    assert call.name == "0.1"
    assert hook_count(model) == 0


def test_selection_errors_suggest_names(tiny_net) -> None:
    with pytest.raises(HookscopeError, match="conv1"):
        select_sites(tiny_net, layers=["conv"])
    with pytest.raises(HookscopeError, match="Conv2d"):
        select_sites(tiny_net, types=["Conv2D"])
    with pytest.raises(HookscopeError, match="hookscope layers"):
        find_site(tiny_net, "blok.0")


def test_leaves_by_default_and_depth_cut(tiny_net) -> None:
    assert [s.name for s in select_sites(tiny_net)] == ["conv1", "relu", "block.0", "block.1",
                                                          "pool", "fc"]
    assert [s.name for s in select_sites(tiny_net, max_depth=1)] == ["conv1", "relu", "block",
                                                                      "pool", "fc"]


def test_no_reference_cycle_keeps_activations_alive() -> None:
    """A cycle in the hooks' bookkeeping (a recursive closure in ``tensors``) once kept every
    activation alive until the cyclic garbage collector ran, doubling peak memory."""
    import gc

    from torchvision.models import resnet18

    from hookscope import collect_stats

    model = resnet18().eval()
    x = torch.randn(1, 3, 64, 64)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        collect_stats(model, x, input_stats=True)
        gc.collect()
        leaked = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert leaked == []
