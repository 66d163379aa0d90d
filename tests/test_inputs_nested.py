"""Tensor files of nested structure (dicts of dicts, lists in dicts), 0-d tensors and
constants (numbers, bools, None) given to every sample as they are, and ``--as-is`` files
passed to the forward whole (1-D inputs with no sample dimension, a batch-second
``pack_padded_sequence`` input).

Statistics are checked against the same seeded model run in float64 by plain hooks, MACs
against ``FlopCounterMode`` on the same arguments.
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import FlopCounterMode

from tests.test_inputs_any import _module, assert_matches, one_line, run

MODELS = '''
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


class Nested(nn.Module):  # forward(x) of a dict of a dict and a list
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(5, 3)

    def forward(self, x):
        return self.a(x["one"]["p"]) + self.b(x["two"][0]) * x["two"][1]


class Scaled(nn.Module):  # a tensor and a 0-d scale
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, scale):
        return self.fc(x) * scale


class Options(nn.Module):  # keyword constants beside the tensor: a number, None, a flag
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, scale=1.0, mask=None, flip=False):
        assert isinstance(scale, float) and mask is None and flip is True, (scale, mask, flip)
        out = self.fc(x) * scale
        return -out if flip else out


class Encoded(nn.Module):  # keyword arguments, one of them a list of tensors
    def __init__(self):
        super().__init__()
        self.emb, self.fc = nn.Embedding(20, 4), nn.Linear(4, 3)

    def forward(self, parts, scale):
        h = self.emb(parts[0]) * parts[1].unsqueeze(-1)
        return self.fc(h.mean(1)) * scale[:, None]  # a number per item, stacked


class Encodings(torch.utils.data.Dataset):  # {"parts": [ids, mask], "scale", "label"} per item
    def __len__(self):
        return 5

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids, mask = torch.randint(0, 20, (6,), generator=g), torch.rand(6, generator=g)
        return {"parts": [ids, mask], "scale": 0.5 + i, "label": i % 3}


class Batched(nn.Module):  # forward(batch) of one dict, as a training loop's batch is
    def __init__(self):
        super().__init__()
        self.emb, self.fc = nn.Embedding(20, 4), nn.Linear(4, 3)

    def forward(self, batch):
        return self.fc((self.emb(batch["ids"]) * batch["mask"].unsqueeze(-1)).mean(1))


def texts():
    return [{"parts": [torch.zeros(6, dtype=torch.long), ["a"]], "scale": 1.0}]


class Flat(nn.Module):  # one 1-D input, no sample dimension
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 3)

    def forward(self, x):
        return self.fc(x)


class Packed(nn.Module):  # token ids (T, N), sequence first, and their lengths (N,)
    def __init__(self):
        super().__init__()
        self.emb, self.lstm, self.fc = nn.Embedding(30, 8), nn.LSTM(8, 6), nn.Linear(6, 2)

    def forward(self, ids, lengths):
        _, (h, _) = self.lstm(pack_padded_sequence(self.emb(ids), lengths))
        return self.fc(h[-1])
'''


def _models(tmp_path):
    path = tmp_path / "nested_models.py"
    path.write_text(MODELS)
    return path


def reference(path, name: str, args: tuple) -> dict:
    """Each leaf's (mean, std, min, max) of its output in float64, by plain hooks."""
    torch.manual_seed(0)
    model = getattr(_module(path), name)().double().eval()
    found: dict[str, tuple[float, ...]] = {}
    handles = [m.register_forward_hook(
        lambda m, i, o, n=n: found.__setitem__(n, (o.mean().item(), o.std().item(),
                                                   o.min().item(), o.max().item())))
        for n, m in model.named_modules() if n]
    with torch.no_grad():
        model(*pytree.tree_map(lambda t: t.double() if t.is_floating_point() else t, args))
    for h in handles:
        h.remove()
    return found


def recorded(model, names: tuple[str, ...]) -> dict:
    """Filled as ``model`` runs: each named child's (mean, std, min, max) of its output."""
    found: dict[str, tuple[float, ...]] = {}
    for name in names:
        getattr(model, name).register_forward_hook(lambda m, i, o, n=name: found.__setitem__(
            n, (o.mean().item(), o.std().item(), o.min().item(), o.max().item())))
    return found


