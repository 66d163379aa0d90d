"""The one driver: runs a model over batches for a probe.

Every analysis in hookscope is a :class:`Probe`: the modules it hooks, hook callbacks, what
it does with each batch, and :meth:`Probe.finish`, which returns its report. :func:`drive`
alone runs models. It

* puts the model in eval mode (unless ``train_mode``) and restores every module's
  ``training`` flag afterwards;
* sets the grad mode the probe asks for, around each forward pass;
* moves each batch to the model's device;
* resets the per-forward call indices;
* turns any exception raised by the model's own code into one :class:`ForwardError` that
  names the innermost running module, its type and input shapes;
* reports progress;
* removes every hook, on success, error and Ctrl-C alike.

A probe never loops over batches itself. A probe that needs several forward passes per
batch (an ablation before and after, ScoreCAM's masked inputs) calls :meth:`Step.forward`
again; each such pass gets the same treatment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

import torch
from torch import nn

from hookscope.core.errors import ForwardError, HookscopeError
from hookscope.core.hooks import Call, Tracer, model_device, model_dtype, raised_in_machinery
from hookscope.core.select import Site

if TYPE_CHECKING:
    from hookscope.inputs.resolve import Batch

__all__ = ["GradMode", "Probe", "Step", "drive", "grad_mode", "peek", "training_flags"]

#: ``inference``: ``torch.inference_mode``; ``grad``: autograd on; ``off``: autograd off but
#: tensors are ordinary ones, so a hook may switch autograd on from a layer onwards (CAM).
GradMode = Literal["inference", "grad", "off"]
#: Called with units of work done; may also have ``expect(total)`` (see :meth:`Step.expect`).
Progress = Callable[[int], None]
R = TypeVar("R")


@contextmanager
def grad_mode(mode: GradMode) -> Iterator[None]:
    """Enter the grad mode ``mode`` (see :data:`GradMode`)."""
    if mode == "inference":
        with torch.inference_mode():
            yield
    else:
        with torch.inference_mode(False), torch.set_grad_enabled(mode == "grad"):
            yield


@contextmanager
def training_flags(model: nn.Module, *, train: bool = False) -> Iterator[None]:
    """Run in eval mode (or train mode) and restore every module's ``training`` flag.

    In train mode, BatchNorm updates its running statistics as a side effect of each
    forward pass; every buffer is copied first and put back afterwards, so the model
    leaves as it came.
    """
    flags = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()] if train else []
    try:
        model.train(train)
        yield
    finally:
        for module, flag in flags:
            module.training = flag
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)


@dataclass
class Step:
    """One batch as a probe sees it.

    Attributes:
        index: the batch's number among all batches, from 0 (under torchrun too).
        start: the index of its first sample among all inputs (under torchrun too).
        x: the batch on the model's device (a tensor, or a tuple of positional arguments).
        batch: where its samples came from (names, original images), when known.
        tracer: the hook engine, for tensor hooks that must be removed with the others.
    """

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
        first = self.x[0] if isinstance(self.x, tuple) else self.x
        return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1

    def forward(self, x: Any = None, *, grad: GradMode | None = None) -> Any:
        """Run the model on ``x`` (default: this batch) with the probe's hooks.

        Raises:
            ForwardError: the model's code raised; names the innermost running module.
        """
        args = self.x if x is None else x
        tracer = self.tracer
        tracer.reset()
        try:
            return self._run(args, grad)
        except HookscopeError:
            raise
        except (Exception, SystemExit) as exc:  # sys.exit() in a forward is its failure too
            # A probe's own callback, or other hook machinery, failed: not the model.
            if tracer.callback_error is exc or raised_in_machinery(exc):
                raise
            raise tracer.locate(lambda: self._run(args, grad), exc) from exc

    def _run(self, args: Any, grad: GradMode | None) -> Any:
        with grad_mode(grad or self.grad), self._autocast():
            return self.model(*args) if isinstance(args, tuple) else self.model(args)

    def forward_expanded(self, x: torch.Tensor, k: int, rows: Callable[[Any], int],
                         known: dict[Any, bool], key: Any, *, grad: GradMode | None = None
                         ) -> Any:
        """Run one input ``x`` (batch 1) whose hooked layer's output a probe's hook turns
        into ``k`` rows, so what runs before that layer runs once, not ``k`` times.

        A model that cannot take this (it mixes tensors from before the layer with the
        batch: its forward raises, or its output has not ``rows(output) == k``) runs ``k``
        copies of ``x`` instead; which one worked is remembered in ``known[key]``.
        """
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
        return self.forward(x.expand(k, *x.shape[1:]).contiguous(), grad=grad)

    def _autocast(self) -> AbstractContextManager[Any]:
        if self.autocast is None:
            return nullcontext()
        return torch.autocast(model_device(self.model).type, dtype=self.autocast)

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
    """An analysis: which modules to hook, what to do per batch, and its report.

    Subclasses set :attr:`sites` and override what they need. The default :meth:`step` runs
    one forward pass and hands its output to :meth:`observe`.
    """

    #: The grad mode of every forward pass.
    grad: ClassVar[GradMode] = "inference"
    #: True when the probe reports its own progress units through :meth:`Step.advance`.
    counts_progress: bool = False
    sites: Sequence[Site] = ()

    def on_enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A selected module is about to run (pre-forward hook)."""

    def on_exit(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any],
                output: Any) -> Any:
        """A selected module returned; a non-None result replaces its output."""
        return None

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


