"""hookscope.probes.ablate and `hookscope ablate`: modified outputs against forward passes written
out by hand here, the batched sweep against a one-channel-at-a-time loop, and bad input."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count
from hookscope.probes.ablate import ablate, parse_channels, parse_mode, sweep

from .conftest import TinyNet

ARGS = ("--weights", "none", "--size", "64")


def manual(net: TinyNet, x: torch.Tensor, *, conv1=None, block0=None, relu1=None) -> torch.Tensor:
    """TinyNet's forward with optional edits of conv1's, block.0's or the second ReLU's output."""
    with torch.no_grad():
        a = net.conv1(x)
        if conv1 is not None:
            a = conv1(a.clone())
        b = net.block[0](torch.relu(a))
        if block0 is not None:
            b = block0(b.clone())
        r = torch.relu(net.block[1](b))
        if relu1 is not None:
            r = relu1(r.clone())
        return net.fc(net.pool(r).flatten(1))


def zero_channels(channels):
    def edit(t):
        t[:, channels] = 0
        return t
    return edit


def logits_of(tops) -> dict[int, float]:
    return {t.index: t.logit for t in tops}


def test_zero_every_channel_equals_hand_zeroed_layer(tiny_net):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 10)
    results = ablate(tiny_net, x, "block.0", channels="all", target="2")
    expected = manual(tiny_net, x, block0=torch.zeros_like)
    original = manual(tiny_net, x)
    for i, r in enumerate(results):
        assert r.channels == list(range(8)) and r.mode == "zero" and r.target == 2
        after = logits_of(r.after)  # TinyNet has 5 classes: the top 5 are all of them
        for c in range(5):
            assert after[c] == pytest.approx(float(expected[i, c]), abs=1e-5)
            assert logits_of(r.before)[c] == pytest.approx(float(original[i, c]), abs=1e-5)
        assert r.delta_logit == pytest.approx(float(expected[i, 2] - original[i, 2]), abs=1e-5)
        p, q = torch.softmax(original[i].double(), 0), torch.softmax(expected[i].double(), 0)
        assert r.delta_prob == pytest.approx(float(q[2] - p[2]), abs=1e-6)
        assert r.kl == pytest.approx(float((p * (p.log() - q.log())).sum()), abs=1e-6)
        assert [t.prob for t in r.after] == sorted((t.prob for t in r.after), reverse=True)
    assert hook_count(tiny_net) == 0


def test_modes_against_hand_edits(tiny_net):
    torch.manual_seed(1)
    x = torch.randn(1, 3, 8, 8)

    def mean_edit(t):
        t[:, [1, 4]] = t[:, [1, 4]].mean(dim=(2, 3), keepdim=True).expand_as(t[:, [1, 4]])
        return t

    def scale_edit(t):
        t[:, [1, 4]] *= 0.25
        return t

    for mode, edit in (("mean", mean_edit), ("scale:0.25", scale_edit),
                       ("zero", zero_channels([1, 4]))):
        (r,) = ablate(tiny_net, x, "conv1", channels="1,4", mode=mode, target="0")
        expected = manual(tiny_net, x, conv1=edit)
        assert logits_of(r.after)[0] == pytest.approx(float(expected[0, 0]), abs=1e-5), mode


def test_noise_is_seeded(tiny_net):
    x = torch.randn(1, 3, 8, 8)
    a = ablate(tiny_net, x, "conv1", mode="noise:0.5", seed=3)[0]
    b = ablate(tiny_net, x, "conv1", mode="noise:0.5", seed=3)[0]
    c = ablate(tiny_net, x, "conv1", mode="noise:0.5", seed=4)[0]
    assert a.after == b.after and a.after != c.after
    assert a.mode == "noise:0.5"
    zero = ablate(tiny_net, x, "conv1", mode="noise:0")[0]
    assert zero.delta_logit == pytest.approx(0.0, abs=1e-6)


def test_one_call_of_a_shared_module(tiny_net):
    x = torch.randn(1, 3, 8, 8)
    (r,) = ablate(tiny_net, x, "relu", channels="0-3", call=1, target="1")
    expected = manual(tiny_net, x, relu1=zero_channels([0, 1, 2, 3]))
    assert logits_of(r.after)[1] == pytest.approx(float(expected[0, 1]), abs=1e-5)
    with pytest.raises(HookscopeError, match="call 2 of relu never ran"):
        ablate(tiny_net, x, "relu", call=2)
    assert hook_count(tiny_net) == 0


def test_sweep_ranking_equals_one_channel_at_a_time(tiny_net):
    torch.manual_seed(2)
    x = torch.randn(2, 3, 9, 9)
    steps: list[int] = []
    results = sweep(tiny_net, x, "conv1", target="3", batch=3, on_step=steps.append)
    assert steps == [3, 3, 2, 3, 3, 2]  # 8 channels in batches of 3, for each input
    original = manual(tiny_net, x)
    for i, r in enumerate(results):
        drops = {c: float(original[i, 3] - manual(tiny_net, x, conv1=zero_channels([c]))[i, 3])
                 for c in range(8)}
        expected_order = sorted(drops, key=lambda c: -drops[c])
        assert [d.channel for d in r.ranking] == expected_order
        for d in r.ranking:
            assert d.drop == pytest.approx(drops[d.channel], abs=1e-5)
        # `after` is the top-ranked channel's run, and equals a plain ablation of it.
        (single,) = ablate(tiny_net, x[i:i + 1], "conv1", channels=[expected_order[0]],
                           target="3")
        assert r.delta_logit == pytest.approx(single.delta_logit, abs=1e-5)
        assert r.kl == pytest.approx(single.kl, abs=1e-6)
        assert r.ranking[0].kl == pytest.approx(single.kl, abs=1e-6)
    assert hook_count(tiny_net) == 0


class Mixes(nn.Module):
    """Its head concatenates the ablated layer's output with its input: a batch of one
    input cannot grow at the layer, so the sweep must fall back to copies."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 16 + 3 * 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.conv(x).flatten(1), x.flatten(1)], dim=1))


