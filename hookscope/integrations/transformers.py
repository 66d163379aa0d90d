"""``WatchCallback`` for Hugging Face's ``Trainer``: ``hookscope.watch`` around ``train``.

    callback = WatchCallback(log_dir="runs/exp1", every=50)
    with callback:  # closes the watch even when training raises
        Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()

A step is one optimiser step (``on_step_end``), with all its accumulated passes: watch step
``i`` is the ``Trainer``'s global step ``i + 1``. On a logging step the callback asks the
``Trainer`` to log (``control.should_log``) and ends the step when it does (``on_log``), with
the loss it logged: the mean over the steps since its previous log. Under fp16 the
accelerator's ``GradScaler`` (the optimiser's ``scaler``) is the watch's ``scaler``. The
``Trainer`` has no callback for an exception, so use the callback as a context manager (or
call :meth:`WatchCallback.close`) to be sure every hook is removed when training fails.
"""

from __future__ import annotations

from typing import Any

from hookscope.core.errors import HookscopeError
from hookscope.integrations import Watching

try:
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - depends on what is installed
    raise HookscopeError("The Hugging Face callback needs transformers: pip install "
                         "'hookscope[transformers]'.") from None

__all__ = ["WatchCallback"]


class WatchCallback(Watching, TrainerCallback):  # type: ignore[misc]
    """Watch the ``Trainer``'s model while it trains (takes :func:`hookscope.watch`'s options)."""

    pending = False  # a logging step waits for the Trainer's log of its loss

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise HookscopeError("The Trainer gave the callback no model to watch.")
        self.begin_watch(model, getattr(optimizer, "scaler", None))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.on_log(args, state, control)  # a log that never came: the step ends before the next

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.watch is not None and self.watch.index % self.watch.every == 0:
            control.should_log = self.pending = True
        else:
            self.end_step()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.pending:
            self.pending = False
            self.end_step((logs or {}).get("loss"))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.on_log(args, state, control)
        self.end_watch()

    def close(self) -> None:
        """Close the watch now (every hook removed)."""
        self.end_watch()

    def __enter__(self) -> WatchCallback:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.end_watch(exc)
