"""The every-step non-finite check: fused device-side flags, read once per step, and the locator.

Each module call's floating-point inputs and outputs (and, through tensor hooks, the
gradients at its outputs and at inputs that need one) are reduced on their device to
``torch.aminmax``: a NaN makes both values NaN, a ±inf shows as the min or max, and nothing
can overflow (an activation's or a reshape's range is derived from its input's, see
``_MONOTONE``). :meth:`StepFlags.verdict` sums the checked ones into one device number, the
step's one host read; only when it is not finite do the values come to the host and
:meth:`StepFlags.locate` names the call that made the first non-finite value (blame by
production): forward, the first call (in finishing order) with a non-finite output from
finite inputs, a parent when its own code made it; backward, the first non-finite gradient
(in arrival order) made from finite gradients at the outputs of the calls that read the
tensor, all of them named when the hooks cannot tell which (they see only the sum). A
tensor is reduced once, keyed by identity and version; references are weak, so no
activation is kept alive.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

import torch
from torch import nn

from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import Call, Hooks, tensors
from hookscope.numerics.moments import moments
from hookscope.probes.debug import FirstNonfinite

__all__ = ["NonfiniteFinding", "NonFiniteError", "StepFlags", "Warnings", "flight_steps"]

log = logging.getLogger("hookscope")

#: Value kinds in the check vector: not checked (an input only), any NaN/inf, NaN only; and
#: a slot's gradient kind when no gradient hook is registered.
INFO, STRICT, NAN_ONLY, NO_GRAD = 0, 1, 2, -1
Pair = tuple[float, float]


def _clamp(v: float, low: float, high: float, dtype: torch.dtype) -> float:
    """``torch.clamp`` of one value of a ``dtype`` tensor (its bounds rounded to the dtype, as
    torch rounds them): NaN stays NaN."""
    if math.isnan(v):
        return v
    low, high = torch.tensor([low, high], dtype=dtype).tolist()
    return min(max(v, low), high)


#: Modules whose output's (min, max) is their own function of the input's (given the module
#: and the output's dtype), computed on the host when a step is read: elementwise,
#: non-decreasing and exact in IEEE arithmetic (a NaN stays NaN, a finite input stays
#: finite), or a reshape, so a large activation is not reduced a second time. Exact types
#: only: a subclass may compute something else.
_MONOTONE: dict[type[nn.Module], Callable[[Any, torch.dtype, float], float]] = {
    nn.ReLU: lambda m, dtype, v: _clamp(v, 0.0, math.inf, dtype),
    nn.ReLU6: lambda m, dtype, v: _clamp(v, m.min_val, m.max_val, dtype),
    nn.Hardtanh: lambda m, dtype, v: _clamp(v, m.min_val, m.max_val, dtype),
    nn.Flatten: lambda m, dtype, v: v,
    nn.Unflatten: lambda m, dtype, v: v,
}


class NonFiniteError(HookscopeError):
    """A training step produced NaN or ±inf; raised by ``watch`` with ``nonfinite="raise"``.

    Attributes (see docs/watch.md): ``module``, ``phase``, ``step``, ``call``, ``inputs``,
    ``type_name``, ``source`` (``"module"``, ``"code"``: a parent's own code, ``"unclear"`` or
    ``"outside"``) and ``rank`` (None: one process).
    """

    exit_code = 1

    def __init__(self, message: str, finding: NonfiniteFinding | None = None, step: int = 0,
                 rank: int | None = None) -> None:
        super().__init__(message)
        f = finding or NonfiniteFinding()
        self.module, self.phase, self.step, self.call = f.module, f.phase, step, f.call
        self.inputs, self.type_name, self.source, self.rank = f.inputs, f.type, f.source, rank

    def __reduce__(self) -> tuple[Any, ...]:
        return (NonFiniteError, (super().__str__(),), dict(self.__dict__))


@dataclass(slots=True, eq=False)
class _Slot:
    """One reduced tensor: where its two values sit (``at``; -1: derived from slot ``source``
    by ``derive``), its shape, a weak reference, and its gradient's check (``grad_kind``)."""

    index: int
    kind: int
    shape: torch.Size
    ref: Any
    version: int
    #: A parent whose own code made it (first seen as a child's input, or as the parent's
    #: output), with the child calls before and after; None: a module's output or the input.
    maker: _Record | None = None
    between: tuple[_Record | None, _Record | None] = (None, None)
    at: int = -1
    source: int = -1
    derive: Callable[[float], float] | None = None
    grad_kind: int = NO_GRAD

    def alive(self) -> torch.Tensor | None:
        t = self.ref()
        return t if t is not None and t._version == self.version else None


