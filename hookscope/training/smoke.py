"""Smoke training, does the model train at all: :func:`train` runs SGD steps of cross-entropy
on a copy of the model (the loaded one is never changed) under ``hookscope.watch``. With
``overfit`` the first batch is repeated, and the loss must fall.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hookscope.core.classes import Targets, true_classes
from hookscope.core.errors import HookscopeError, param
from hookscope.core.logits import class_logits
from hookscope.core.run import Probe, Progress, Step, drive
from hookscope.training.log_reader import TrainingLog, read_log
from hookscope.training.log_writer import publish
from hookscope.training.nonfinite import NonFiniteError
from hookscope.training.watch import watch

if TYPE_CHECKING:
    from hookscope.sources import LoadedModel

__all__ = ["SmokeOptions", "SmokeReport", "smoke_labels", "train"]


@dataclass(frozen=True)
class SmokeOptions:
    """SGD's steps, learning rate and momentum, one batch or all, and the watch's options."""

    steps: int = 50
    lr: float = 0.01
    momentum: float = 0.0
    overfit: bool = False
    every: int = 10
    log_dir: Path | None = None
    layers: Sequence[str] | None = None
    types: Sequence[str] | None = None
    force: bool = False


@dataclass(frozen=True)
class SmokeReport:
    """Each step's loss, the steps asked for, the watch's non-finite event, its log read back
    (None: no logging step) and where it was kept (None: a temporary directory, removed)."""

    losses: list[float]
    steps: int
    overfit: bool = False
    nonfinite: dict[str, Any] | None = None
    log: TrainingLog | None = None
    log_dir: str | None = None

    @property
    def failure(self) -> str | None:
        """Why the run failed, in one line, or None."""
        if self.nonfinite is not None:
            return f"a non-finite value stopped training: {self.nonfinite['message']}"
        if self.losses and not math.isfinite(self.losses[-1]):
            return f"the loss is not finite at step {len(self.losses) - 1}"
        if self.overfit and len(self.losses) > 1 and not self.losses[-1] < self.losses[0]:
            return (f"--overfit: the loss did not fall on one repeated batch ({self.losses[0]:.4g} "
                    f"at step 0, {self.losses[-1]:.4g} at step {len(self.losses) - 1})")
        return None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document without its envelope."""
        first, last = (self.losses[0], self.losses[-1]) if self.losses else (None, None)
        return {"steps": self.steps, "steps_run": len(self.losses), "overfit": self.overfit,
                "loss_first": first, "loss_last": last,
                "loss": [{"step": i, "loss": v} for i, v in enumerate(self.losses)],
                "flagged": self.log.flagged() if self.log is not None else [],
                "nonfinite": self.nonfinite, "log_dir": self.log_dir,
                "passed": self.failure is None, "failure": self.failure}


def smoke_labels(label: str | None, folders: Sequence[str] | None,
                 categories: Sequence[str] | None) -> Targets:
    """The true classes: ``label``, else each input's ImageFolder class folder (a label or index
    of the model; without labels, the folders in sorted order, as torchvision numbers them)."""
    found = true_classes(label, folders, categories, by_order=True)
    if found is None:
        raise HookscopeError(f"training needs a true class per input: give {param('label')}, "
                             "or inputs in class folders (root/CLASS/image.jpg, as "
                             "torchvision's ImageFolder).")
    return found


def _epochs(make: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    """The inputs' batches over and over (none when the inputs have none)."""
    while True:
        empty = True
        for batch in make():
            empty = False
            yield batch
        if empty:
            return


def _batches(make: Callable[[], Iterable[Any]], steps: int, overfit: bool) -> Iterator[Any]:
    """``steps`` batches: the inputs' batches over and over, or the first one repeated."""
    batches = itertools.cycle(itertools.islice(make(), 1)) if overfit else _epochs(make)
    return itertools.islice(batches, steps)


class TrainProbe(Probe[list[float]]):
    """One SGD step per batch: forward, cross-entropy, backward, update, ``watch.step()``."""

    grad = "grad"
    counts_progress = True

    def __init__(self, model: nn.Module, labels: Targets, options: SmokeOptions,
                 watch: Any, output_key: str | None = None) -> None:
        self.labels, self.watch, self.output_key = labels, watch, output_key
        self.optimizer = torch.optim.SGD(model.parameters(), lr=options.lr,
                                         momentum=options.momentum)
        self.losses: list[float] = []

    def step(self, step: Step) -> None:
        logits = class_logits(step.forward(), self.output_key, "watch")
        target = torch.tensor(self.labels.resolve(logits, step.start), device=logits.device)
        loss = nn.functional.cross_entropy(logits.float(), target)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(float(loss.detach()))  # the one host read of the step, besides the watch's
        self.watch.step(self.losses[-1])
        step.advance(1)
        if not math.isfinite(self.losses[-1]):
            raise _LossNotFinite

    def finish(self) -> list[float]:
        return self.losses


class _LossNotFinite(Exception):
    """The loss itself is NaN or Inf while no watched module produced one."""


def train(loaded: LoadedModel, batches: Callable[[], Iterable[Any]], labels: Targets,
          options: SmokeOptions, *, progress: Progress | None = None) -> SmokeReport:
    """Train a copy of ``loaded.model`` under the watch; ``batches`` makes the inputs' batches
    (again for each pass over them), ``labels`` are their true classes."""
    model = copy.deepcopy(loaded.model)
    with tempfile.TemporaryDirectory(prefix="hookscope-watch-") as scratch:
        nonfinite = None
        with watch(model, scratch, every=options.every, layers=options.layers,
                   types=options.types, nonfinite="raise", name=loaded.name, force=True) as w:
            probe = TrainProbe(model, labels, options, w, loaded.output_key)
            try:
                drive(model, _batches(batches, options.steps, options.overfit), probe,
                      train_mode=True, progress=progress, autocast=loaded.autocast)
            except NonFiniteError as error:
                keys = ("module", "phase", "step", "call", "rank")
                nonfinite = {key: getattr(error, key) for key in keys} | {"message": str(error)}
            except _LossNotFinite:
                pass
        folder = Path(scratch)
        if options.log_dir is not None:  # the run ended: only now is --log-dir written
            publish(folder, options.log_dir, force=options.force)
            folder = options.log_dir
        kept = None
        with contextlib.suppress(HookscopeError):  # no logging step yet (stopped at once)
            kept = read_log(folder)
    return SmokeReport(probe.losses, options.steps, options.overfit, nonfinite, kept,
                       str(options.log_dir) if options.log_dir is not None else None)

