"""Two runs of the same inputs compared module call by module call (``hookscope diff``).

Side A is one model; side B another load of it (other weights, dtype, autocast or device) or
a model whose module names match. :class:`DiffProbe` runs A on a batch, keeping the selected
outputs (by reference; copied only before an in-place write), then runs B on it through a
nested :func:`~hookscope.core.run.drive` whose hooks compare each of B's calls with A's kept
output of the same (name, call index) and drop it: at most one batch of A's outputs is held.
Only float64 sums are kept (:mod:`hookscope.numerics.diffsums`), so reports merge exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hookscope.core.errors import HookscopeError, param
from hookscope.core.hooks import Call, first_tensor, tensors
from hookscope.core.logits import select_logits
from hookscope.core.mergeable import Merges, Row, state
from hookscope.core.run import Probe, Progress, Step, drive
from hookscope.core.select import LEAVES, Selection, Site, all_sites, selecting
from hookscope.numerics.diffsums import DiffSums, compare, count_nonfinite
from hookscope.numerics.moments import as_float
from hookscope.numerics.table import Table
from hookscope.probes.statsdiff import DEFAULT_TOLERANCE, CallRef, Comparison, Key

__all__ = ["DEFAULT_TOLERANCE", "CallRef", "DiffProbe", "DiffReport", "LayerDiff", "OutputDiff",
           "diff_models", "on_side"]


@dataclass(frozen=True)
class LayerDiff(Row):
    """One call's comparison; ``shape_b != shape``: not comparable, the metrics are NaN."""

    name: str
    type: str
    call: int
    shape: list[int]
    shape_b: list[int] | None
    sums: DiffSums = state("merge", default_factory=DiffSums, json=False, compare=False)

    @property
    def relative(self) -> float:
        return self.sums.rel_l2

    def excess(self, tolerance: float) -> str | None:
        """Why this call exceeds ``tolerance`` (``shape``, ``nonfinite``, ``rel_l2``), or None."""
        if self.shape_b != self.shape:
            return "shape"
        if self.sums.nonfinite_a != self.sums.nonfinite_b:
            return "nonfinite"
        return "rel_l2" if self.sums.rel_l2 > tolerance else None  # NaN never exceeds

    def to_dict(self, tolerance: float = math.inf) -> dict[str, Any]:
        s = self.sums
        return super().to_dict() | {
            "max_abs": s.max_abs if s.n else math.nan, "rel_l2": s.rel_l2, "cosine": s.cosine,
            "nonfinite_a": s.nonfinite_a, "nonfinite_b": s.nonfinite_b,
            "exceeds": self.excess(tolerance) is not None}


