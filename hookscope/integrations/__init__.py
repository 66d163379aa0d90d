"""Training frameworks' callbacks around ``hookscope.watch``, one thin adapter per framework
(:mod:`~hookscope.integrations.lightning`, :mod:`~hookscope.integrations.transformers`); both
take the options of :func:`hookscope.watch` and write the same log.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hookscope.training.watch import Watch, watch

__all__ = ["Watching"]


class Watching:
    """What both callbacks do (a mixin before the framework's callback class): open a watch
    with ``watch_options`` (``log_dir`` included) when training starts, end a step after each
    optimiser step, and close the watch when training ends or fails."""

    def __init__(self, **watch_options: Any) -> None:
        super().__init__()
        if "log_dir" not in watch_options:
            raise TypeError("WatchCallback needs log_dir, as hookscope.watch does.")
        self.options = dict(watch_options)
        self.watch: Watch | None = None  # the open watch (None outside training)

    def begin_watch(self, model: nn.Module) -> None:
        self.end_watch()
        self.watch = watch(model, **self.options).__enter__()

    def end_step(self, loss: Any = None) -> None:
        if self.watch is not None:
            self.watch.step(loss)

    def end_watch(self, error: BaseException | None = None) -> None:
        """Close the watch: every hook removed (after ``error`` too)."""
        current, self.watch = self.watch, None
        if current is not None:
            current.__exit__(None if error is None else type(error), error, None)
