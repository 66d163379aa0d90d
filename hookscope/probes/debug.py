"""A live forward-pass trace that finds where non-finite values start and where a crash happened.

Every module, the model itself included, is hooked; the selection only decides which calls
produce ``enter``/``exit`` events. The non-finite origin is the first call, in the order calls
finish, whose output holds NaN or Inf while its inputs (checked in the pre-forward hook, before
an in-place module overwrites them) were finite; when the model's input is already non-finite,
it is the first module receiving it (``source: "input"``). When the forward pass raises, the
``error`` names the innermost module still running, its input shapes and the message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from hookscope.core.errors import CheckFailed, ForwardError
from hookscope.core.hooks import Call, first_tensor, tensors
from hookscope.core.mergeable import Merges, state
from hookscope.core.run import Probe, Step, drive
from hookscope.core.select import LEAVES, Selection, hooked_sites, selecting
from hookscope.numerics.moments import Moments, moments

__all__ = ["DebugProbe", "DebugReport", "EnterEvent", "ErrorEvent", "Event", "ExitEvent",
           "FirstNonfinite", "NonfiniteEvent", "nonfinite_failure", "run_debug"]

C = TypeVar("C")


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every value is finite: one cheap sum, and an exact check only if it is not."""
    if not (t.is_floating_point() or t.is_complex()):
        return True
    if math.isfinite(float(t.detach().sum().abs())):  # abs: a complex sum as one number
        return True  # a NaN or Inf anywhere makes the sum non-finite
    return bool(torch.isfinite(t.detach()).all())  # the sum may just have overflowed


class FirstNonfinite(Generic[C]):
    """The first-non-finite rule, one for ``debug`` and ``watch``. Fed each call as it
    finishes, with whether its inputs (read as it started, before an in-place module
    overwrites them) and its outputs were finite, it finds the first call whose outputs hold
    a NaN or ±inf while its inputs were finite (``"module"``). The calls after it see the
    values too and are not blamed. Failing that, :meth:`origin` names the first call that
    received non-finite values (``"outside"``: the model's input, or code between calls)."""

    def __init__(self) -> None:
        self.found: C | None = None
        self.reached: C | None = None

    def finished(self, call: C, inputs_finite: bool, outputs_finite: bool) -> bool:
        """Feed one call; whether it is the first to produce non-finite values."""
        if self.found is not None or outputs_finite:
            return False
        if inputs_finite:
            self.found = call
            return True
        self.reached = self.reached or call
        return False

    def origin(self) -> tuple[C, str] | None:
        """The call and its source (``"module"`` or ``"outside"``), or None: all finite."""
        if self.found is not None:
            return self.found, "module"
        return None if self.reached is None else (self.reached, "outside")


@dataclass(frozen=True)
class _Event:
    """An event's JSON row is ``event``, then its fields, with ``output_shape`` (the first of
    the ``output_shapes``) before ``output_shapes``."""

    event = ""

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {"event": self.event}
        for key, value in asdict(self).items():
            if key == "output_shapes":
                row["output_shape"] = value[0] if value else None
            row[key] = value
        return row


@dataclass(frozen=True)
class _CallEvent(_Event):
    """A module call, which every event but ``error`` names first."""

    name: str
    type: str
    call: int
    depth: int
    batch: int


@dataclass(frozen=True)
class EnterEvent(_CallEvent):
    """A selected module call starts."""

    input_shapes: list[list[int]]

    event = "enter"


@dataclass(frozen=True)
class ExitEvent(_CallEvent):
    """A selected module call finished: its output shapes and the first output's statistics."""

    output_shapes: list[list[int]]
    stats: dict[str, float | int] | None

    event = "exit"

    @property
    def nonfinite(self) -> int:
        return int((self.stats or {}).get("nonfinite", 0))

    def to_dict(self) -> dict[str, Any]:
        row = super().to_dict()
        stats = row.pop("stats") or dict.fromkeys(Moments().summary())  # null statistics
        return row | stats


@dataclass(frozen=True)
class NonfiniteEvent(_CallEvent):
    """The first module call whose output is non-finite while its inputs were finite (``source``
    ``"module"``), or that received the model's non-finite input (``"input"``); one summary per
    tensor in ``input_stats`` and ``output_stats``."""

    source: str
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]
    input_stats: list[dict[str, float | int]]
    output_stats: list[dict[str, float | int]]

    event = "nonfinite"


@dataclass(frozen=True)
class ErrorEvent(_Event):
    """The forward pass raised; ``name`` is the innermost module that was running: ``""``
    when the model's own code raised outside any submodule, None before the model started.
    """

    name: str | None
    type: str | None
    call: int | None
    depth: int | None
    batch: int
    input_shapes: list[list[int]]
    message: str
    exception: str

    event = "error"


Event = EnterEvent | ExitEvent | NonfiniteEvent | ErrorEvent


@dataclass
class DebugReport(Merges):
    """The outcome of :func:`run_debug`; ``to_dict`` is the ``summary`` event."""

    batches: int = state("sum", 0)
    samples: int = state("sum", 0)
    calls: int = state("sum", 0)
    nonfinite_calls: int = state("sum", 0)
    origin: NonfiniteEvent | None = state("first", None)
    error: ErrorEvent | None = state("first", None)
    #: The forward pass's failure, with the message every command prints for it.
    failure: ForwardError | None = state("first", None, repr=False)
    output_shapes: list[list[int]] = field(default_factory=list)
    #: Every event, in order, when the probe was asked to record them (else None).
    events: list[Event] | None = field(default=None, repr=False)

    def merge(self, other: DebugReport) -> DebugReport:
        """One run over this report's inputs, then ``other``'s: counts add, the first origin
        is kept (``other``'s origin event is dropped, as one run stops looking once it has
        one), and a run that failed ends there."""
        if self.error is not None:
            return self
        kept = (e for e in other.events or () if self.origin is None or not isinstance(e, NonfiniteEvent))
        events = None if self.events is None else [*self.events, *kept]
        shapes = other.output_shapes if other.samples else self.output_shapes
        return replace(super().merge(other), output_shapes=shapes, events=events)

    def to_dict(self) -> dict[str, Any]:
        o, e = self.origin, self.error
        origin = None if o is None else {"name": o.name, "type": o.type, "call": o.call,
                                         "batch": o.batch, "source": o.source}
        error = None if e is None else {k: v for k, v in asdict(e).items() if k != "depth"}
        return {"event": "summary", "batches": self.batches, "samples": self.samples,
                "calls": self.calls, "nonfinite_calls": self.nonfinite_calls,
                "origin": origin, "error": error, "output_shapes": self.output_shapes}

    def document(self, envelope: Mapping[str, Any]) -> dict[str, Any]:
        """The ``debug`` document: the envelope (``LoadedModel.envelope``), every recorded
        event, and the summary (the envelope again, then :meth:`to_dict`)."""
        summary = dict(envelope) | {k: v for k, v in self.to_dict().items() if k != "event"}
        return dict(envelope) | {"events": [e.to_dict() for e in self.events or ()], "summary": summary}


