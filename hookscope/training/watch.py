"""``hookscope.watch``: watch a model while it trains.

The user's loop owns the batches, loss and optimiser, so the watch is not a probe of
:func:`hookscope.core.run.drive` but reuses its pieces: the :class:`~hookscope.core.hooks.Tracer`
and :class:`~hookscope.core.hooks.Hooks` (all removed on exit, error and Ctrl-C), the module
selection, and on a logging step the ``stats`` and ``grads`` probes with their mergeable
reports. Each step carries only the fused non-finite flags, read once at ``.step()``.
Forward passes with autograd off (validation) are not watched. The watch never changes the
model's ``training`` flags, parameters or buffers.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict
from numbers import Real
from os import PathLike
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookscope import __version__
from hookscope.core.distributed import Group
from hookscope.core.errors import HookscopeError, param
from hookscope.core.hooks import Call, Hooks, Tracer, model_device
from hookscope.core.select import Selection, hooked_sites
from hookscope.training.log_writer import WatchLog
from hookscope.training.nonfinite import (
    NonFiniteError,
    NonfiniteFinding,
    StepFlags,
    Warnings,
    flight_steps,
)
from hookscope.training.records import (
    Drift,
    Health,
    LoggingStep,
    ParamTracker,
    StepReports,
    layer_rows,
    number,
    step_line,
)

__all__ = ["MODES", "Watch", "watch"]

log = logging.getLogger("hookscope")
MODES = ("raise", "warn", "off")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HookscopeError(f"{param(name)} must be a whole number of at least 1, not {value!r}.")
    return value


_PATH, _SWITCH = (str, PathLike), (bool, "True or False")
_KINDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "log_dir": (_PATH, "a path"), "reference": ((*_PATH, type(None)), "a path"),
    "name": ((str, type(None)), "a string"), "force": _SWITCH, "tensorboard": _SWITCH,
    "model": (nn.Module, "a torch.nn.Module")}


def _check_kinds(**values: Any) -> None:
    """Refuse a value of the wrong kind for a path, a name or a switch."""
    for key, value in values.items():
        kinds, said = _KINDS[key]
        if not isinstance(value, kinds):
            raise HookscopeError(f"{param(key)} must be {said}, not {value!r:.40}.")


def _check_mode(nonfinite: Any, max_drift: Any) -> None:
    if nonfinite not in MODES:
        raise HookscopeError(f"{param('nonfinite')} {nonfinite!r}: choose one of {', '.join(MODES)}.")
    if isinstance(max_drift, bool) or not (isinstance(max_drift, (int, float)) and max_drift >= 0):
        raise HookscopeError(f"{param('max_drift')} must be a non-negative number.")


def _names(name: str, value: Any) -> list[str]:
    """A str is one name or pattern; else a sequence of non-empty strings."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) and v for v in items):
        raise HookscopeError(f"{param(name)} must be a name or a list of names (strings), "
                             f"not {value!r}.")
    return list(items)


def _materialised(model: nn.Module) -> nn.Module:
    lazy = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if nn.parameter.is_lazy(t)]
    if lazy:
        raise HookscopeError(f"{param('model')} has lazy parameters not yet materialised "
                             f"({', '.join(lazy[:3])}); run one forward pass before watching it.")
    return model


def _loss(loss: Any) -> Any:
    """``loss`` when it is None, a real number or a one-element tensor (read on logging steps)."""
    tensor, number = isinstance(loss, torch.Tensor), isinstance(loss, Real) and not isinstance(loss, bool)
    if not (loss is None or number or tensor and loss.numel() == 1):
        got = f"a tensor of shape {tuple(loss.shape)} (reduction='none'? pass its mean)" if tensor \
            else f"{type(loss).__name__} {loss!r:.40}"
        raise HookscopeError(f"{param('loss')} must be a number or a one-element tensor, not {got}.")
    return loss


