"""The Lightning and Hugging Face callbacks write the same log as ``hookscope.watch`` around a
hand-written loop on the same model, data and optimiser: the same rows and fields, and the
same numbers (float32 training, compared within a few float32 roundings)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hookscope
from hookscope.core.hooks import hook_count

from .watch_logs import read_log

pytestmark = pytest.mark.slow  # each imports a training framework (seconds)

VALUES = ("mean", "std", "min", "max", "zero_fraction", "nonfinite", "grad_norm", "grad_mean",
          "grad_std", "grad_nonfinite")


def assert_same_lines(a: list[dict], b: list[dict], *, steps: list[int]) -> None:
    assert [line["step"] for line in a] == steps == [line["step"] for line in b]
    for x, y in zip(a, b, strict=True):
        assert set(x) - {"loss"} == set(y) - {"loss"}
        assert [(r["name"], r["call"]) for r in x["layers"]] == \
            [(r["name"], r["call"]) for r in y["layers"]]
        for r, s in zip(x["layers"], y["layers"], strict=True):
            assert set(r) == set(s)
            for key in VALUES:
                if isinstance(s[key], float):
                    assert r[key] == pytest.approx(s[key], rel=1e-4, abs=1e-6), (r["name"], key)
                else:
                    assert r[key] == s[key], (r["name"], key)
        assert [p["name"] for p in x["params"]] == [p["name"] for p in y["params"]]
        for p, q in zip(x["params"], y["params"], strict=True):
            assert p["norm"] == pytest.approx(q["norm"], rel=1e-5)
            assert p["grad_norm"] == pytest.approx(q["grad_norm"], rel=1e-4, abs=1e-7)


# ----------------------------------------------------------------------------- Lightning


def test_lightning_callback_writes_what_the_context_manager_writes(tmp_path) -> None:
    lightning = pytest.importorskip("lightning")
    from hookscope.integrations.lightning import WatchCallback

    class Tiny(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 5), torch.randint(0, 3, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    module = Tiny()
    callback = WatchCallback(log_dir=tmp_path / "lightning", every=2)
    trainer = lightning.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, callbacks=[callback],
                                default_root_dir=tmp_path)
    trainer.fit(module, loader)
    assert hook_count(module) == 0 and callback.watch is None

    by_hand = Tiny()
    opt = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    with hookscope.watch(by_hand, tmp_path / "by-hand", every=2) as w:
        for x, y in loader:
            loss = nn.functional.cross_entropy(by_hand(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss)
    _, lines, _ = read_log(tmp_path / "lightning")
    _, expected, _ = read_log(tmp_path / "by-hand")
    assert_same_lines(lines, expected, steps=[0, 2])
    assert lines[0]["loss"] == pytest.approx(expected[0]["loss"], rel=1e-6)


def test_lightning_callback_removes_its_hooks_when_training_fails(tmp_path) -> None:
    lightning = pytest.importorskip("lightning")
    from hookscope.integrations.lightning import WatchCallback

    class Failing(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(5, 3)

        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                raise ValueError("boom")
            return self.fc(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(16, 5))
    module = Failing()
    trainer = lightning.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=tmp_path,
                                callbacks=[WatchCallback(log_dir=tmp_path / "log", every=1)])
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    assert hook_count(module) == 0


# ----------------------------------------------------------------------------- transformers


def tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=24,
                                     max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def test_transformers_callback_writes_what_the_context_manager_writes(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    from hookscope.integrations.transformers import WatchCallback

    torch.manual_seed(2)
    ids = torch.randint(1, 40, (8, 10))
    labels = torch.randint(0, 2, (8,))
    rows = [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": label}
            for i, label in zip(ids, labels, strict=True)]
    model = tiny_bert()
    # Learning rate 0: parameter rows are taken after the optimiser step, and the loop by hand
    # below takes none.
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=8,
        learning_rate=0.0, lr_scheduler_type="constant", report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0)
    callback = WatchCallback(log_dir=tmp_path / "hf", every=1)
    with callback:
        transformers.Trainer(model=model, args=args, train_dataset=rows,
                             callbacks=[callback]).train()
    assert hook_count(model) == 0 and callback.watch is None

    by_hand = tiny_bert()
    by_hand.train()
    with hookscope.watch(by_hand, tmp_path / "by-hand", every=1) as w:
        out = by_hand(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
        out.loss.backward()
        by_hand.zero_grad()
        w.step()
    _, lines, _ = read_log(tmp_path / "hf")
    _, expected, _ = read_log(tmp_path / "by-hand")
    # The Trainer shuffles the batch: the same samples in another order, so the statistics
    # agree within rounding.
    assert_same_lines(lines, expected, steps=[0])


def test_the_transformers_callback_as_a_context_manager_cleans_up_a_failure(tmp_path) -> None:
    pytest.importorskip("transformers")
    from hookscope.integrations.transformers import WatchCallback

    model = tiny_bert()
    with pytest.raises(RuntimeError, match="boom"):
        with WatchCallback(log_dir=tmp_path, every=1) as callback:
            callback.on_train_begin(None, None, None, model=model)
            assert hook_count(model) > 0
            raise RuntimeError("boom")
    assert hook_count(model) == 0