def test_a_sweep_runs_what_precedes_the_layer_once_per_pass(tiny_net):
    torch.manual_seed(3)
    x = torch.randn(2, 3, 9, 9)
    rows: list[int] = []
    handle = tiny_net.conv1.register_forward_hook(lambda m, a, out: rows.append(len(out)))
    results = sweep(tiny_net, x, "block.0", target="1", batch=3)
    handle.remove()
    # One pass of the batch, then per input ceil(8 / 3) = 3 passes of that one input.
    assert rows == [2] + [1] * 6
    original = manual(tiny_net, x)
    for i, r in enumerate(results):
        for d in r.ranking:
            hand = manual(tiny_net, x, block0=zero_channels([d.channel]))
            assert d.drop == pytest.approx(float(original[i, 1] - hand[i, 1]), abs=1e-5)
    torch.manual_seed(0)
    mixes = Mixes().eval()
    x = torch.randn(1, 3, 4, 4)
    (r,) = sweep(mixes, x, "conv", target="0", batch=4)
    with torch.no_grad():
        before = mixes(x)[0, 0]
        for d in r.ranking:
            a = mixes.conv(x).clone()
            a[:, d.channel] = 0
            after = mixes.fc(torch.cat([a.flatten(1), x.flatten(1)], dim=1))[0, 0]
            assert d.drop == pytest.approx(float(before - after), abs=1e-5)
    assert hook_count(mixes) == 0 and hook_count(tiny_net) == 0


def test_sweep_of_chosen_channels_with_mean_mode(tiny_net):
    x = torch.randn(1, 3, 8, 8)
    (r,) = sweep(tiny_net, x, "block.0", channels="2,5,6", mode="mean", batch=2)
    (single,) = ablate(tiny_net, x, "block.0", channels=[5], mode="mean")
    assert sorted(d.channel for d in r.ranking) == [2, 5, 6]
    five = next(d for d in r.ranking if d.channel == 5)
    assert -five.drop == pytest.approx(single.delta_logit, abs=1e-5)


def test_hooks_removed_and_state_kept_after_an_exception(tiny_net):
    def boom(module, args, output):
        raise RuntimeError("boom")

    handle = tiny_net.fc.register_forward_hook(boom)
    tiny_net.train()
    with pytest.raises(HookscopeError, match="forward pass failed"):
        ablate(tiny_net, torch.randn(1, 3, 8, 8), "conv1")
    handle.remove()
    assert hook_count(tiny_net) == 0 and tiny_net.training
    assert all(p.grad is None for p in tiny_net.parameters())


