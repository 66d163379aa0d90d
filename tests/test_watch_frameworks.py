"""The Lightning and Hugging Face callbacks write the same log as ``hookscope.watch`` around a
hand-written loop on the same model, data and optimiser (float32 training, compared within a
few float32 roundings), one step per optimiser step under gradient accumulation, with the loss;
they take the watch's options as named parameters (a ``LightningCLI`` YAML config) and remove
every hook when training fails. A ``GradScaler``'s scale is divided out of the logged
gradients and its skipped steps are marked, not failed; two watches around a GAN."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

import hookscope
from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count

from .watch_logs import read_log

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


# ----------------------------------------------------------------------------- the options


def test_the_callbacks_take_the_watch_options_as_a_real_signature() -> None:
    from hookscope.integrations import Watching

    watch = inspect.signature(hookscope.watch)
    mine = inspect.signature(Watching)
    assert list(mine.parameters) == [p for p in watch.parameters if p not in ("model", "scaler")]
    for name, p in mine.parameters.items():
        assert p.default == watch.parameters[name].default and p.kind == watch.parameters[name].kind
        assert not isinstance(p.annotation, str), name  # evaluated, as jsonargparse needs
    assert Watching("runs", every=3).options == {"log_dir": "runs", "every": 3}
    with pytest.raises(HookscopeError, match="unexpected keyword argument 'logdir'"):
        Watching("runs", logdir="runs")
    with pytest.raises(HookscopeError, match="missing a required argument: 'log_dir'"):
        Watching(every=3)


# ----------------------------------------------------------------------------- AMP


def amp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def test_a_grad_scaler_is_divided_out_and_its_skipped_step_marked_not_failed(tmp_path) -> None:
    model, twin = amp_model(), amp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    # A power-of-two scale multiplies every gradient exactly in float32 (no overflow, no
    # underflow here), so the unscaled values equal the twin's up to the last bit.
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    torch.manual_seed(1)
    batches = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(4)]
    grad_norms = []
    with hookscope.watch(model, tmp_path / "amp", every=1, scaler=scaler) as w, \
            hookscope.watch(twin, tmp_path / "twin", every=1) as t:
        for step, (x, y) in enumerate(batches):
            loss = nn.functional.cross_entropy(model(x), y)
            # Step 1: the scaled loss overflows, its gradients are inf: the scaler skips.
            scaler.scale(loss * (1e36 if step == 1 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            w.step(loss)
            twin_loss = nn.functional.cross_entropy(twin(x), y)
            twin_loss.backward()
            grad_norms.append([float(p.grad.norm()) for p in twin.parameters()])
            if step != 1:  # the twin skips the same step
                twin_opt.step()
            twin_opt.zero_grad()
            t.step(twin_loss)
    assert hook_count(model) == 0
    _, lines, event = read_log(tmp_path / "amp")
    _, expected, _ = read_log(tmp_path / "twin")
    assert event is None  # the skipped step's inf gradients are the scaler's business
    assert [line["scale"] for line in lines] == [1024.0, 1024.0, 512.0, 512.0]
    assert [line["skipped"] for line in lines] == [False, True, False, False]
    assert "nonfinite" in lines[1]["layers"][0]["flags"]  # the rows still tell the truth
    kept = [{k: v for k, v in lines[i].items() if k not in ("scale", "skipped")} for i in (0, 2, 3)]
    assert_same_lines(kept, [expected[i] for i in (0, 2, 3)], steps=[0, 2, 3])
    for line in kept:
        assert [p["grad_norm"] for p in line["params"]] == \
            pytest.approx(grad_norms[line["step"]], rel=1e-6)
    assert [p["update_ratio"] for p in lines[1]["params"]] == [0.0] * 4  # not stepped


def test_under_a_scaler_a_nan_made_in_the_forward_still_fails(tmp_path) -> None:
    model = amp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with pytest.raises(hookscope.NonFiniteError) as caught:
        with hookscope.watch(model, tmp_path, scaler=scaler) as w:
            for step in range(4):
                if step == 2:
                    with torch.no_grad():
                        model[2].weight[0, 0] = float("nan")
                loss = nn.functional.cross_entropy(model(torch.randn(8, 6)), torch.zeros(8).long())
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
                w.step(loss)
    assert scaler.get_scale() == 512.0  # the scaler skipped step 2 too
    assert (caught.value.step, caught.value.module, caught.value.phase) == (2, "2", "forward")
    assert hook_count(model) == 0


def test_a_scaler_must_be_one(tmp_path) -> None:
    with pytest.raises(HookscopeError, match="scaler must be a torch.amp.GradScaler, not float"):
        hookscope.watch(amp_model(), tmp_path, scaler=1024.0)


# ----------------------------------------------------------------------------- a GAN


def test_a_gan_under_two_watches_as_docs_watch_md_describes(tmp_path) -> None:
    torch.manual_seed(0)
    net_g = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))
    net_d = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1), nn.Sigmoid())
    opt_d = torch.optim.SGD(net_d.parameters(), lr=0.05)
    opt_g = torch.optim.SGD(net_g.parameters(), lr=0.05)
    bce = nn.BCELoss()
    outputs, used = [], []
    with hookscope.watch(net_d, tmp_path / "d", every=1) as wd, \
            hookscope.watch(net_g, tmp_path / "g", every=1) as wg:
        for _ in range(3):
            real, noise = torch.randn(5, 6), torch.randn(5, 4)
            net_d.zero_grad()
            out_real = net_d(real)
            bce(out_real, torch.ones(5, 1)).backward()
            fake = net_g(noise)
            out_fake = net_d(fake.detach())
            bce(out_fake, torch.zeros(5, 1)).backward()
            used.append([float(p.grad.norm()) for p in net_d.parameters()])
            opt_d.step()
            wd.step()
            outputs += [out_real.detach(), out_fake.detach()]
            net_g.zero_grad()
            out_g = net_d(fake)  # netD's third call: in netD's next step
            bce(out_g, torch.ones(5, 1)).backward()
            opt_g.step()
            wg.step()
            outputs.append(out_g.detach())
    _, d_lines, _ = read_log(tmp_path / "d")
    _, g_lines, _ = read_log(tmp_path / "g")
    assert [line["step"] for line in g_lines] == [0, 1, 2]
    # netD's last pass, the generator's, is a step of its own, ended when its block ends.
    assert [line["step"] for line in d_lines] == [0, 1, 2, 3]
    # One row per module: its calls in a step are merged.
    assert [(r["name"], r["call"]) for r in d_lines[1]["layers"]] == [(str(i), 0) for i in range(4)]
    # Step 1 of netD holds the generator's pass of step 0 and its own two (float32 sums of
    # 15 values in (0, 1): a few roundings).
    for step, passes in ((0, outputs[0:2]), (1, outputs[2:5]), (3, outputs[8:])):
        merged, row = torch.cat(passes).double(), d_lines[step]["layers"][3]
        assert row["mean"] == pytest.approx(float(merged.mean()), rel=1e-5)
        assert row["max"] == pytest.approx(float(merged.max()), rel=1e-6)
    # Its parameters' gradient norms are those optimizerD used (zeroed before errD_real).
    for line in d_lines[:3]:
        assert [p["grad_norm"] for p in line["params"]] == pytest.approx(used[line["step"]], rel=1e-6)


# ----------------------------------------------------------------------------- Lightning


def lightning_module(nan_batch: int | None = None, overflow_batch: int | None = None):
    lightning = pytest.importorskip("lightning")

    class Tiny(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))

        def training_step(self, batch, batch_idx):
            x, y = batch
            if batch_idx == nan_batch:
                x = x * float("nan")
            loss = nn.functional.cross_entropy(self.net(x), y)
            return loss * 1e36 if batch_idx == overflow_batch else loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return lightning, Tiny()


def loader():
    torch.manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 5), torch.randint(0, 3, (32,)))
    return torch.utils.data.DataLoader(data, batch_size=4)


def fit(lightning, module, log_dir, accumulate: int = 2, **options):
    from hookscope.integrations.lightning import WatchCallback

    trainer = lightning.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, accumulate_grad_batches=accumulate,
                                callbacks=[WatchCallback(log_dir=log_dir, **options)],
                                default_root_dir=log_dir.parent)
    trainer.fit(module, loader())
    return trainer.callbacks


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
def test_lightning_counts_optimiser_steps(tmp_path, accumulate: int) -> None:
    lightning, module = lightning_module()
    by_hand = copy.deepcopy(module)
    callbacks = fit(lightning, module, tmp_path / "lightning", accumulate, every=1)
    assert hook_count(module) == 0 and all(getattr(c, "watch", None) is None for c in callbacks)

    opt = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    losses, micro = [], []
    with hookscope.watch(by_hand, tmp_path / "by-hand", every=1) as w:
        for i, (x, y) in enumerate(loader()):
            loss = nn.functional.cross_entropy(by_hand.net(x), y)
            (loss / accumulate).backward()
            micro.append(float(loss.detach()))
            if (i + 1) % accumulate == 0:  # an optimiser step
                opt.step()
                opt.zero_grad()
                losses.append(sum(micro) / accumulate)
                micro = []
                w.step(losses[-1])
    _, lines, _ = read_log(tmp_path / "lightning")
    _, expected, _ = read_log(tmp_path / "by-hand")
    assert_same_lines(lines, expected, steps=list(range(8 // accumulate)))
    assert [line["loss"] for line in lines] == pytest.approx(losses, rel=1e-6)
    for line in lines[1:]:  # every logged step is a whole optimiser step: the weights moved
        assert all(p["update_ratio"] > 0 for p in line["params"])


@pytest.mark.slow
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


@pytest.mark.slow
def test_lightning_names_the_optimiser_step_of_a_nan(tmp_path) -> None:
    lightning, module = lightning_module(nan_batch=6)  # batches 6 and 7: optimiser step 3
    with pytest.raises(hookscope.NonFiniteError) as caught:
        fit(lightning, module, tmp_path / "log", every=10)  # accumulating 2 batches
    assert caught.value.step == 3
    assert hook_count(module) == 0


def cli_module():
    lightning = pytest.importorskip("lightning")

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def train_dataloader(self):
            return loader()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Module


@pytest.mark.slow
def test_lightning_cli_configures_the_callback_from_yaml(tmp_path) -> None:
    pytest.importorskip("lightning")
    cli = pytest.importorskip("lightning.pytorch.cli")
    assert cli._JSONARGPARSE_SIGNATURES_AVAILABLE, "the test extra installs jsonargparse[signatures]"
    config = tmp_path / "config.yaml"
    config.write_text(f"""\
