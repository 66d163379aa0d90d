"""The every-step non-finite check: fused device-side flags, read once per step, and the locator.

Each selected call's floating-point inputs and outputs (and, through tensor hooks, the
gradients at its outputs and at inputs that need one) are reduced on their device to
``torch.aminmax``: a NaN makes both values NaN, a ±inf shows as the min or max, and nothing
can overflow. :meth:`StepFlags.verdict` stacks them into one device boolean, the step's one
host read; only when it is set do the values come to the host and :meth:`StepFlags.locate`
names the producing call: forward, the first call (in finishing order) with a non-finite
output from finite inputs; backward, the first call (in arrival order) with a non-finite
gradient at an input from a finite gradient at its output. A tensor is reduced once, keyed
by identity and version; references are weak, so no activation is kept alive.
"""

from __future__ import annotations

import fnmatch
import math
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch

from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import Call, Hooks, tensors
from hookscope.numerics.moments import moments

__all__ = ["Finding", "NonFiniteError", "StepFlags", "event_doc", "flight_steps"]

#: Value kinds in the check vector: not checked (an input only), any NaN/inf, NaN only.
INFO, STRICT, NAN_ONLY = 0, 1, 2


class NonFiniteError(HookscopeError):
    """A training step produced NaN or ±inf; raised by ``watch`` with ``nonfinite="raise"``.

    Attributes (see docs/watch.md): ``module``, ``phase``, ``step``, ``call``, ``inputs``,
    ``type_name``, ``source`` (``"module"`` or ``"outside"``) and ``rank`` (None: one process).
    """

    exit_code = 1

    def __init__(self, message: str, *, module: str = "", phase: str = "forward", step: int = 0,
                 call: int = 0, inputs: list[dict[str, Any]] | None = None,
                 type_name: str = "", source: str = "module", rank: int | None = None) -> None:
        super().__init__(message)
        self.module, self.phase, self.step, self.call = module, phase, step, call
        self.inputs = inputs or []
        self.type_name, self.source, self.rank = type_name, source, rank

    def __reduce__(self) -> tuple[Any, ...]:
        return (NonFiniteError, (super().__str__(),), dict(self.__dict__))


@dataclass
class _Slot:
    """One reduced tensor: where its two values sit, its shape, and a weak reference."""

    index: int
    kind: int
    shape: list[int]
    ref: Any
    version: int

    def alive(self) -> torch.Tensor | None:
        t = self.ref()
        return t if t is not None and t._version == self.version else None


@dataclass
class _Record:
    """One selected call's slots: forward values, and gradients at its inputs and outputs."""

    call: Call
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    grad_inputs: list[int] = field(default_factory=list)
    grad_outputs: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    """Where a step's first non-finite value came from (see the module docstring)."""

    phase: str
    module: str
    type: str
    call: int
    source: str
    produced: str
    inputs: list[dict[str, Any]]
    grad_output: dict[str, Any] | None = None

    def error(self, message: str, step: int, rank: int | None) -> NonFiniteError:
        """The error that reports this finding with ``message``."""
        return NonFiniteError(message, module=self.module, phase=self.phase, step=step,
                              call=self.call, inputs=self.inputs, type_name=self.type,
                              source=self.source, rank=rank)

    def message(self, step: int, rank: int | None = None) -> str:
        """The one-line message: ``step 7, forward: act (Log) produced 3 NaN from finite
        inputs (min -0.41, max 2.3)``."""
        where = f"rank {rank}: " if rank is not None else ""
        name = f"{self.module or 'the model'} ({self.type}" + \
            (f", call {self.call})" if self.call else ")")
        head = f"{where}step {step}, {self.phase}: "
        shown = _range(self.inputs)
        if self.phase == "forward" and self.source == "module":
            return f"{head}{name} produced {self.produced} from finite inputs{shown}"
        if self.phase == "forward":
            return (f"{head}{name} received {self.produced} from outside the selected modules "
                    f"(the model's input or its own code){shown}")
        grad = _range([self.grad_output] if self.grad_output else [])
        if self.source == "module":
            return (f"{head}{name} produced {self.produced} in the gradient of its input from a "
                    f"finite gradient at its output{grad}; its inputs{shown or ' unknown'}")
        return (f"{head}the gradient at the output of {name} is already {self.produced} "
                "(it comes from the loss or code outside the selected modules)")


def _range(inputs: list[dict[str, Any]]) -> str:
    lows = [d["min"] for d in inputs if d.get("min") is not None and math.isfinite(d["min"])]
    highs = [d["max"] for d in inputs if d.get("max") is not None and math.isfinite(d["max"])]
    if not lows or not highs:
        return ""
    return f" (min {min(lows):.4g}, max {max(highs):.4g})"


def _describe(lo: float, hi: float, alive: torch.Tensor | None) -> str:
    """``3 NaN``, ``1 +inf``, or without counts when the tensor is gone: ``NaN``."""
    if alive is not None:
        t = alive.detach()
        counts = [(int(torch.isnan(t).sum()), "NaN"), (int(torch.isposinf(t).sum()), "+inf"),
                  (int(torch.isneginf(t).sum()), "-inf")]
        parts = [f"{n} {what}" for n, what in counts if n]
        if parts:
            return ", ".join(parts)
    if math.isnan(lo) or math.isnan(hi):
        return "NaN"
    return " and ".join(w for w, bad in (("-inf", math.isinf(lo)), ("+inf", math.isinf(hi)))
                        if bad) or "non-finite values"


def _ok(host: list[float], kind: int, at: int) -> bool:
    """Whether the two values at ``at`` pass a check of ``kind``."""
    lo, hi = host[at], host[at + 1]
    if kind == NAN_ONLY:
        return not (math.isnan(lo) or math.isnan(hi))
    return math.isfinite(lo) and math.isfinite(hi)