def test_parsing_errors():
    assert parse_channels("0,3-5, 9", 10) == [0, 3, 4, 5, 9]
    assert parse_mode("noise:0.1").value == 0.1 and parse_mode("ZERO").kind == "zero"
    for spec, message in (("10", "out of range"), ("3-1", "empty"), ("1,1", "twice"),
                          ("a", "not a channel")):
        with pytest.raises(HookscopeError, match=message):
            parse_channels(spec, 10)
    for spec, message in (("blur", "not a mode"), ("noise", "needs a value"),
                          ("scale:x", "not a number"), ("zero:1", "takes no value"),
                          ("noise:-1", "not negative")):
        with pytest.raises(HookscopeError, match=message):
            parse_mode(spec)
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    with pytest.raises(HookscopeError, match="no spatial dimensions"):
        ablate(net, torch.randn(1, 4), "0", mode="mean")
    with pytest.raises(HookscopeError, match="no channel dimension 2"):
        ablate(net, torch.randn(1, 4), "0", channel_dim=2)
    assert hook_count(net) == 0


# ---------------------------------------------------------------------------- CLI


def test_cli_zero_all_equals_hand_zeroed_resnet(cli, tmp_path):
    from hookscope.sources import load_model

    torch.manual_seed(5)
    x = torch.randn(3, 64, 64)
    path = tmp_path / "x.pt"
    torch.save(x, path)
    result = cli("ablate", "resnet18", path, "--weights", "none", "--layer", "layer4.1.conv2",
                 "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    (r,) = doc["results"]
    assert set(r) >= {"input", "layer", "channels", "mode", "target", "before", "after",
                      "delta_logit", "delta_prob", "kl"}
    assert r["channels"] == list(range(512)) and len(r["before"]) == 5
    assert set(r["before"][0]) == {"index", "label", "prob", "logit"}

    net = load_model("resnet18", weights="none", device="cpu").model
    with torch.no_grad():
        original = net(x[None])
        net.layer4[1].conv2.register_forward_hook(lambda m, a, out: torch.zeros_like(out))
        zeroed = net(x[None])
    for t in r["after"]:
        assert t["logit"] == pytest.approx(float(zeroed[0, t["index"]]), abs=1e-4)
    target = r["target"]
    assert target == int(original.argmax())
    assert r["delta_logit"] == pytest.approx(float(zeroed[0, target] - original[0, target]),
                                             abs=1e-4)


def test_cli_sweep_json_and_table(cli, cat_jpg):
    result = cli("ablate", "resnet18", cat_jpg, *ARGS, "--layer", "layer4.1.conv2",
                 "--channels", "0-39", "--sweep", "--sweep-batch", "16", "--format", "json")
    assert result.exit_code == 0, result.stderr
    (r,) = json.loads(result.stdout)["results"]
    drops = [d["drop"] for d in r["ranking"]]
    assert len(drops) == 40 and drops == sorted(drops, reverse=True)
    assert sorted(d["channel"] for d in r["ranking"]) == list(range(40))
    assert set(r["ranking"][0]) >= {"channel", "drop"}
    table = cli("ablate", "resnet18", cat_jpg, *ARGS, "--layer", "layer4.1.conv2",
                "--channels", "0-7", "--sweep", "--top", "3")
    assert table.exit_code == 0, table.stderr
    assert "top 3 of 8" in table.stdout and "before" in table.stdout
    csv_out = cli("ablate", "resnet18", cat_jpg, *ARGS, "--layer", "layer4", "--channels",
                  "1,2", "--mode", "scale:0", "--format", "csv")
    assert csv_out.exit_code == 0, csv_out.stderr
    lines = csv_out.stdout.splitlines()
    assert lines[0].startswith("input,layer,mode,channels") and '"1,2"' in lines[1]


@pytest.mark.parametrize("extra, message", [
    (("--layer", "layer4.9"), "hookscope layers"),
    (("--layer", "layer4", "--channels", "512"), "out of range"),
    (("--layer", "layer4", "--mode", "blur"), "not a mode"),
    (("--layer", "fc", "--mode", "mean"), "no spatial dimensions"),
    (("--layer", "layer4", "--target", "1,2"), "give one target for all inputs"),
])
def test_cli_bad_input(cli, cat_jpg, extra, message):
    result = cli("ablate", "resnet18", cat_jpg, *ARGS, *extra)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr
