"""Training frameworks' callbacks around ``hookscope.watch`` (:mod:`.lightning`,
:mod:`.transformers`): both take its options and write the same log, a step per optimiser step.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

from torch import nn

from hookscope.core.errors import HookscopeError
from hookscope.training.watch import Watch, watch

__all__ = ["Watching"]


class Watching:
    """Both callbacks' mixin: open a watch with :func:`hookscope.watch`'s options (less the
    model and the scaler, which the framework holds) when training starts, end a step after
    each optimiser step, and close the watch when training ends or fails."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__()
        try:
            self.options = OPTIONS.bind(self, *args, **options).arguments
        except TypeError as exc:
            raise HookscopeError(f"WatchCallback: {exc}; it takes hookscope.watch's options.") from None
        del self.options["self"]
        self.watch: Watch | None = None  # the open watch (None outside training)

    def begin_watch(self, model: nn.Module, scaler: Any = None) -> None:
        self.end_watch()
        self.watch = watch(model, **self.options, scaler=scaler).__enter__()

    def end_step(self, loss: Any = None) -> None:
        if self.watch is not None:
            self.watch.step(loss)

    def end_watch(self, error: BaseException | None = None) -> None:
        current, self.watch = self.watch, None
        if current is not None:
            current.__exit__(None if error is None else type(error), error, None)


def _options() -> inspect.Signature:
    """``Watch``'s signature less ``model`` and ``scaler``, annotations evaluated, as
    ``LightningCLI`` (jsonargparse) reads it for a YAML config."""
    hints = typing.get_type_hints(Watch.__init__)
    signature = inspect.signature(Watch.__init__)
    return signature.replace(parameters=[p.replace(annotation=hints.get(p.name, p.annotation))
                                         for p in signature.parameters.values()
                                         if p.name not in ("model", "scaler")],
                             return_annotation=None)


OPTIONS = _options()
Watching.__init__.__signature__ = OPTIONS  # type: ignore[attr-defined]