def macs(path, name: str, args: tuple) -> int:
    """FlopCounterMode's MACs (half its FLOPs) of one forward on ``args``."""
    torch.manual_seed(0)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        getattr(_module(path), name)()(*args)
    return counter.get_total_flops() // 2


def test_a_nested_dict_file_runs_through_stats_and_layers(cli, tmp_path) -> None:
    models = _models(tmp_path)
    x = {"one": {"p": torch.randn(5, 4)}, "two": [torch.randn(5, 5), torch.randn(5, 1)]}
    torch.save((x,), tmp_path / "nested.pt")
    doc = run(cli, "stats", f"{models}:Nested", tmp_path / "nested.pt", "-b", "2")
    assert len(doc["predictions"]) == 5  # three batches: the same rows of every leaf
    assert_matches(doc, reference(models, "Nested", (x,)))
    layers = run(cli, "layers", f"{models}:Nested", tmp_path / "nested.pt")
    first = pytree.tree_map(lambda t: t[:1], x)
    assert layers["root"]["macs"] == macs(models, "Nested", (first,)) == 4 * 3 + 5 * 3


def test_a_0d_tensor_is_given_to_every_batch_as_it_is(cli, tmp_path) -> None:
    models = _models(tmp_path)
    x, scale = torch.randn(6, 4), torch.tensor(2.5)
    torch.save((x, scale), tmp_path / "scaled.pt")
    doc = run(cli, "stats", f"{models}:Scaled", tmp_path / "scaled.pt", "-b", "4")
    assert_matches(doc, reference(models, "Scaled", (x, scale)))
    workers = run(cli, "stats", f"{models}:Scaled", tmp_path / "scaled.pt", "-b", "4", "--workers", "2")
    assert workers["layers"] == doc["layers"]  # the 0-d tensor crosses to the worker processes
    layers = run(cli, "layers", f"{models}:Scaled", tmp_path / "scaled.pt")
    assert layers["root"]["calls"][0]["input_shapes"] == [[1, 4], []]
    assert layers["root"]["macs"] == macs(models, "Scaled", (x[:1], scale)) == 12


def test_numbers_and_none_in_a_file_are_given_to_every_batch_as_they_are(cli, tmp_path) -> None:
    models = _models(tmp_path)
    x = torch.randn(6, 4)
    torch.save({"x": x, "scale": 0.5, "mask": None, "flip": True}, tmp_path / "options.pt")
    doc = run(cli, "stats", f"{models}:Options", tmp_path / "options.pt", "-b", "4")
    assert len(doc["predictions"]) == 6
    torch.manual_seed(0)  # the reference: the same seeded model in float64, the same keywords
    model = _module(models).Options().double().eval()
    found = recorded(model, ("fc",))
    with torch.no_grad():
        model(x.double(), scale=0.5, mask=None, flip=True)
    assert_matches(doc, found)
    workers = run(cli, "stats", f"{models}:Options", tmp_path / "options.pt", "-b", "4",
                  "--workers", "2")
    assert workers["layers"] == doc["layers"]  # the constants cross to the worker processes
    whole = run(cli, "stats", f"{models}:Options", tmp_path / "options.pt", "--as-is")
    assert_matches(whole, found)
    torch.save({"x": x, "scale": 1j}, tmp_path / "complex.pt")
    layers = run(cli, "layers", f"{models}:Options", tmp_path / "options.pt")
    assert layers["root"]["calls"][0]["input_shapes"] == [[1, 4]]  # the tensors' shapes
    assert layers["root"]["macs"] == 4 * 3
    torch.save({"x": x, "scale": 1j}, tmp_path / "complex.pt")
    assert "complex.pt['scale']: is a complex" in one_line(
        cli("stats", f"{models}:Options", tmp_path / "complex.pt"))