@dataclass
class OutputDiff(Merges):
    """The final (N, classes) outputs compared: top-1 agreement, max |Δ logit| and KL(a‖b)."""

    inputs: int = state("sum", 0)
    agree: int = state("sum", 0)
    max_abs: float = state("max", 0.0)
    kl_sum: float = state("sum", 0.0)
    kl_max: float = state("max", 0.0)

    def add(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Add one batch of logits (float64 arithmetic)."""
        a, b = a.detach().double(), b.detach().to(a.device).double()
        self.inputs += a.shape[0]
        self.agree += int((a.argmax(1) == b.argmax(1)).sum())
        self.max_abs = max(self.max_abs, float((a - b).abs().max()))
        la, lb = torch.log_softmax(a, dim=1), torch.log_softmax(b, dim=1)
        kl = (la.exp() * (la - lb)).sum(1).clamp(min=0)  # >= 0 but for rounding
        self.kl_sum += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()))

    def to_dict(self) -> dict[str, Any]:
        n = self.inputs
        return {"inputs": n, "top1_agree": self.agree,
                "top1_agreement": self.agree / n if n else math.nan, "max_abs_logit": self.max_abs,
                "kl_mean": self.kl_sum / n if n else math.nan, "kl_max": self.kl_max}


def _both(a: OutputDiff | None, b: OutputDiff | None) -> OutputDiff | None:
    return a.merge(b) if a and b else None  # compared only where both sides' are


@dataclass(frozen=True)
class DiffReport(Comparison, Merges):
    """:class:`DiffProbe`'s report; ``outputs``: the final logits compared, if both are. A
    merge is the report over both reports' inputs: sums added, one-side calls united."""

    layers: list[LayerDiff] = state("rows")
    unmatched_a: list[CallRef] = state("union")
    unmatched_b: list[CallRef] = state("union")
    outputs: OutputDiff | None = state(_both)
    input_shape: list[int] | None = state("first", None)
    measure: ClassVar[str] = "rel_l2"
    predictions_differ: ClassVar[str] = ("the top-1 predictions differ for {} of {} inputs, "
                                         "though no call exceeds the tolerance.")

    @property
    def agreement(self) -> tuple[int, int] | None:
        return None if self.outputs is None else (self.outputs.agree, self.outputs.inputs)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document without its envelope and ``against``."""
        outputs = self.outputs.to_dict() if self.outputs else None
        return {"offline": False, "input_shape": self.input_shape} | self._document(outputs)


def _storage(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage().data_ptr())


class _CopyOnWrite(TorchDispatchMode):
    """While A runs: before an operation writes into a tensor in place, the probe copies
    the kept outputs that share its memory (copying them all cost as much as the comparison)."""

    #: Per operator, the positions of the arguments it writes into (most have none).
    _writes: ClassVar[dict[Any, tuple[tuple[int, str], ...]]] = {}

    def __init__(self, probe: DiffProbe) -> None:
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        writes = self._writes.get(func)
        if writes is None:
            writes = self._writes[func] = tuple(
                (i, arg.name) for i, arg in enumerate(func._schema.arguments)
                if arg.alias_info is not None and arg.alias_info.is_write)
        if writes and self.probe.kept:
            written = [args[i] if i < len(args) else kwargs.get(name) for i, name in writes]
            self.probe.protect(t for t in tensors(written))
        return func(*args, **kwargs)


class _Against(Probe[Any]):
    """Side B of one batch: each selected call is handed to the :class:`DiffProbe`."""

    def __init__(self, owner: DiffProbe, sites: list[Site]) -> None:
        self.owner = owner
        self.sites = sites
        self.output: Any = None

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        self.owner.compare(call, output)

    def observe(self, step: Step, output: Any) -> None:
        self.output = output

    def finish(self) -> Any:
        output, self.output = self.output, None
        return output


class DiffProbe(Probe[DiffReport]):
    """Run A, keep the selected outputs of the batch, run B and compare call by call.

    Args:
        model: side A, which :func:`~hookscope.core.run.drive` runs.
        other: side B, run on the same batches through a nested ``drive``.
        select: the modules compared, selected on A (B's modules of the same names; B's own
            selection is listed when A has no such call).
        tolerance: the relative L2 error above which a call exceeds.
        output_key, other_output_key: the entry holding each side's logits.
        other_autocast: B's ``torch.autocast`` dtype.
    """

    def __init__(self, model: nn.Module, other: nn.Module, *, select: Selection = LEAVES,
                 tolerance: float = DEFAULT_TOLERANCE,
                 output_key: str | None = None, other_output_key: str | None = None,
                 other_autocast: torch.dtype | None = None) -> None:
        if other is model:
            raise HookscopeError(f"{param('other')} is the same module as {param('model')}; "
                                 "load the second side separately.")
        self.sites = select.sites(model)
        self.other, self.other_autocast = other, other_autocast
        self.against = _Against(self, _other_sites(other, {s.name for s in self.sites}, select))
        self.tolerance = tolerance
        self.output_key, self.other_output_key = output_key, other_output_key
        self.table = Table(DiffSums.from_values)
        #: A's outputs of the current batch not yet compared; never more than one batch.
        self.kept: dict[Key, torch.Tensor] = {}
        self.peak_kept = 0
        #: Kept outputs not yet copied, by the address of the memory they share.
        self._storages: dict[int, list[Key]] = {}
        self.meta: dict[Key, tuple[str, list[int], list[int] | None]] = {}
        self.without_tensor: set[Key] = set()
        self.only_a: dict[Key, CallRef] = {}
        self.only_b: dict[Key, CallRef] = {}
        self.outputs: OutputDiff | None = OutputDiff()
        self.input_shape: list[int] | None = None

    def on_exit(self, call: Call, args: Any, kwargs: Any, output: Any) -> None:
        found = first_tensor(output)
        if found is None:
            self.without_tensor.add(call.key)
            return
        if call.key not in self.meta:
            self.meta[call.key] = (call.site.type, list(found.shape), None)
        # A reference: _CopyOnWrite copies it only before an in-place write into it.
        kept = self.kept[call.key] = found.detach()
        self._storages.setdefault(_storage(kept), []).append(call.key)
        self.peak_kept = max(self.peak_kept, len(self.kept))

    def protect(self, tensors: Iterable[torch.Tensor]) -> None:
        """Copy the kept outputs that share memory with ``tensors``, about to change in place."""
        for tensor in tensors:
            for key in self._storages.pop(_storage(tensor), ()):
                if key in self.kept:
                    self.kept[key] = self.kept[key].clone()

    def compare(self, call: Call, output: Any) -> None:
        """B's call ``call`` returned ``output``: compare it with A's kept output, drop that."""
        key = call.key
        kept = self.kept.pop(key, None)
        found = first_tensor(output)
        if kept is None or found is None:
            if key not in self.without_tensor:
                self.only_b.setdefault(key, CallRef(call.name, call.site.type, call.index))
            return
        type_a, shape, shape_b = self.meta[key]
        if kept.shape != found.shape:  # reported with this batch's shapes, and kept so
            self.meta[key] = (type_a, list(kept.shape), list(found.shape))
            self.table.put(key, count_nonfinite(kept, found))
            return
        if shape_b is None:  # shapes as in the first batch, like `stats`
            self.meta[key] = (type_a, shape, list(found.shape))
        a = as_float(kept).reshape(-1)
        del kept
        self.table.put(key, compare(a, as_float(found).reshape(-1).to(a.device, a.dtype)))

    def step(self, step: Step) -> None:
        with _CopyOnWrite(self), on_side("A"):
            output = step.forward()
        self._storages.clear()
        logits = select_logits(output, self.output_key, required=False)
        del output
        if self.input_shape is None:
            found = first_tensor(step.x)
            self.input_shape = list(found.shape[1:]) if found is not None else None
        # B gets the batch as preprocessed, before the cast to A's dtype, when it is known.
        x = step.batch.tensor if step.batch is not None else step.x
        try:
            with on_side("B"):
                output = drive(self.other, x, self.against, autocast=self.other_autocast)
        finally:
            for key in self.kept:
                self.only_a.setdefault(key, CallRef(key[0], self.meta[key][0], key[1]))
            self.kept.clear()
        self.table.flush()
        a, b = logits, select_logits(output, self.other_output_key, required=False)
        if a is None or b is None or a.dim() != 2 or a.shape != b.shape or a.shape[1] < 2:
            self.outputs = None  # not (N, classes) logits on both sides
        elif self.outputs is not None:
            self.outputs.add(a, b)

    def finish(self) -> DiffReport:
        rows = [LayerDiff(key[0], type_a, key[1], shape, shape_b, self.table.get(key) or DiffSums())
                for key, (type_a, shape, shape_b) in self.meta.items()
                if shape_b is not None]  # compared at least once
        outputs = self.outputs if self.outputs is not None and self.outputs.inputs else None
        return DiffReport(self.tolerance, rows, list(self.only_a.values()),
                          list(self.only_b.values()), outputs, self.input_shape)


def _other_sites(other: nn.Module, names: set[str], select: Selection) -> list[Site]:
    """B's modules named like A's selected ones, and those B's own selection picks."""
    try:
        own = {s.name for s in select.sites(other)}
    except HookscopeError:  # the selection matches nothing in B: its names alone are paired
        own = set()
    return [s for s in all_sites(other) if s.name in names or s.name in own]


@contextmanager
def on_side(side: str, renames: Mapping[str, str] | None = None) -> Iterator[None]:
    """Name the side (``A``, or ``B``: the run against) in any error raised inside;
    ``renames`` maps the option a message should name to the one it names (``against_*``)."""
    try:
        yield
    except HookscopeError as exc:
        text = str(exc.args[0]) if exc.args else ""
        if not text.startswith("Side "):
            what = "A" if side == "A" else "B (the second run, against)"
            for option, own in (renames or {}).items():
                text = text.replace(param(own), param(option))
            exc.args = (f"Side {what}: {text}", *exc.args[1:])
        raise


@selecting
def diff_models(model: nn.Module, other: nn.Module, inputs: Any, *, autocast: torch.dtype | None = None,
                output_key: str | None = None, progress: Progress | None = None,
                **options: Any) -> DiffReport:
    """Run ``model`` and ``other`` on the same ``inputs`` (a batch, or an iterable of them)
    and compare each selected call. ``options`` are :class:`DiffProbe`'s (``select``, or the
    keywords ``layers``, ``types``, ``all_modules``, ``max_depth``; ``tolerance``,
    ``other_autocast``); ``autocast`` is A's ``torch.autocast`` dtype, ``output_key`` both
    sides' logits entry, ``progress`` called with each batch's size."""
    probe = DiffProbe(model, other, output_key=output_key, other_output_key=output_key, **options)
    return drive(model, inputs, probe, autocast=autocast, progress=progress)
