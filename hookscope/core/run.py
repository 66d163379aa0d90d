"""The one driver: :func:`drive` alone runs models, over batches, for a :class:`Probe`.

Every forward pass (:meth:`Step.forward`, several per batch if a probe needs them) runs in
the probe's grad mode, on the model's device, with its exceptions turned into one
:class:`ForwardError` naming the innermost running module; the model is left as found."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils.data import DataLoader, Dataset, IterableDataset

from hookscope.core.arguments import arity, call, expand, map_tensors, rows, split_label
from hookscope.core.errors import ForwardError, HookscopeError
from hookscope.core.hooks import Call, Tracer, model_device, model_dtype, raised_in_machinery
from hookscope.core.select import Site

__all__ = ["Batch", "GradMode", "Probe", "Step", "drive", "grad_mode", "peek", "training_flags"]

#: ``inference``: ``torch.inference_mode``; ``grad``: autograd on; ``off``: autograd off but
#: tensors are ordinary ones, so a hook may switch autograd on from a layer onwards (CAM).
GradMode = Literal["inference", "grad", "off"]
#: Called with units of work done; may also have ``expect(total)`` (see :meth:`Step.expect`).
Progress = Callable[[int], None]
R = TypeVar("R")
#: Items per batch of a map-style Dataset given to :func:`drive` (pass a DataLoader for another).
DATASET_BATCH = 8


@contextmanager
def grad_mode(mode: GradMode) -> Iterator[None]:
    """Enter the grad mode ``mode`` (see :data:`GradMode`)."""
    with torch.inference_mode(mode == "inference"), torch.set_grad_enabled(mode == "grad"):
        yield


@contextmanager
def training_flags(model: nn.Module, *, train: bool = False) -> Iterator[None]:
    """Run in eval (or train) mode, then restore every module's ``training`` flag and, in
    train mode, every buffer (BatchNorm updates its running statistics)."""
    flags = [(m, m.training) for m in model.modules()]
    # A lazy buffer has no value yet to restore; the forward materialises it.
    buffers = [(b, b.detach().clone()) for b in model.buffers() if not is_lazy(b)] if train else []
    try:
        if any(flag != train for _, flag in flags):  # nothing to set: ~1 ms on resnet50
            model.train(train)
        yield
    finally:
        for module, flag in flags:
            if module.training != flag:
                module.training = flag
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)


@dataclass
class Batch:
    """A preprocessed batch and where each of its samples came from (made by
    :func:`hookscope.inputs.resolve.iter_batches`)."""

    items: list[Any]  # each sample's hookscope.inputs.decode.InputItem
    #: The stacked, preprocessed samples: a tensor, or a tuple (positional arguments) or
    #: dict (keyword arguments) of tensors (see :mod:`hookscope.core.arguments`).
    tensor: Any
    images: list[Any]  # the decoded PIL images when kept (else None each)
    start: int  # the position of its first sample among all inputs
    number: int | None = None  # its position among all batches (None: counted by the driver)

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class Step:
    """One batch as a probe sees it: its number ``index`` and first sample ``start`` among
    all inputs (under torchrun too), ``x`` on the model's device, and the :class:`Batch` it
    came from, when known."""

    index: int
    start: int
    x: Any
    batch: Batch | None
    tracer: Tracer
    model: nn.Module
    grad: GradMode
    progress: Progress | None = field(default=None, repr=False)
    autocast: torch.dtype | None = None

    def __len__(self) -> int:
        return rows(self.x)

    def forward(self, x: Any = None, *, grad: GradMode | None = None) -> Any:
        """Run the model on ``x`` (default: this batch) with the probe's hooks; the model's
        exceptions become a :class:`ForwardError` naming the innermost running module."""
        args = self.x if x is None else x
        self.tracer.reset()
        try:
            return self._run(args, grad)
        except HookscopeError:
            raise
        except (Exception, SystemExit) as exc:  # sys.exit() in a forward is its failure too
            # A probe's own callback, or other hook machinery, failed: not the model.
            if self.tracer.callback_error is exc or raised_in_machinery(exc):
                raise
            raise self.tracer.locate(lambda: self._run(args, grad), exc) from exc

    def _run(self, args: Any, grad: GradMode | None) -> Any:
        autocast: AbstractContextManager[Any] = nullcontext() if self.autocast is None else \
            torch.autocast(model_device(self.model).type, dtype=self.autocast)
        with grad_mode(grad or self.grad), autocast:
            return call(self.model, args)

    def forward_expanded(self, x: Any, k: int, rows: Callable[[Any], int],
                         known: dict[Any, bool], key: Any, *, grad: GradMode | None = None
                         ) -> Any:
        """Run one input ``x`` whose hooked layer's output a probe's hook expands to ``k``
        rows, so the layers before it run once; a model where that fails (it raises, or
        ``rows(output) != k``) runs ``k`` copies instead, remembered in ``known[key]``."""
        if known.get(key, True):
            try:
                out = self.forward(x, grad=grad)
                if rows(out) == k:
                    known[key] = True
                    return out
            except ForwardError:
                pass
            known[key] = False
        # One contiguous copy: convolutions are slower on a stride-0 batch.
        return self.forward(expand(x, k), grad=grad)

    def advance(self, n: int) -> None:
        """Report ``n`` units of progress (for probes that count their own units)."""
        if self.progress is not None:
            self.progress(n)

    def expect(self, total: int) -> None:
        """Announce the whole run's progress units, when a probe learns them late."""
        expect = getattr(self.progress, "expect", None)
        if expect is not None:
            expect(total)