def test_data_items_may_nest_tuples_lists_and_dicts(cli, tmp_path) -> None:
    models = _models(tmp_path)
    doc = run(cli, "stats", f"{models}:Encoded", "--data", f"{models}:Encodings", "-b", "2")
    assert len(doc["predictions"]) == 5
    items = [_module(models).Encodings()[i] for i in range(5)]
    parts = [torch.stack([it["parts"][0] for it in items]),
             torch.stack([it["parts"][1] for it in items]).double()]
    scale = torch.tensor([it["scale"] for it in items], dtype=torch.float64)
    torch.manual_seed(0)  # the reference: the same seeded model in float64, one batch
    model = _module(models).Encoded().double().eval()
    found = recorded(model, ("emb", "fc"))
    with torch.no_grad():
        model(parts, scale=scale)
    assert_matches(doc, found)
    assert "texts[0]['parts'][1][0]: is a string" in one_line(
        cli("stats", f"{models}:Encoded", "--data", f"{models}:texts"))


def test_a_dict_is_the_one_argument_of_a_forward_that_takes_none_of_its_keys(cli, tmp_path) -> None:
    models = _models(tmp_path)
    ids, mask = torch.randint(0, 20, (5, 6)), torch.rand(5, 6)
    torch.save({"ids": ids, "mask": mask}, tmp_path / "batch.pt")
    doc = run(cli, "stats", f"{models}:Batched", tmp_path / "batch.pt", "-b", "2")
    torch.manual_seed(0)
    model = _module(models).Batched().double().eval()
    found = recorded(model, ("emb", "fc"))
    with torch.no_grad():
        model({"ids": ids, "mask": mask.double()})
    assert_matches(doc, found)
    # Keys that name the forward's parameters stay keyword arguments (Encoded's parts, scale).
    torch.save({"parts": [ids, mask], "scale": torch.ones(5)}, tmp_path / "kw.pt")
    assert len(run(cli, "stats", f"{models}:Encoded", tmp_path / "kw.pt")["predictions"]) == 5


def test_as_is_passes_a_1d_input_and_a_batch_second_file_whole(cli, tmp_path) -> None:
    models = _models(tmp_path)
    flat = torch.randn(10)
    torch.save(flat, tmp_path / "flat.pt")
    doc = run(cli, "stats", f"{models}:Flat", tmp_path / "flat.pt", "--as-is")
    assert doc["inputs"] == [str(tmp_path / "flat.pt")]
    assert_matches(doc, reference(models, "Flat", (flat,)))
    ids, lengths = torch.randint(0, 30, (7, 5)), torch.tensor([7, 6, 6, 4, 3])
    torch.save((ids, lengths), tmp_path / "packed.pt")
    refused = one_line(cli("stats", f"{models}:Packed", tmp_path / "packed.pt"))
    assert "disagree on the number of samples" in refused and "--as-is" in refused
    layers = run(cli, "layers", f"{models}:Packed", tmp_path / "packed.pt", "--as-is")
    assert layers["root"]["params_total"] == 30 * 8 + 4 * 6 * (8 + 6 + 2) + 6 * 2 + 2
    rows = {row["name"]: row for row in layers["layers"]}
    assert rows["fc"]["calls"][0]["output_shape"] == [5, 2]
    assert rows["fc"]["macs"] == 5 * 6 * 2  # the last hidden state of every sequence
    # The LSTM by its formula: every packed step (the lengths' sum) runs 4 gates.
    assert rows["lstm"]["macs"] == int(lengths.sum()) * 4 * (8 * 6 + 6 * 6)


def test_malformed_nested_files_are_one_line(cli, tmp_path) -> None:
    models = _models(tmp_path)
    torch.save(({"one": {"p": "text"}},), tmp_path / "text.pt")
    assert "text.pt[0]['one']['p']: is a string" in one_line(
        cli("stats", f"{models}:Nested", tmp_path / "text.pt"))
    torch.save(({"one": {"p": torch.randn(3, 4)}, "two": [torch.randn(2, 5)]},), tmp_path / "uneven.pt")
    assert "disagree on the number of samples" in one_line(
        cli("layers", f"{models}:Nested", tmp_path / "uneven.pt"))
    torch.save((torch.tensor(1.0), torch.tensor(2.0)), tmp_path / "scalars.pt")
    assert "only 0-d tensors" in one_line(cli("stats", f"{models}:Scaled", tmp_path / "scalars.pt"))
