"""Lightning's ``backbone_image_classifier.py`` under ``LightningCLI``: its ``Backbone``
(two Linear layers, a ReLU on the logits too), ``LitClassifier`` with Adam, and a
``LightningDataModule``, on random 28x28 images; the watch is a ``WatchCallback`` in the
trainer's defaults, or configured as the CLI's ``trainer.callbacks`` (``fault="cli_config"``).
Without jsonargparse (which ``LightningCLI`` needs) the same ``Trainer`` is built directly.
Faults (``--model.fault``): ``nan_l2`` (a NaN weight in backbone.l2 at optimiser step 2),
``accumulate`` (the same with ``accumulate_grad_batches=2``), ``dead_logits`` (l2's bias
-100: the ReLU on the logits passes no gradient at all)."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

import lightning.pytorch as lightning
import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from hookscope.integrations.lightning import WatchCallback

from .faults import poison


class Backbone(torch.nn.Module):
    def __init__(self, hidden_dim: int = 16) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(28 * 28, hidden_dim)
        self.l2 = torch.nn.Linear(hidden_dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(x.size(0), -1)
        x = torch.relu(self.l1(x))
        return torch.relu(self.l2(x))


class LitClassifier(LightningModule):
    def __init__(self, learning_rate: float = 1e-3, fault: str | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = Backbone()
        if fault == "dead_logits":
            torch.nn.init.constant_(self.backbone.l2.bias, -100.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.hparams.fault in ("nan_l2", "accumulate") and self.trainer.global_step == 2:
            poison(self.backbone.l2.weight)
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)


class MyDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(42)
        self.train = TensorDataset(torch.rand(48, 1, 28, 28, generator=g),
                                   torch.randint(0, 10, (48,), generator=g))
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size)


def main(log_dir: Path, fault: str | None = None, steps: int = 4, every: int = 1) -> None:
    trainer: dict[str, Any] = {"max_steps": steps, "accelerator": "cpu", "logger": False,
                               "enable_checkpointing": False, "enable_progress_bar": False,
                               "enable_model_summary": False,
                               "accumulate_grad_batches": 2 if fault == "accumulate" else 1}
    defaults = {}
    if fault == "cli_config":  # as a YAML config would say it
        trainer["callbacks"] = [{"class_path": "hookscope.integrations.lightning.WatchCallback",
                                 "init_args": {"log_dir": str(log_dir), "every": every}}]
    else:
        defaults = {"callbacks": [WatchCallback(log_dir=log_dir, every=every)]}
    if find_spec("jsonargparse") is None:  # LightningCLI needs it: build what it would build
        lightning.seed_everything(1234)
        plain = lightning.Trainer(**trainer | defaults)
        plain.fit(LitClassifier(fault=fault), datamodule=MyDataModule())
        return
    cli = LightningCLI(LitClassifier, MyDataModule, seed_everything_default=1234, run=False,
                       trainer_defaults=defaults, save_config_callback=None,
                       args={"trainer": trainer, "model": {"fault": fault}})
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
