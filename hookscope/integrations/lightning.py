"""``WatchCallback`` for Lightning's ``Trainer``: ``hookscope.watch`` around ``fit``.

    trainer = lightning.Trainer(callbacks=[WatchCallback(log_dir="runs/exp1", every=50)])

A step ends after each training batch (``on_train_batch_end``), with the loss
``training_step`` returned. The watch closes when training ends, and on any exception.
"""

from __future__ import annotations

from typing import Any

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

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.begin_watch(pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.end_step(loss)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.end_watch()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.end_watch(exception)