def _eager(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn``, run outside the graph where torch.compile traces the hook that calls it (dynamo
    would otherwise trace it, and recompile for every tensor it sees); called directly
    otherwise, without ``torch.compiler.disable``'s wrapper (about 3 µs a call)."""
    outside = torch.compiler.disable(fn)

    def call(*args: Any) -> None:
        (outside if torch.compiler.is_compiling() else fn)(*args)

    return call


class _Scale:
    """A watch's ``torch.amp.GradScaler`` (or None) and the scale of the step in progress."""

    def __init__(self, scaler: torch.amp.GradScaler | None) -> None:
        if scaler is not None and not callable(getattr(scaler, "get_scale", None)):
            raise HookscopeError(f"{param('scaler')} must be a torch.amp.GradScaler, not "
                                 f"{type(scaler).__name__}.")
        self.scaler = scaler
        self.scale = None if scaler is None else scaler.get_scale()  # this step's backward's

    def read(self) -> tuple[float, bool] | None:
        """The scale this step's backward ran under, and whether the scaler skipped its
        optimiser step (then its ``update()`` lowered the scale); None without a scaler."""
        if self.scaler is None or self.scale is None:
            return None
        used, self.scale = self.scale, self.scaler.get_scale()
        return used, self.scale < used


class Watch:
    """Watch ``model`` (a DDP wrapper or the module) while a training loop runs:
    ``with watch(model, log_dir) as w``, and ``w.step(loss)`` after each optimiser step.
    Every step is checked for NaN and ±inf, forward and backward; every ``every`` steps
    (0, ``every``, ...) a line goes to ``log_dir/watch.jsonl``.

    The options (docs/watch.md): ``layers``/``types`` select the modules (leaves by default);
    ``nonfinite`` is ``"raise"`` (a :class:`NonFiniteError`), ``"warn"`` or ``"off"``;
    ``allow_inf`` names modules whose ±inf is intended; the last ``keep`` steps go to
    ``nonfinite.json``; ``tensorboard`` also writes TensorBoard events; ``reference`` (a
    ``stats`` JSON document; default: the first logging step), ``max_drift`` and
    ``percentiles`` set the drift; ``name`` names the model; ``force`` replaces a log;
    ``scaler`` (mixed precision's ``torch.amp.GradScaler``) unscales the logged gradients and
    marks the steps it skipped. ``index`` is the step in progress; with ``"warn"``,
    ``findings`` holds each (step, rank, finding) warned about.

    Raises:
        HookscopeError: bad arguments (a str for ``layers``, ``types`` or ``allow_inf`` is
            one name), a model with lazy parameters, a selection matching nothing, an existing
            log without ``force``, an unreadable reference.
    """

    def __init__(self, model: nn.Module, log_dir: str | Path, *, every: int = 100,
                 layers: Sequence[str] | None = None, types: Sequence[str] | None = None,
                 nonfinite: str = "raise", allow_inf: Sequence[str] = (), keep: int = 8,
                 tensorboard: bool = False, reference: str | Path | None = None,
                 max_drift: float = 1.0,
                 percentiles: str | Sequence[float] | None = None, name: str | None = None,
                 force: bool = False, scaler: torch.amp.GradScaler | None = None) -> None:
        _check_mode(nonfinite, max_drift)
        _check_kinds(model=model, log_dir=log_dir, reference=reference, name=name, force=force,
                     tensorboard=tensorboard)
        self.model, self.log_dir = _materialised(model), Path(log_dir)
        self.every, self.keep = _positive("every", every), _positive("keep", keep)
        self.select = Selection(_names("layers", layers or []) or None,
                                _names("types", types or []) or None)
        self.sites = self.select.sites(model)
        self.nonfinite, self.allow_inf = nonfinite, tuple(_names("allow_inf", allow_inf))
        self.drift = Drift.of(reference, float(max_drift), percentiles)
        self.health = Health(self.allow_inf)
        self.reference, self.tensorboard, self.force = reference, tensorboard, force
        self.amp = _Scale(scaler)
        # A torch.compile'd model is an OptimizedModule around the user's own.
        self.name = name or type(getattr(model, "_orig_mod", model)).__name__
        self.index = 0  # the step in progress
        self.findings: list[tuple[int, int, NonfiniteFinding]] = []
        self._warnings = Warnings()
        # The check sees every module, the model itself too (a parent is blamed for what its
        # own code makes); the logging probes only the selected ones.
        self._logged = {s.name for s in self.sites}
        hooked = self.sites if nonfinite == "off" else hooked_sites(model)
        self.tracer = Tracer(model, hooked, on_enter=_eager(self._enter), on_exit=_eager(self._exit))
        self.params = ParamTracker(model)
        self.group = Group()
        #: The flight recorder: (step, flags, rows if logged).
        self.recorder: deque[tuple[int, StepFlags | None, list[Any] | None]] = \
            deque(maxlen=self.keep)
        self._hooks = Hooks()
        self._flags: StepFlags | None = None
        self._logging: LoggingStep | None = None
        self._parts: list[StepFlags | LoggingStep] = []
        self._writer: WatchLog | None = None
        self._open = False

    # ------------------------------------------------------------------ the block

    def __enter__(self) -> Watch:
        self.group = Group.current()
        failure = None
        if self.group.leader:
            try:
                self._writer = WatchLog(self.log_dir, force=self.force,
                                        tensorboard=self.tensorboard)
            except HookscopeError as exc:
                failure = exc.render()
        agreed = self.group.first_failure(failure)  # the first failure of any rank
        if agreed is not None:
            self._cleanup()
            raise HookscopeError(agreed)
        if self._writer is not None:
            self._writer.write(self.envelope())
        self._open = True
        try:
            self._begin()
        except BaseException:
            self._cleanup()
            raise
        return self

    def envelope(self) -> dict[str, Any]:
        """The first line of ``watch.jsonl``."""
        return {"hookscope": __version__, "command": "watch", "model": self.name,
                "device": str(model_device(self.model)), "world_size": self.group.size,
                "selection": {"layers": self.select.layers, "types": self.select.types,
                              "modules": [s.name for s in self.sites]},
                "every": self.every, "nonfinite": self.nonfinite,
                "allow_inf": list(self.allow_inf), "keep": self.keep,
                "reference": str(self.reference) if self.reference is not None else None,
                "max_drift": self.drift.limit, "drift_measure": self.drift.measure,
                "percentiles": list(self.drift.percentiles),
                "started": time.time()}

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(exc)

    def close(self, exc: BaseException | None = None) -> None:
        """Leave the watch, as the block does (``exc``: the exception leaving it): an unended
        step is checked (a :class:`NonFiniteError` raised from ``exc``), every hook removed."""
        try:
            # One process only: under DDP every rank would have to agree that it exists.
            if self._open and self.group.size == 1 and self._pending():
                if exc is None:
                    self._end(None, self.amp.read())
                elif isinstance(exc, Exception):
                    self._end_failed(exc)
        finally:
            self._warnings.told()
            self._cleanup()

    def _end_failed(self, exc: Exception) -> None:
        try:  # the step an exception ended: its flags alone, no line logged
            self._end(None, logged=False)
        except NonFiniteError as found:
            raise found from exc

    def _pending(self) -> bool:
        return bool(self._flags and self._flags.records or self._logging and self._logging.stats.order)

    def _cleanup(self) -> None:
        self._open = False
        self._hooks.remove()
        self.tracer.remove()
        self._flags = self._logging = None
        self._parts = []
        if self._writer is not None:
            self._writer.close()
        self._writer = None

    # ------------------------------------------------------------------ hooks

    def _enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if torch.is_grad_enabled():  # else a validation forward pass: not a training step's
            for part in self._parts:
                if part is self._flags or call.name in self._logged:
                    part.enter(call, args, kwargs)

    def _exit(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: Any) -> None:
        if torch.is_grad_enabled():
            for part in self._parts:
                if part is self._flags or call.name in self._logged:
                    part.exit(call, args, kwargs, output)

    # ------------------------------------------------------------------ steps

    def _begin(self) -> None:
        self._hooks = Hooks()
        self._flags = None if self.nonfinite == "off" else \
            StepFlags(self.allow_inf, self._hooks)
        self._logging = None
        if self.index % self.every == 0:  # a logging step
            self._logging = LoggingStep(self.model, self.sites, self._hooks,
                                        self.drift.percentiles)
            self.params.attach(self._hooks)
        self._parts = [p for p in (self._flags, self._logging) if p is not None]
        if self._parts:
            self.tracer.attach()
        else:
            self.tracer.remove()  # an off-step without the check carries no hook at all
        self.tracer.reset()

    def step(self, loss: Any = None) -> None:
        """End one training step (after ``optimizer.step()``, and ``scaler.update()`` under
        a ``GradScaler``); ``loss`` (a number or a one-element tensor) is recorded on logging
        steps.

        Raises:
            NonFiniteError: with ``nonfinite="raise"``, a non-finite value appeared in this
                step (on any rank; in the forward only, when the scaler skipped the step for
                its non-finite gradients); the watch is closed and every hook removed.
            HookscopeError: ``loss`` is not one number (the step stays open).
        """
        if not self._open:
            raise HookscopeError("watch.step() was called outside the watch's `with` block.")
        loss = _loss(loss)
        try:
            self._end(loss, self.amp.read())
        except BaseException:
            self._cleanup()
            raise
        self.index += 1
        self._begin()

    def _end(self, loss: Any, amp: tuple[float, bool] | None = None, logged: bool = True) -> None:
        """Check the step, write its line on a logging step, and report a non-finite value
        (``amp``: see :meth:`_Scale.read`; a skipped step's gradients are the scaler's business)."""
        flags, logging_step = self._flags, self._logging if logged else None
        self._hooks.remove()
        skipped = amp is not None and amp[1]
        failing = [] if flags is None else self.group.failing(flags.verdict(backward=not skipped))
        rows = self._log(logging_step, loss, amp) if logging_step is not None else None
        self.recorder.append((self.index, flags, rows))
        if failing:
            self._nonfinite(failing[0], flags)

    def _log(self, step: LoggingStep, loss: Any,
             amp: tuple[float, bool] | None) -> list[dict[str, Any]] | None:
        """The logging step's line: merged over ranks and written by rank 0 (under a
        scaler, the gradients divided by its scale, which the line records)."""
        merged = self.group.gathered(StepReports(*step.reports()))
        params = self.params.rows()
        if merged is None:
            return None
        rows, loss = layer_rows(merged), number(loss)
        self.health.apply(rows, loss)
        self.drift.apply(rows)
        line = step_line(self.index, loss, rows, params)
        if amp is not None:
            for row in rows + params:
                for key in ("grad_norm", "grad_mean", "grad_std"):
                    if row.get(key) is not None:
                        row[key] /= amp[0]
            line |= {"scale": amp[0], "skipped": amp[1]}
        if self._writer is not None:
            self._writer.write(line, self.params.params)
        return rows

    def _nonfinite(self, rank: int, flags: StepFlags | None) -> None:
        finding = None
        if rank == self.group.rank and flags is not None:
            finding = flags.locate(flags.host())
        recorded = flight_steps(self.recorder) if finding else None
        finding, recorded = self.group.share((finding, recorded), rank)
        if finding is None:  # finite values overflowed the verdict's sum: nothing to report
            return
        shown_rank = rank if self.group.size > 1 else None
        message = finding.message(self.index, shown_rank)
        if self._writer is not None and not self.findings:
            event = {"step": self.index, "rank": shown_rank, "message": message} | asdict(finding)
            doc = self.envelope() | {"event": event, "steps": recorded or []}
            log.debug("wrote %s", self._writer.nonfinite(doc))
        if self.nonfinite == "warn":
            self.findings.append((self.index, rank, finding))
            self._warnings.warn(self.index, finding, message, self.params.nonfinite)
            return
        raise NonFiniteError(message, finding, self.index, shown_rank)


#: ``hookscope.watch(model, log_dir, ...)``: see :class:`Watch`.
watch = Watch
