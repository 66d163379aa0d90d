"""``WatchCallback`` for Hugging Face's ``Trainer``: ``hookscope.watch`` around ``train``.

    callback = WatchCallback(log_dir="runs/exp1", every=50)
    with callback:  # closes the watch even when training raises
        Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()

A step is one optimiser step (``on_step_end``), with all its accumulated passes. The
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

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        if model is None:
            raise HookscopeError("The Trainer gave the callback no model to watch.")
        self.begin_watch(model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.end_watch()

    def close(self) -> None:
        """Close the watch now (every hook removed)."""
        self.end_watch()

    def __enter__(self) -> WatchCallback:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.end_watch(exc)
