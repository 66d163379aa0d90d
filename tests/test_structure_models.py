"""``layers`` on the kinds of models torchinfo's suite covers: parameters against torchinfo and
``sum(p.numel() for p in model.parameters())``, MACs against ``FlopCounterMode`` (with oneDNN
off, so recurrent kernels decompose into the matrix products it counts) and against numbers
worked out by hand; scripted parts, lazy layers, ``--no-forward`` and ``--train-mode``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hookscope.core.hooks import hook_count
from hookscope.probes.structure import model_structure, recurrent_macs
from tests import structure_models as sm

MODELS = Path(__file__).resolve().parent / "structure_models.py"


def _spec(name: str) -> str:
    return f"{MODELS}:{name}"


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def counter_macs(model: nn.Module, args: tuple) -> int:
    """MACs as plain ``FlopCounterMode`` counts them, oneDNN off (no fused recurrent kernel)."""
    with torch.backends.mkldnn.flags(enabled=False), torch.no_grad(), \
            FlopCounterMode(display=False) as counter:
        model(*args)
    return counter.get_total_flops() // 2


def torchinfo_params(model: nn.Module, args: tuple) -> int:
    torchinfo = pytest.importorskip("torchinfo")
    return torchinfo.summary(model, input_data=list(args), verbose=0).total_params


def _ids(*shape: int, high: int = 11) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(0))


CASES = {
    "two inputs": (sm.TwoInputs, lambda: (torch.randn(2, 3, 6, 6), torch.randn(2, 6))),
    "dict input": (sm.DictInput, lambda: ({"ids": _ids(2, 4), "values": torch.randn(2, 3)},)),
    "embedding + LSTM": (sm.Tagger, lambda: (_ids(2, 7, high=13),)),
    "packed GRU": (sm.Packed, lambda: (torch.randn(5, 3, 4), torch.tensor([5, 2, 3]))),
    "cells": (sm.Cells, lambda: (torch.randn(2, 4),)),
    "Conv1d": (sm.Signal, lambda: (torch.randn(2, 2, 16),)),
    "module list, shared, tied": (sm.Listed, lambda: (torch.randn(1, 3, 5, 5),)),
    "scripted part": (sm.PartlyScripted, lambda: (torch.randn(1, 3, 6, 6),)),
    "lazy": (sm.Lazy, lambda: (torch.randn(2, 3, 6, 6),)),
}


@pytest.mark.parametrize("case", CASES)
def test_params_and_macs_against_torchinfo_and_the_flop_counter(case: str) -> None:
    make, inputs = CASES[case]
    torch.manual_seed(0)
    model, args = make().eval(), inputs()
    found = model_structure(model, args)
    assert hook_count(model) == 0
    # Counted after the forward, which sizes lazy parameters.
    assert found.params == n_params(model)
    assert found.flops is not None and found.flops // 2 == counter_macs(model, args)
    torch.manual_seed(0)
    fresh = make().eval()
    if case not in ("module list, shared, tied", "scripted part"):  # torchinfo is wrong there
        assert torchinfo_params(fresh, args) == found.params


def test_torchinfo_counts_shared_tied_and_scripted_parameters_twice() -> None:
    """The two cases left out above, for the record: torchinfo adds a shared module's and a
    tied weight's parameters once per name, and a scripted block's twice."""
    torch.manual_seed(0)
    listed = sm.Listed().eval()
    shared, tied = 4 * 4 * 9 + 4, 6 * 4
    assert torchinfo_params(listed, (torch.randn(1, 3, 5, 5),)) > n_params(listed)
    assert model_structure(listed, torch.randn(1, 3, 5, 5)).params == \
        n_params(listed) == 3 * 4 + 4 + shared + 16 + tied + 6
    scripted = sm.PartlyScripted().eval()
    assert torchinfo_params(scripted, (torch.randn(1, 3, 6, 6),)) > n_params(scripted)


def test_lstm_macs_by_hand() -> None:
    """Tagger: ids (2, 7) -> 14 input vectors. Per vector, layer and direction of the LSTM
    (hidden 5, projection 3): 4 gates * 5 * (input + 3) for the two matrix products, plus
    3 * 5 for the projection; the second layer takes 3 * 2 = 6 inputs, as the first."""
    per_direction = 4 * 5 * (6 + 3) + 3 * 5
    assert per_direction == 195
    lstm = 14 * 2 * 2 * per_direction  # vectors, layers, directions
    tags = 14 * 6 * 4
    found = model_structure(sm.Tagger().eval(), _ids(2, 7, high=13))
    rows = {row.name: row for row in found.layers}
    assert rows["lstm"].macs == lstm == 10_920
    assert found.flops // 2 == lstm + tags
    assert rows["embed"].macs == 0 and rows["lstm"].macs_counted


def test_cells_and_packed_sequences_by_hand() -> None:
    rows = {r.name: r for r in model_structure(sm.Cells().eval(), torch.randn(2, 4)).layers}
    # Batch 2; an LSTMCell(4, 3) called three times; GRUCell(3, 2); RNNCell(2, 2).
    assert rows["lstm"].macs == 3 * 2 * 4 * 3 * (4 + 3) and len(rows["lstm"].calls) == 3
    assert rows["gru"].macs == 2 * 3 * 2 * (3 + 2)
    assert rows["rnn"].macs == 2 * 1 * 2 * (2 + 2)
    packed = model_structure(sm.Packed().eval(), (torch.randn(5, 3, 4), torch.tensor([5, 2, 3])))
    # Only the 5 + 2 + 3 real time steps are computed, not the padding.
    assert packed.flops // 2 == (5 + 2 + 3) * 3 * 3 * (4 + 3)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize(("layers", "bidirectional", "batch_first"),
                         [(1, False, False), (2, True, True), (3, True, False)])
def test_recurrent_formula_equals_the_decomposed_kernels(kind, layers, bidirectional,
                                                         batch_first) -> None:
    module = kind(5, 4, num_layers=layers, bidirectional=bidirectional,
                  batch_first=batch_first).eval()
    x = torch.randn(3, 2, 5)
    assert recurrent_macs(module, (x,)) == counter_macs(module, (x,))
    unbatched = torch.randn(6, 5)
    assert recurrent_macs(module, (unbatched,)) == counter_macs(module, (unbatched,))


def test_lstm_projection_formula_equals_the_decomposed_kernel() -> None:
    module = nn.LSTM(5, 4, num_layers=2, bidirectional=True, proj_size=2).eval()
    x = torch.randn(3, 2, 5)
    assert recurrent_macs(module, (x,)) == counter_macs(module, (x,))


def test_a_fused_recurrent_kernel_is_counted_by_formula_not_as_zero() -> None:
    """With oneDNN on, a large enough CPU LSTM runs ``aten.mkldnn_rnn_layer``, which the
    counter does not count (as cuDNN's ``_cudnn_rnn`` on a GPU)."""
    module = nn.LSTM(64, 64).eval()
    x = torch.randn(8, 32, 64)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(x)
    fused = counter.get_total_flops()
    found = model_structure(module, x)
    assert found.flops // 2 == 8 * 32 * 4 * 64 * (64 + 64) == counter_macs(module, (x,))
    assert fused < found.flops  # what the counter alone gives (0 where the kernel is fused)


def test_an_operation_without_a_formula_is_not_counted_rather_than_zero() -> None:
    found = model_structure(sm.Bilinear().eval(), torch.randn(1, 3, 4, 4))
    doc = found.to_dict()
    assert doc["totals"]["macs"] is None and doc["totals"]["macs_counted"] is False
    assert doc["totals"]["uncounted_ops"] == {"aten._trilinear": ["pair"]}
    rows = {row["name"]: row for row in doc["layers"]}
    assert rows["pair"]["macs"] is None and rows["pair"]["macs_counted"] is False
    assert rows["pair"]["calls"][0]["uncounted_ops"] == ["aten._trilinear"]
    assert rows["fc"]["macs"] == 4 * 3 and rows["fc"]["macs_counted"] is True
    assert doc["root"]["macs"] is None and doc["root"]["macs_own"] == 0


def test_scripted_parts_are_listed_not_hooked_and_counted_in_the_caller() -> None:
    torch.manual_seed(0)
    model = sm.PartlyScripted().eval()
    found = model_structure(model, torch.randn(1, 3, 6, 6))
    rows = {row.name: row for row in found.layers}
    assert found.scripted == ["block"] and hook_count(model) == 0
    assert rows["block"].scripted and rows["block.0"].scripted and not rows["stem"].scripted
    assert rows["block"].calls == [] and rows["block.0"].type == "Conv2d"
    assert rows["block"].params_total == 4 * 4 + 4
    # The scripted 1x1 convolution (4x4 on 4x4 pixels) runs in the model's own forward.
    assert found.root.macs_own == 4 * 4 * 4 * 4 and found.root.macs == found.flops // 2


def test_lazy_parameters_before_and_after_the_forward() -> None:
    model = sm.Lazy()
    before = model_structure(model).to_dict()
    assert before["forward"] is False and before["totals"]["params"] is None
    assert before["totals"]["uninitialised"] == ["conv.weight", "conv.bias", "norm.weight",
                                                 "norm.bias", "fc.weight", "fc.bias"]
    assert all(row["params"] is None for row in before["layers"])
    assert before["totals"]["macs"] is None and before["root"]["macs_counted"] is None
    after = model_structure(model, torch.randn(2, 3, 6, 6))
    assert after.params == n_params(model) == 3 * 4 * 9 + 4 + 2 * 4 + 4 * 2 + 2
    # Materialised as ordinary parameters, not inference tensors: the model still trains.
    assert not model.fc.weight.is_inference()
    model.train()(torch.randn(2, 3, 6, 6)).sum().backward()
    assert model.fc.weight.grad is not None


# ---------------------------------------------------------------------------- command line


def _layers(cli, *args: object) -> dict:
    result = cli("layers", *args, "--size", "8", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def test_cli_no_forward(cli) -> None:
    doc = _layers(cli, _spec("Lazy"), "--no-forward")
    assert doc["forward"] is False and doc["input_shape"] is None
    assert doc["totals"]["params"] is None and len(doc["totals"]["uninitialised"]) == 6
    assert all(row["calls"] == [] and row["macs"] is None for row in doc["layers"])
    norm = next(row for row in doc["layers"] if row["name"] == "norm")
    assert norm["buffers"] is None  # running statistics lazy too (num_batches_tracked is not)
    table = cli("layers", _spec("Lazy"), "--no-forward")
    assert table.exit_code == 0, table.stderr
    assert "uninitialised params" in table.stdout
    assert "no forward pass: shapes and MACs not measured" in table.stdout
    assert "no forward pass" in table.stderr


def test_cli_no_forward_keeps_resnet_counts(cli) -> None:
    from torchvision.models import resnet18

    doc = _layers(cli, "resnet18", "--weights", "none", "--no-forward")
    model = resnet18()
    assert doc["totals"]["params"] == n_params(model)
    assert doc["totals"]["buffers"] == sum(b.numel() for b in model.buffers())
    assert doc["totals"]["macs"] is None and doc["totals"]["macs_counted"] is None


@pytest.mark.parametrize("extra", [["tests/structure_models.py"], ["--train-mode"]])
def test_cli_no_forward_refuses_what_needs_a_forward(cli, extra) -> None:
    result = cli("layers", _spec("Lazy"), "--no-forward", *extra)
    assert result.exit_code == 2 and "--no-forward" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_train_mode_shows_the_training_structure(cli) -> None:
    rows = {r["name"]: r for r in _layers(cli, _spec("AuxHead"))["layers"]}
    assert rows["aux"]["calls"] == [] and rows["aux"]["macs"] == 0
    doc = _layers(cli, _spec("AuxHead"), "--train-mode")
    assert doc["train_mode"] is True
    rows = {r["name"]: r for r in doc["layers"]}
    # Two samples (BatchNorm needs more than one value per channel in training).
    assert [c["output_shape"] for c in rows["aux"]["calls"]] == [[2, 2]]
    assert rows["aux"]["macs"] == 2 * 4 * 2


def test_cli_scripted_part_in_layers_and_stats(cli, cat_jpg) -> None:
    doc = _layers(cli, _spec("PartlyScripted"))
    assert doc["totals"]["scripted"] == ["block"]
    # stem: 4x3x3x3 on 6x6 pixels; block (scripted 1x1, 4x4 on 6x6) counted in the model's
    # own code; head 4x2.
    assert doc["totals"]["macs"] == 4 * 27 * 36 + 16 * 36 + 8
    result = cli("stats", _spec("PartlyScripted"), cat_jpg, "--size", "8", "--format", "json",
                 "--all-modules")
    assert result.exit_code == 0, result.stderr
    assert "not hooked: 'block'" in result.stderr and "Traceback" not in result.stderr
    assert {row["name"] for row in json.loads(result.stdout)["layers"]} == {"stem", "head"}
    named = cli("stats", _spec("PartlyScripted"), cat_jpg, "--size", "8", "--layers", "block.0")
    assert named.exit_code == 2
    assert "error: --layers block.0 matches only modules inside TorchScript" in named.stderr


def test_cli_recurrent_and_not_counted(cli) -> None:
    doc = _layers(cli, _spec("RowReader"))
    rnn = next(row for row in doc["layers"] if row["name"] == "rnn")
    assert rnn["macs"] == 8 * 5 * (3 * 8 + 5)  # 8 rows of 24 values, hidden 5
    assert doc["totals"]["macs"] == rnn["macs"] + 5 * 2
    table = cli("layers", _spec("Bilinear"), "--size", "8")
    assert table.exit_code == 0, table.stderr
    assert "MACs not counted (no formula for aten._trilinear in pair)" in table.stdout
    pair = next(line for line in table.stdout.splitlines() if "pair" in line and "Bilinear" in line)
    assert "MACs not counted" in pair


@pytest.mark.parametrize("command", [["debug"], ["grads"], ["check"],
                                     ["features", "--type", "Conv2d"], ["gradcam"]])
def test_every_command_runs_a_partly_scripted_model(cli, cat_jpg, tmp_path, command) -> None:
    out = ["--out", tmp_path] if command[0] in ("features", "gradcam") else []
    result = cli(*command, _spec("PartlyScripted"), cat_jpg, "--size", "8", *out)
    assert result.exit_code == 0, result.stderr
    assert "not hooked: 'block'" in result.stderr and "Traceback" not in result.stderr


def test_cli_lazy_model_is_counted_after_its_forward(cli, cat_jpg) -> None:
    doc = _layers(cli, _spec("Lazy"))
    # conv 3->4 (3x3), BatchNorm 4, fc 4->2: sized by the 3-channel input.
    assert doc["totals"]["params"] == 3 * 4 * 9 + 4 + 2 * 4 + 4 * 2 + 2
    assert doc["totals"]["uninitialised"] == []
    assert {r["name"]: r["type"] for r in doc["layers"]}["fc"] == "Linear"
    result = cli("stats", _spec("Lazy"), cat_jpg, "--size", "8", "--train-mode")
    assert result.exit_code == 0, result.stderr


class _Vectors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mat = nn.Parameter(torch.randn(5, 3))

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return torch.dot(self.mat @ v, torch.ones(5)) + torch.addmv(torch.zeros(5), self.mat, v)


def test_matrix_vector_and_dot_products_are_counted() -> None:
    found = model_structure(_Vectors().eval(), torch.randn(3))
    # Two 5x3 matrix-vector products (matmul with a 1-D operand, addmv), a dot of length 5.
    assert found.flops // 2 == 2 * 5 * 3 + 5 and found.to_dict()["totals"]["macs_counted"]


def test_a_recurrent_input_given_by_keyword_is_counted() -> None:
    class Keyword(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.gru(input=x)[0]

    found = model_structure(Keyword().eval(), torch.randn(6, 2, 4))
    assert found.flops // 2 == 6 * 2 * 3 * 3 * (4 + 3)