class Probe(Generic[R]):
    """An analysis: which modules to hook (:attr:`sites`), what to do per batch, its report."""

    grad: ClassVar[GradMode] = "inference"
    #: True when the probe reports its own progress units through :meth:`Step.advance`.
    counts_progress: bool = False
    sites: Sequence[Site] = ()

    def on_enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A selected module is about to run (pre-forward hook)."""

    def on_exit(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any],
                output: Any) -> Any:
        """A selected module returned; a non-None result replaces its output."""

    def bind(self, tracer: Tracer) -> None:
        """Called once the hooks are attached, before the first batch."""

    def step(self, step: Step) -> None:
        """Process one batch: by default one forward pass, then :meth:`observe`."""
        self.observe(step, step.forward())

    def observe(self, step: Step, output: Any) -> None:
        """Use a batch's output."""

    def on_error(self, error: ForwardError, step: Step) -> bool:
        """The model raised; return True to stop and still :meth:`finish`, False to raise."""
        return False

    def finish(self) -> R:
        """The report."""
        raise NotImplementedError


def _as_batches(inputs: Any, model: nn.Module | None = None) -> Iterable[Any]:
    """One batch (a tensor, tuple or dict) as a list of it; a DataLoader's batches (a
    map-style Dataset's, DATASET_BATCH items each) without their labels (the rule of
    :func:`~hookscope.core.arguments.split_label`); else as is."""
    if isinstance(inputs, (torch.Tensor, tuple, dict)):
        return [inputs]
    if isinstance(inputs, Dataset) and not isinstance(inputs, IterableDataset):
        inputs = DataLoader(inputs, batch_size=DATASET_BATCH)
    if isinstance(inputs, DataLoader):
        known = arity(model) if model is not None else None
        return (split_label(batch, known)[0] for batch in inputs)
    return inputs


def _to_device(x: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """``x`` on ``device``; floating-point tensors in the model's ``dtype`` (a half-precision
    model gets half-precision inputs)."""
    def move(t: torch.Tensor) -> torch.Tensor:
        cast = dtype if dtype is not None and t.is_floating_point() else None
        return t.to(device, dtype=cast, non_blocking=True)

    return map_tensors(x, move)


def drive(model: nn.Module, inputs: Any, probe: Probe[R], *, train_mode: bool = False,
          progress: Progress | None = None, autocast: torch.dtype | None = None) -> R:
    """Run ``model`` over ``inputs`` for ``probe`` and return its report.

    ``inputs`` is one batch (a tensor, a tuple of positional arguments or a dict of keyword
    arguments) or an iterable of them or of :class:`Batch` objects (a DataLoader's
    ``(input, label)`` batches lose their labels). Under ``autocast`` every pass runs in
    ``torch.autocast``; else floating-point inputs take the model's dtype."""
    device = model_device(model)
    dtype = None if autocast is not None else model_dtype(model)
    tracer = Tracer(model, probe.sites, on_enter=probe.on_enter, on_exit=probe.on_exit)
    grad = probe.grad
    if grad == "inference" and any(is_lazy(p) for p in model.parameters()):
        grad = "off"  # lazy parameters materialise as ordinary tensors, not inference ones
    with training_flags(model, train=train_mode), tracer:
        probe.bind(tracer)
        start = 0
        for index, item in enumerate(_as_batches(inputs, model)):
            batch = item if isinstance(item, Batch) else None
            if batch is not None:  # a Batch knows its place among all inputs (a rank's part)
                start, item = batch.start, batch.tensor
                index = index if batch.number is None else batch.number
            step = Step(index, start, _to_device(item, device, dtype), batch, tracer, model,
                        grad, progress, autocast)
            try:
                probe.step(step)
            except ForwardError as error:
                if probe.on_error(error, step):
                    break
                raise
            start += len(step)
            if progress is not None and not probe.counts_progress:
                progress(len(step))
    return probe.finish()


def peek(batches: Iterable[Any]) -> tuple[Any, Iterable[Any]]:
    """The first batch, and an iterable that still yields every batch from the first (a
    :class:`HookscopeError` when there are none)."""
    iterator = iter(_as_batches(batches))
    try:
        first = next(iterator)
    except StopIteration:
        raise HookscopeError("No inputs given.") from None
    return first, chain([first], iterator)