@dataclass(slots=True, eq=False)
class _Record:
    """One selected call's slots: its inputs and outputs (their gradients: the slots with a
    ``grad_kind``)."""

    call: Call
    parent: _Record | None = None
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    children: list[_Record] = field(default_factory=list)  # the finished ones, in order
    made: bool = False  # its own code made a tensor (between its children)

    @property
    def label(self) -> str:
        name = self.call.name or "the model"
        return name + (f" (call {self.call.index})" if self.call.index else "")


@dataclass(frozen=True)
class NonfiniteFinding:
    """Where a step's first non-finite value came from (see the module docstring)."""

    phase: str = "forward"
    module: str = ""
    type: str = ""
    call: int = 0
    source: str = "module"
    produced: str = ""
    inputs: list[dict[str, Any]] = field(default_factory=list)
    grad_output: dict[str, Any] | None = None
    #: ``source == "code"``: the child calls the parent's code ran between ("": none).
    between: list[str] = field(default_factory=list)
    #: ``source == "unclear"``: the modules (a parent: its own code) any of which made it.
    candidates: list[str] = field(default_factory=list)

    def message(self, step: int, rank: int | None = None) -> str:
        """The one-line message: ``step 7, forward: act (Log) produced NaN from finite
        inputs (min -0.41, max 2.3)``."""
        where = f"rank {rank}: " if rank is not None else ""
        name = f"{self.module or 'the model'} ({self.type}" + \
            (f", call {self.call})" if self.call else ")")
        head = f"{where}step {step}, {self.phase}: "
        shown = _range(self.inputs)
        made = f"produced {self.produced}" if self.source == "module" else \
            f"made {self.produced} in its own code{self._between()}"
        if self.source == "unclear":
            return (f"{head}{self.produced} in the gradient was made by one of "
                    f"{', '.join(self.candidates)} from finite gradients at their outputs; the "
                    "hooks cannot tell which (they see only the sum at a tensor read twice)")
        if self.phase == "forward" and self.source != "outside":
            return f"{head}{name} {made} from finite inputs{shown}"
        if self.phase == "forward":
            return (f"{head}{name} received {self.produced} from outside the modules "
                    f"(the model's input){shown}")
        grad = _range([self.grad_output] if self.grad_output else [])
        if self.source != "outside":
            return (f"{head}{name} {made} in the gradient of its input from a "
                    f"finite gradient at its output{grad}; its inputs{shown or ' unknown'}")
        return (f"{head}the gradient at the output of {name} is already {self.produced} "
                "(it comes from the loss or code outside the selected modules)")

    def _between(self) -> str:
        before, after = (self.between + ["", ""])[:2]
        if before and after:
            return f" (between its children {before} and {after})"
        return f" (before its child {after})" if after else f" (after its child {before})" if before else ""


def _range(inputs: list[dict[str, Any]]) -> str:
    lows = [d["min"] for d in inputs if d.get("min") is not None and math.isfinite(d["min"])]
    highs = [d["max"] for d in inputs if d.get("max") is not None and math.isfinite(d["max"])]
    if not lows or not highs:
        return ""
    return f" (min {min(lows):.4g}, max {max(highs):.4g})"


def _describe(pair: Pair) -> str:
    """What a tensor's (min, max) say it holds: ``NaN``, ``-inf and +inf``, ``+inf``,
    ``finite`` (lower-cased, the ``values`` of ``nonfinite.json``: JSON has no NaN)."""
    lo, hi = pair
    if math.isnan(lo) or math.isnan(hi):
        return "NaN"
    return " and ".join(w for w, bad in (("-inf", math.isinf(lo)), ("+inf", math.isinf(hi)))
                        if bad) or "finite"


def _ok(pair: Pair, kind: int) -> bool:
    """Whether a tensor's (min, max) pass a check of ``kind``."""
    if kind == NAN_ONLY:
        return not any(map(math.isnan, pair))
    return all(map(math.isfinite, pair))