def _as_batches(inputs: Any) -> Iterable[Any]:
    if isinstance(inputs, (torch.Tensor, tuple)):
        return [inputs]
    return inputs


def _to_device(x: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """``x`` on ``device``; floating-point tensors in the model's ``dtype`` (a half-precision
    model gets half-precision inputs)."""
    if isinstance(x, torch.Tensor):
        cast = dtype if dtype is not None and x.is_floating_point() else None
        return x.to(device, dtype=cast, non_blocking=True)
    if isinstance(x, tuple):
        return tuple(_to_device(v, device, dtype) for v in x)
    return x


def drive(
    model: nn.Module,
    inputs: Any,
    probe: Probe[R],
    *,
    train_mode: bool = False,
    progress: Progress | None = None,
    autocast: torch.dtype | None = None,
) -> R:
    """Run ``model`` over ``inputs`` for ``probe`` and return its report.

    Args:
        model: any ``nn.Module``; it is left as it was found: no hooks, ``training`` flags
            restored (it runs in eval mode unless ``train_mode``).
        inputs: one batch (a tensor, or a tuple of positional arguments), or an iterable
            of batches: tensors, tuples or :class:`hookscope.inputs.resolve.Batch` objects.
        probe: the analysis.
        train_mode: run in train mode (BatchNorm uses batch statistics, dropout is on).
        progress: called with each batch's size (or the probe's own units) as work is done.
        autocast: run every forward pass under ``torch.autocast`` with this dtype; without
            it, floating-point inputs are cast to the model's own dtype.

    Raises:
        ForwardError: the model's code raised (exit code 1).
        HookscopeError: the probe found a problem with the user's input.
    """
    device = model_device(model)
    dtype = None if autocast is not None else model_dtype(model)
    tracer = Tracer(model, probe.sites, on_enter=probe.on_enter, on_exit=probe.on_exit)
    with training_flags(model, train=train_mode), tracer:
        probe.bind(tracer)
        start = 0
        for index, item in enumerate(_as_batches(inputs)):
            tensor = getattr(item, "tensor", item)
            batch = item if tensor is not item else None
            if batch is not None:  # a Batch knows its place among all inputs (a rank's part)
                start = getattr(batch, "start", start)
                number = getattr(batch, "number", None)
                index = index if number is None else number
            step = Step(index, start, _to_device(tensor, device, dtype), batch, tracer, model,
                        probe.grad, progress, autocast)
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
    """The first batch, and an iterable that still yields every batch from the first.

    Raises:
        HookscopeError: there are no batches.
    """
    iterator = iter(_as_batches(batches))
    try:
        first = next(iterator)
    except StopIteration:
        raise HookscopeError("No inputs given.") from None

    def chained() -> Iterator[Any]:
        yield first
        yield from iterator

    return first, chained()