trainer:
  max_steps: 4
  accumulate_grad_batches: 2
  accelerator: cpu
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path}
  callbacks:
    - class_path: hookscope.integrations.lightning.WatchCallback
      init_args:
        log_dir: {tmp_path / "log"}
        every: 2
        layers: ["net.*"]
""")
    cli.LightningCLI(cli_module(), args=["fit", "--config", str(config)],
                     save_config_kwargs={"overwrite": True})
    envelope, lines, _ = read_log(tmp_path / "log")
    assert envelope["every"] == 2 and envelope["selection"]["layers"] == ["net.*"]
    assert [line["step"] for line in lines] == [0, 2]  # four optimiser steps, eight batches


# ----------------------------------------------------------------------------- transformers


def tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=24,
                                     max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


@pytest.mark.slow
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


@pytest.mark.slow
def test_transformers_counts_optimiser_steps_and_logs_the_loss(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    from hookscope.integrations.transformers import WatchCallback

    torch.manual_seed(2)
    ids = torch.randint(1, 40, (16, 10))
    labels = torch.randint(0, 2, (16,))
    rows = [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": label}
            for i, label in zip(ids, labels, strict=True)]
    model = tiny_bert()
    # Learning rate 0: the loop by hand below takes no optimiser step.
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, train_sampling_strategy="sequential",
        learning_rate=0.0, lr_scheduler_type="constant", report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0)
    callback = WatchCallback(log_dir=tmp_path / "hf", every=1)
    with callback:
        transformers.Trainer(model=model, args=args, train_dataset=rows,
                             callbacks=[callback]).train()
    assert hook_count(model) == 0

    by_hand = tiny_bert()
    by_hand.train()
    losses = []
    with hookscope.watch(by_hand, tmp_path / "by-hand", every=1) as w:
        for step in range(2):
            micro = []
            for half in range(2):
                at = slice(8 * step + 4 * half, 8 * step + 4 * half + 4)
                out = by_hand(input_ids=ids[at], attention_mask=torch.ones_like(ids[at]),
                              labels=labels[at])
                # The Trainer takes BERT (whose forward takes **kwargs) for a model that divides
                # its loss by the step's item count, so it neither divides the loss by the
                # accumulation nor averages what it logs: the loop by hand does the same.
                out.loss.backward()
                micro.append(float(out.loss.detach()))
            by_hand.zero_grad()
            losses.append(sum(micro))
            w.step(losses[-1])
    _, lines, _ = read_log(tmp_path / "hf")
    _, expected, _ = read_log(tmp_path / "by-hand")
    assert_same_lines(lines, expected, steps=[0, 1])
    assert [line["loss"] for line in lines] == pytest.approx(losses, rel=1e-5)


@pytest.mark.slow
def test_lightning_takes_the_precision_plugin_s_scaler(tmp_path) -> None:
    lightning, module = lightning_module(overflow_batch=1)
    from lightning.pytorch.plugins import MixedPrecision

    from hookscope.integrations.lightning import WatchCallback

    by_hand = copy.deepcopy(module)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    trainer = lightning.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=tmp_path,
                                plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
                                callbacks=[WatchCallback(log_dir=tmp_path / "log", every=1)])
    trainer.fit(module, loader())  # the overflowing step is skipped, not a failure
    _, lines, event = read_log(tmp_path / "log")
    assert event is None
    assert [(line["scale"], line["skipped"]) for line in lines] == \
        [(1024.0, False), (1024.0, True), (512.0, False), (512.0, False)]
    x, y = next(iter(loader()))
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.cross_entropy(by_hand.net(x), y)
    (loss * 1024.0).backward()  # as the scaler scales it: then divided, exactly
    assert [p["grad_norm"] for p in lines[0]["params"]] == \
        pytest.approx([float(p.grad.norm()) / 1024.0 for p in by_hand.parameters()], rel=1e-6)


@pytest.mark.slow
def test_transformers_takes_the_accelerated_optimiser_s_scaler(tmp_path) -> None:
    pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    from hookscope.integrations.transformers import WatchCallback

    model = tiny_bert()
    scaler = torch.amp.GradScaler("cpu")
    accelerate.Accelerator(cpu=True)  # fp16 on a CPU gives no scaler: the optimiser is given one
    try:
        optimizer = accelerate.optimizer.AcceleratedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), device_placement=False, scaler=scaler)
        with WatchCallback(log_dir=tmp_path, every=1) as callback:
            callback.on_train_begin(None, None, None, model=model, optimizer=optimizer)
            assert callback.watch is not None and callback.watch.amp.scaler is scaler
    finally:  # the accelerator's state is global: the Trainers of other tests make their own
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    assert hook_count(model) == 0