class StepFlags:
    """The flags one training step's hooks recorded: ``allow_inf`` names modules whose ±inf
    is intended (NaN still counts); the owner removes ``hooks`` after the step and keeps
    ``layouts`` (see :meth:`verdict`) across steps."""

    def __init__(self, allow_inf: Sequence[str], hooks: Hooks,
                 layouts: dict[tuple[int, ...], torch.Tensor]) -> None:
        self.allow_inf = tuple(allow_inf)
        self.hooks = hooks
        self.values: list[torch.Tensor] = []  # forward: two per slot, in slot order
        self.kinds: list[int] = []
        self.grad_values: list[torch.Tensor] = []  # backward: two per firing, in order
        self.grad_kinds: list[int] = []
        self.slots: list[_Slot] = []
        self.grad_slots: list[_Slot] = []
        self.fired: list[int] = []  # gradient slots in the order their hooks ran
        self.records: list[_Record] = []
        self._open: dict[tuple[str, int], _Record] = {}
        self._seen: dict[int, _Slot] = {}
        self._grad_seen: dict[int, _Slot] = {}
        self._allowed: dict[str, bool] = {}
        self._layouts = layouts

    def _is_allowed(self, name: str) -> bool:
        if name not in self._allowed:
            self._allowed[name] = any(fnmatch.fnmatchcase(name, p) for p in self.allow_inf)
        return self._allowed[name]

    def _slot(self, t: torch.Tensor, kind: int) -> int:
        known = self._seen.get(id(t))
        if known is not None and known.alive() is t:
            if known.kind == INFO and kind != INFO:  # first an input, now a module's output
                known.kind = kind
                self.kinds[2 * known.index:2 * known.index + 2] = (kind, kind)
            return known.index
        slot = _Slot(len(self.slots), kind, list(t.shape), weakref.ref(t), t._version)
        self.values += torch.aminmax(t.detach())
        self.kinds += (kind, kind)
        self.slots.append(slot)
        self._seen[id(t)] = slot
        return slot.index

    def _grad_slot(self, t: torch.Tensor, lenient: bool) -> int:
        known = self._grad_seen.get(id(t))
        if known is not None and known.alive() is t:
            return known.index
        slot = _Slot(len(self.grad_slots), NAN_ONLY if lenient else STRICT, list(t.shape),
                     weakref.ref(t), t._version)
        self.grad_slots.append(slot)
        self._grad_seen[id(t)] = slot
        self.hooks.tensor(t, partial(self._on_grad, slot))
        return slot.index

    def _on_grad(self, slot: _Slot, grad: torch.Tensor) -> None:
        if grad.numel():
            self.grad_values += torch.aminmax(grad.detach())
            self.grad_kinds += (slot.kind, slot.kind)
            self.fired.append(slot.index)

    def _hook(self, obj: Any, kind: int, lenient: bool, slots: list[int],
              grad_slots: list[int]) -> None:
        """Reduce the checked tensors in ``obj`` and hook the gradients they will get."""
        grad = torch.is_grad_enabled()
        for t in tensors(obj):
            if t.is_floating_point() and t.layout == torch.strided and t.numel():
                slots.append(self._slot(t, kind))
                if grad and t.requires_grad:
                    grad_slots.append(self._grad_slot(t, lenient))

    def enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A selected call starts: reduce its inputs (before an in-place module changes them)."""
        record = self._open[call.key] = _Record(call)
        lenient = self._is_allowed(call.name)
        self._hook((args, kwargs), INFO, lenient, record.inputs, record.grad_inputs)

    def exit(self, call: Call, output: Any) -> None:
        """A selected call returned: reduce its outputs and hook their gradients."""
        record = self._open.pop(call.key, None) or _Record(call)
        lenient = self._is_allowed(call.name)
        self._hook(output, NAN_ONLY if lenient else STRICT, lenient, record.outputs,
                   record.grad_outputs)
        self.records.append(record)

    # ------------------------------------------------------------------ reading

    def stacked(self) -> torch.Tensor | None:
        """Every value so far in one float tensor on their device (forward values first),
        or None when nothing was recorded."""
        values = self.values + self.grad_values
        return torch.stack(values).float() if values else None

    def verdict(self, stacked: torch.Tensor | None) -> torch.Tensor | None:
        """A device boolean: whether a checked value is non-finite (None: nothing recorded)."""
        if stacked is None:
            return None
        layout = tuple(self.kinds + self.grad_kinds)
        kinds = self._layouts.get(layout)
        if kinds is None or kinds.device != stacked.device:
            # The layout repeats step after step: copied to the device once, not per step.
            kinds = torch.tensor(layout, dtype=torch.int8).to(stacked.device)
            self._layouts.clear()
            self._layouts[layout] = kinds
        strict = (kinds == STRICT) & ~torch.isfinite(stacked)
        return (strict | ((kinds == NAN_ONLY) & torch.isnan(stacked))).any()

    def locate(self, host: list[float]) -> Finding | None:
        """Where the first non-finite value came from, given :meth:`stacked` on the host."""
        split = 2 * len(self.slots)
        forward, backward = host[:split], host[split:]
        return self._locate_forward(forward) or self._locate_backward(forward, backward)

    def _finding(self, forward: list[float], record: _Record, phase: str, source: str,
                 produced: str, grad: dict[str, Any] | None = None) -> Finding:
        rows = []
        for i in record.inputs:
            slot = self.slots[i]
            row: dict[str, Any] = {"shape": slot.shape, "min": forward[2 * i],
                                   "max": forward[2 * i + 1]}
            if (alive := slot.alive()) is not None:
                row |= moments(alive.detach()).summary()
            rows.append(row)
        call = record.call
        return Finding(phase, call.name, call.site.type, call.index, source, produced, rows,
                       grad)

    def _locate_forward(self, forward: list[float]) -> Finding | None:
        ok = [_ok(forward, s.kind, 2 * s.index) for s in self.slots]
        # An allowed module's ±inf is an intended input (a mask), not a non-finite one.
        usable = [k or (s.kind == NAN_ONLY and _ok(forward, NAN_ONLY, 2 * s.index))
                  for k, s in zip(ok, self.slots, strict=True)]
        bad = [r for r in self.records if not all(ok[i] for i in r.outputs)]
        record = next((r for r in bad if all(usable[i] for i in r.inputs)), None)
        source = "module" if record is not None else "outside"
        record = record or next(iter(bad), None)
        if record is None:
            return None
        out = next(i for i in record.outputs if not ok[i])
        produced = _describe(forward[2 * out], forward[2 * out + 1], self.slots[out].alive())
        return self._finding(forward, record, "forward", source, produced)

    def _locate_backward(self, forward: list[float], backward: list[float]) -> Finding | None:
        arrived: dict[int, dict[str, Any]] = {}  # gradient slot -> its finite arrival
        for n, index in enumerate(self.fired):
            slot = self.grad_slots[index]
            seen: dict[str, Any] = {"shape": slot.shape, "min": backward[2 * n],
                                    "max": backward[2 * n + 1]}
            if _ok(backward, slot.kind, 2 * n):
                arrived.setdefault(index, seen)
                continue
            produced = _describe(seen["min"], seen["max"], None)
            for record in reversed(self.records):  # the last to run is the first in backward
                if index in record.grad_inputs and record.grad_outputs and \
                        all(i in arrived for i in record.grad_outputs):
                    return self._finding(forward, record, "backward", "module", produced,
                                         arrived[record.grad_outputs[0]])
            producer = next((r for r in self.records if index in r.grad_outputs), None) or \
                next(r for r in self.records if index in r.grad_inputs)
            return self._finding(forward, producer, "backward", "outside", produced, seen)
        return None

    def summary(self, host: list[float]) -> list[dict[str, Any]]:
        """Per call: the (first) output's min and max, and the gradient at it, for the
        flight recorder."""
        split = 2 * len(self.slots)
        forward, backward = host[:split], host[split:]
        arrivals = {index: n for n, index in enumerate(self.fired)}
        rows = []
        for record in self.records:
            row: dict[str, Any] = {"name": record.call.name, "type": record.call.site.type,
                                   "call": record.call.index, "min": None, "max": None,
                                   "grad_min": None, "grad_max": None}
            if record.outputs:
                i = record.outputs[0]
                row["min"], row["max"] = forward[2 * i], forward[2 * i + 1]
            n = arrivals.get(record.grad_outputs[0]) if record.grad_outputs else None
            if n is not None:
                row["grad_min"], row["grad_max"] = backward[2 * n], backward[2 * n + 1]
            rows.append(row)
        return rows


def flight_steps(kept: Iterable[tuple[int, StepFlags | None, Any, list[Any] | None]]
                 ) -> list[dict[str, Any]]:
    """The flight recorder's kept steps, (index, flags, stacked values, rows if logged), as
    ``nonfinite.json`` lists them, oldest first."""
    steps = []
    for index, flags, stacked, rows in kept:
        entry: dict[str, Any] = {"step": index}
        if flags is not None and stacked is not None:
            entry["layers"] = flags.summary(stacked.tolist())
        if rows is not None:
            entry["rows"] = rows
        steps.append(entry)
    return steps


def event_doc(envelope: dict[str, Any], step: int, rank: int | None, message: str,
              finding: Finding, recorded: list[dict[str, Any]] | None) -> dict[str, Any]:
    """``nonfinite.json``: the watch's envelope, the event, and the recorded steps."""
    event = {"step": step, "rank": rank, "message": message} | asdict(finding)
    return envelope | {"event": event, "steps": recorded or []}