class DebugProbe(Probe[DebugReport]):
    """Trace events for the selected calls; non-finite detection on every call, so that a
    crash or an origin is found outside the selection too. With ``record``, the report keeps
    every event (``events``), so that reports merge with their traces.
    """

    def __init__(self, model: nn.Module, *, select: Selection = LEAVES,
                 on_event: Callable[[Event], None] | None = None, record: bool = False) -> None:
        self.selected = {s.name for s in select.sites(model)}
        self.sites = hooked_sites(model)
        self.model = model
        self.on_event = on_event
        self.report = DebugReport(events=[] if record else None)
        self.batch = 0
        # Per running call: input shapes, input summaries (while detecting) and finiteness.
        self._entered: dict[tuple[str, int],
                            tuple[list[list[int]], list[dict[str, Any]] | None, bool]] = {}
        self._input_nonfinite = False  # the model's own input holds NaN/Inf
        self._input_origin: tuple[str, int] | None = None
        self.rule: FirstNonfinite[Call] = FirstNonfinite()

    def emit(self, event: Event) -> None:
        if self.report.events is not None:
            self.report.events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    @property
    def detecting(self) -> bool:
        return self.report.origin is None

    def on_enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        inputs = tensors((args, kwargs))
        shapes = [list(t.shape) for t in inputs]
        summaries: list[dict[str, Any]] | None = None
        finite = True
        if self.detecting:
            # Summarised now: an in-place module may overwrite its input before it returns.
            summaries = [moments(t).summary() for t in inputs]
            finite = all(s["nonfinite"] == 0 for s in summaries)
            is_root = call.site.module is self.model
            if is_root and not finite:
                self._input_nonfinite = True
            elif self._input_nonfinite and self._input_origin is None and not is_root:
                self._input_origin = call.key
        self._entered[call.key] = (shapes, summaries, finite)
        if call.name in self.selected:
            self.emit(EnterEvent(call.name, call.site.type, call.index, call.site.depth,
                                 self.batch, shapes))

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        in_shapes, in_summaries, finite = self._entered.pop(call.key, ([], None, True))
        outputs = tensors(output)
        out_shapes = [list(t.shape) for t in outputs]
        if call.name in self.selected:
            first = first_tensor(output)
            event = ExitEvent(call.name, call.site.type, call.index, call.site.depth, self.batch,
                              out_shapes, None if first is None else moments(first).summary())
            self.report.calls += 1
            if event.nonfinite:
                self.report.nonfinite_calls += 1
            self.emit(event)
        if not self.detecting or in_summaries is None:
            return
        is_root = call.site.module is self.model
        if call.key == self._input_origin or (is_root and self._input_nonfinite):
            source = "input"
        elif self.rule.finished(call, finite, not finite or all(map(_all_finite, outputs))):
            source = "module"  # (the outputs are read only when the inputs were finite)
        else:
            return
        origin = NonfiniteEvent(call.name, call.site.type, call.index, call.site.depth,
                                self.batch, source, in_shapes, out_shapes, in_summaries,
                                [moments(t).summary() for t in outputs])
        self.report.origin = origin
        self.emit(origin)

    def step(self, step: Step) -> None:
        self.batch = step.index
        self._entered.clear()
        self._input_nonfinite = False
        self._input_origin = None
        output = step.forward()
        self.report.batches += 1
        self.report.samples += len(step)
        self.report.output_shapes = [list(t.shape) for t in tensors(output)]

    def on_error(self, error: ForwardError, step: Step) -> bool:
        self.report.error = ErrorEvent(error.module, error.type_name, error.call, error.depth, step.index,
                                       error.input_shapes, error.reason, error.exception)
        self.report.failure = error
        self.report.batches += 1
        self.emit(self.report.error)
        return True

    def finish(self) -> DebugReport:
        return self.report


def nonfinite_failure(origin: NonfiniteEvent) -> CheckFailed:
    """The error for ``fail_on_nonfinite``: where non-finite values first appeared."""
    where = f"{origin.name or 'the model itself'} ({origin.type}, call {origin.call}, batch {origin.batch})"
    if origin.source == "input":
        return CheckFailed(f"the input holds non-finite values (first module: {where}).")
    return CheckFailed(f"non-finite values first appear in {where}.")


@selecting
def run_debug(model: nn.Module, inputs: torch.Tensor | Iterable[torch.Tensor], *,
              select: Selection = LEAVES, on_event: Callable[[Event], None] | None = None) -> DebugReport:
    """Run ``model`` in eval and inference mode on ``inputs`` (a batch or an iterable of
    batches), tracing the selected calls (``select``, or the keywords ``layers``, ``types``,
    ``all_modules``, ``max_depth``) and locating problems; ``on_event`` is called with each
    event, in order. An error stops the run; the report's ``failure`` holds it, to raise.
    """
    return drive(model, inputs, DebugProbe(model, select=select, on_event=on_event))