@lru_cache(maxsize=4096)  # per (patterns, name): a watch makes a StepFlags per step
def _matches(patterns: tuple[str, ...], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


class StepFlags:
    """The flags one training step's hooks recorded: ``allow_inf`` names modules whose ±inf
    is intended (NaN still counts); the owner removes ``hooks`` after the step."""

    def __init__(self, allow_inf: Sequence[str], hooks: Hooks) -> None:
        self.hooks = hooks
        self.values: list[torch.Tensor] = []  # forward: a (min, max) per reduced slot
        self.grad_values: list[torch.Tensor] = []  # backward: a (min, max) per firing, in order
        #: The checked values (a view of the above): for any NaN or ±inf, for NaN only;
        #: the forward's and the backward's.
        self.checked: dict[int, list[torch.Tensor]] = {STRICT: [], NAN_ONLY: []}
        self.grad_checked: dict[int, list[torch.Tensor]] = {STRICT: [], NAN_ONLY: []}
        self.slots: list[_Slot] = []
        self.fired: list[int] = []  # the slots whose gradient hooks ran, in that order
        self.records: list[_Record] = []
        self._open: list[_Record] = []  # the calls running, outermost first
        self._seen: dict[int, _Slot] = {}
        self._allow_inf = tuple(allow_inf)

    def _pair(self, slot: _Slot) -> list[torch.Tensor]:
        """The device (min, max) that decide ``slot``: its own, or its source's."""
        while slot.at < 0:
            slot = self.slots[slot.source]
        return self.values[slot.at:slot.at + 2]

    def _slot(self, t: torch.Tensor, kind: int, maker: _Record | None, after: _Record | None,
              source: int, derive: Callable[[float], float] | None) -> _Slot:
        """The slot of ``t``; ``maker``: the parent whose code made ``t`` if it is new here,
        before call ``after``; ``derive``: its (min, max) are this function of slot
        ``source``'s (see ``_MONOTONE``)."""
        known = self._seen.get(id(t))
        if known is not None and known.alive() is t:
            if known.kind == INFO and kind != INFO:  # first an input, now a module's output
                known.kind = kind
                self.checked[kind] += self._pair(known)
            return known
        between = (maker.children[-1] if maker.children else None, after) if maker else (None, None)
        slot = self._seen[id(t)] = _Slot(len(self.slots), kind, t.shape, weakref.ref(t),
                                         t._version, maker, between)
        self.slots.append(slot)
        if derive is not None:
            slot.source, slot.derive = source, derive
            # Derived values are non-finite only where the source's are: checked through them.
            if kind != INFO and self.slots[source].kind != STRICT:
                self.checked[kind] += self._pair(slot)
        else:
            slot.at = len(self.values)
            pair = torch.aminmax(t.detach())
            self.values += pair
            if kind != INFO:
                self.checked[kind] += pair
        if maker is not None:
            maker.made = True
        return slot

    def _on_grad(self, slot: _Slot, grad: torch.Tensor) -> None:
        if grad.numel():
            pair = torch.aminmax(grad.detach() if grad.requires_grad else grad)
            self.grad_values += pair
            self.grad_checked[slot.grad_kind] += pair
            self.fired.append(slot.index)

    def _hook(self, obj: Any, call: Call, kind: int, slots: list[int], maker: _Record | None,
              after: _Record | None = None, source: int = -1,
              derive: Callable[[float], float] | None = None) -> None:
        """Reduce the checked tensors in ``obj`` and hook the gradients they will get."""
        lenient = bool(self._allow_inf) and _matches(self._allow_inf, call.name)
        if kind != INFO and lenient:
            kind = NAN_ONLY
        grad = torch.is_grad_enabled()
        for t in tensors(obj):
            if t.is_floating_point() and t.layout == torch.strided and t.numel():
                slot = self._slot(t, kind, maker, after, source, derive)
                slots.append(slot.index)
                if grad and slot.grad_kind == NO_GRAD and t.requires_grad:
                    slot.grad_kind = NAN_ONLY if lenient else STRICT
                    self.hooks.keep(t.register_hook(partial(self._on_grad, slot)))

    def enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A selected call starts: reduce its inputs (before an in-place module changes them)."""
        parent = self._open[-1] if self._open else None
        record = _Record(call, parent)
        self._open.append(record)
        given = args[0] if len(args) == 1 and not kwargs else (args, kwargs)  # mostly one tensor
        self._hook(given, call, INFO, record.inputs, parent, record)

    def exit(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """A selected call returned: reduce its outputs and hook their gradients."""
        running = self._open
        if running and running[-1].call is call:  # mostly the innermost running call
            record = running.pop()
        else:
            i = next((i for i in reversed(range(len(running))) if running[i].call is call), None)
            record = _Record(call) if i is None else running.pop(i)
        module = call.site.module
        derive = _MONOTONE.get(type(module))
        source = -1
        if derive is not None and len(record.inputs) == 1 and isinstance(output, torch.Tensor):
            # The input's range as the call started, in the output's dtype.
            source, derive = record.inputs[0], partial(derive, module, output.dtype)
        else:
            derive = None
        # A new tensor at a leaf's exit is its output; at a parent's, its own code made it.
        self._hook(output, call, STRICT, record.outputs, record if record.children else None,
                   source=source, derive=derive)
        self.records.append(record)
        if record.parent is not None:
            record.parent.children.append(record)

    # ------------------------------------------------------------------ reading

    def host(self) -> list[float]:
        """Every slot's (min, max), then every firing's, flat, on the host (a derived slot's
        computed from its source's): read only when a step is reported (the flight recorder
        keeps the flags, not a copy of their values)."""
        values = self.values + self.grad_values
        read = torch.stack(values).float().tolist() if values else []
        forward: list[float] = []
        for slot in self.slots:
            if slot.derive is None:
                forward += read[slot.at:slot.at + 2]
            else:
                forward += map(slot.derive, forward[2 * slot.source:2 * slot.source + 2])
        return forward + read[len(self.values):]

    def verdict(self, backward: bool = True) -> torch.Tensor | None:
        """A device number, non-finite where a checked value may be (None: nothing checked);
        the forward values only unless ``backward``. One sum: a NaN or ±inf anywhere makes it
        non-finite (where ±inf is allowed, only a NaN: ``nan_to_num`` maps the infinities to
        0); finite values that overflow it only send the values to the host, where
        :meth:`locate` finds nothing."""
        grads = self.grad_checked if backward else {STRICT: [], NAN_ONLY: []}
        strict = self.checked[STRICT] + grads[STRICT]
        lenient = self.checked[NAN_ONLY] + grads[NAN_ONLY]
        if lenient:
            allowed = torch.stack(lenient).nan_to_num(nan=math.nan, posinf=0.0, neginf=0.0)
            strict.append(allowed.float().sum())
        return torch.stack(strict).float().sum() if strict else None

    def _split(self, host: list[float]) -> tuple[list[Pair], list[Pair]]:
        """:meth:`host` as (min, max) pairs: the slots', then the firings'."""
        pairs = list(zip(host[::2], host[1::2], strict=True))
        return pairs[:len(self.slots)], pairs[len(self.slots):]

    def locate(self, host: list[float]) -> NonfiniteFinding | None:
        """Where the first non-finite value came from, given :meth:`host`."""
        forward, backward = self._split(host)
        return self._locate_forward(forward) or self._locate_backward(forward, backward)

    def _finding(self, forward: list[Pair], record: _Record, phase: str, source: str,
                 produced: str, grad: dict[str, Any] | None = None,
                 **more: list[str]) -> NonfiniteFinding:
        rows = []
        for i in record.inputs:
            slot, alive = self.slots[i], self.slots[i].alive()
            row = {"shape": list(slot.shape), "min": forward[i][0], "max": forward[i][1],
                   "values": _describe(forward[i]).lower()}
            rows.append(row if alive is None else row | moments(alive.detach()).summary())
        call = record.call
        return NonfiniteFinding(phase, call.name, call.site.type, call.index, source, produced,
                                rows, grad, **more)

    def _locate_forward(self, forward: list[Pair]) -> NonfiniteFinding | None:
        ok = [_ok(pair, s.kind) for pair, s in zip(forward, self.slots, strict=True)]
        # An allowed module's ±inf is an intended input (a mask), not a non-finite one.
        usable = [k or (s.kind == NAN_ONLY and _ok(pair, NAN_ONLY))
                  for k, s, pair in zip(ok, self.slots, forward, strict=True)]
        finite = {id(r): all(usable[i] for i in r.inputs) for r in self.records}
        rule: FirstNonfinite[_Record] = FirstNonfinite()
        for r in self.records:  # children finish first: a parent is blamed for its own code
            rule.finished(r, finite[id(r)], all(ok[i] for i in r.outputs))
        if (found := rule.origin()) is None:
            return None
        record, source = found
        bad = next(i for i in record.outputs if not ok[i])
        if source == "outside":  # made in a parent's code, unless it is the model's input
            bad = next(i for i in record.inputs if not usable[i])
            maker = self.slots[bad].maker
            if maker is not None and finite.get(id(maker)):
                record, source = maker, "code"
        elif record.children:
            source = "code"
            bad = next((s.index for s in self.slots if s.maker is record and not ok[s.index]), bad)
        between = [r.label if r else "" for r in self.slots[bad].between] if source == "code" else []
        return self._finding(forward, record, "forward", source, _describe(forward[bad]),
                             between=between)

    def _locate_backward(self, forward: list[Pair], backward: list[Pair]) -> NonfiniteFinding | None:
        arrived: dict[int, dict[str, Any]] = {}  # gradient slot -> its finite arrival
        for index, pair in zip(self.fired, backward, strict=True):
            slot = self.slots[index]
            seen: dict[str, Any] = {"shape": list(slot.shape), "min": pair[0], "max": pair[1]}
            if _ok(pair, slot.grad_kind):
                arrived.setdefault(index, seen)
                continue
            produced = _describe(pair)
            makers = self._grad_makers(index, arrived)
            if len(makers) == 1:
                (record,) = makers
                source = "code" if record.children else "module"
                return self._finding(forward, record, "backward", source, produced,
                                     arrived[self._grads(record.outputs)[0]])
            if makers:
                names = [r.label + (" (its own code)" if r.children else "") for r in makers]
                return self._finding(forward, makers[-1], "backward", "unclear", produced,
                                     arrived[self._grads(makers[-1].outputs)[0]], candidates=names)
            producer = next((r for r in self.records if index in r.outputs), None) or \
                next(r for r in self.records if index in r.inputs)
            return self._finding(forward, producer, "backward", "outside", produced, seen)
        return None

    def _grad_makers(self, index: int, arrived: dict[int, Any]) -> list[_Record]:
        """The calls that may have made gradient slot ``index`` (the gradient of a tensor they
        read) from finite gradients at their outputs: each reader that passes the tensor to no
        child, and each that does but whose own code also made tensors (it may read it too)."""
        readers = [r for r in self.records if index in r.inputs]
        passing = {id(r.parent) for r in readers}
        return [r for r in readers
                if (id(r) not in passing or r.made) and (outs := self._grads(r.outputs))
                and all(i in arrived for i in outs)]

    def _grads(self, indices: list[int]) -> list[int]:
        """The slots among ``indices`` whose gradient is hooked."""
        return [i for i in indices if self.slots[i].grad_kind != NO_GRAD]

    def summary(self, host: list[float]) -> list[dict[str, Any]]:
        """Per call: the (first) output's min, max and ``values`` (null: no output), and the
        gradient's at it (null: none arrived), for the flight recorder."""
        forward, backward = self._split(host)
        arrivals = {index: backward[n] for n, index in enumerate(self.fired)}
        rows = []
        for record in self.records:
            out = forward[record.outputs[0]] if record.outputs else None
            hooked = self._grads(record.outputs)
            grad = arrivals.get(hooked[0]) if hooked else None
            rows.append({"name": record.call.name, "type": record.call.site.type,
                         "call": record.call.index, "min": out and out[0], "max": out and out[1],
                         "values": out and _describe(out).lower(),
                         "grad_min": grad and grad[0], "grad_max": grad and grad[1],
                         "grad_values": grad and _describe(grad).lower()})
        return rows


def flight_steps(kept: Iterable[tuple[int, StepFlags | None, list[Any] | None]]
                 ) -> list[dict[str, Any]]:
    """The flight recorder's kept steps, (index, flags, rows if logged), as
    ``nonfinite.json`` lists them, oldest first."""
    steps = []
    for index, flags, rows in kept:
        entry: dict[str, Any] = {"step": index}
        if flags is not None and (flags.values or flags.grad_values):
            entry["layers"] = flags.summary(flags.host())
        if rows is not None:
            entry["rows"] = rows
        steps.append(entry)
    return steps


class Warnings:
    """``nonfinite="warn"``'s log: each distinct finding once (its repeats counted, and told
    by :meth:`told`), and once that the parameters themselves are no longer finite."""

    def __init__(self) -> None:
        self.repeats: dict[tuple[Any, ...], tuple[str, list[int]]] = {}
        self.weights_told = False

    def warn(self, step: int, finding: NonfiniteFinding, message: str,
             bad_params: Callable[[], list[str]]) -> None:
        key = (finding.phase, finding.module, finding.call, finding.source, finding.produced)
        if key in self.repeats:
            self.repeats[key][1].append(step)
        else:
            self.repeats[key] = (message, [])
            log.warning(message)
        if not self.weights_told and (bad := bad_params()):
            self.weights_told = True
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            log.warning(f"step {step}: parameter {bad[0]}{more} is no longer finite: the weights "
                        "themselves hold NaN or inf, and later steps' findings follow from them")

    def told(self) -> None:
        """Tell the repeats, once."""
        for message, steps in self.repeats.values():
            if steps:
                log.warning(f"repeated at {len(steps)} later steps (the last: {steps[-1]}): {message}")
        self.repeats.clear()
