"""``WatchCallback`` for Lightning's ``Trainer``: ``hookscope.watch`` around ``fit``.

    trainer = lightning.Trainer(callbacks=[WatchCallback(log_dir="runs/exp1", every=50)])

or, under ``LightningCLI``, in the config's ``trainer.callbacks`` (``class_path:
hookscope.integrations.lightning.WatchCallback`` with ``init_args``). A step is one optimiser
step: it ends at the end of the training batch in which an optimiser stepped (so with
``accumulate_grad_batches`` it holds every accumulated batch), with their loss (the sum of
the losses Lightning reports, each divided by the accumulation). Under ``precision="16-mixed"``
the precision plugin's ``GradScaler`` is the watch's ``scaler``. The watch closes when
training ends, and on any exception.
"""

from __future__ import annotations

from typing import Any

import torch

from hookscope.core.errors import HookscopeError
from hookscope.integrations import Watching

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        from pytorch_lightning import Callback  # type: ignore[no-redef,assignment]
    except ImportError:
        raise HookscopeError("The Lightning callback needs Lightning: pip install "
                             "'hookscope[lightning]'.") from None

__all__ = ["WatchCallback"]


class WatchCallback(Watching, Callback):  # type: ignore[misc]
    """Watch the ``LightningModule`` while it trains (takes :func:`hookscope.watch`'s options)."""

    stepped = False  # whether an optimiser stepped in this batch
    loss: Any = None  # the step's loss so far

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.stepped, self.loss = False, None
        self.begin_watch(pl_module, getattr(trainer.precision_plugin, "scaler", None))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.stepped = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self.loss = loss.detach() if self.loss is None else self.loss + loss.detach()
        if self.stepped:
            loss, self.loss, self.stepped = self.loss, None, False
            self.end_step(loss)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.end_watch()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.end_watch(exception)
