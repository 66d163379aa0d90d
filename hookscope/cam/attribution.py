"""Pixel attributions (docs/attribute.md): which input values a target score depends on.

:class:`AttributionProbe` is run by the one driver; per batch, one plain pass picks each
input's target (the objective of :mod:`hookscope.cam.targets`, as for Grad-CAM), then every
method (:mod:`hookscope.cam.attrmethods`) asks its :class:`AttrRun` for gradients or scores
of many derived inputs (the steps of integrated gradients, the noisy copies of SmoothGrad,
the occluded copies), which it evaluates ``batch_cap`` rows per pass: the same numbers in any
batching. Guided backpropagation and DeepLift set their gradient rules through the probe's
hooks (:mod:`hookscope.cam.rules`); the model is left as it was found.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hookscope.cam.attrmethods import Attribution, get_attribution
from hookscope.cam.faithfulness import MetricPlan, class_scorer, metric_plan
from hookscope.cam.passes import or_zeros, score_grads
from hookscope.cam.result import detection_rows
from hookscope.cam.rules import RULE_TYPES, apply_rule, writing_copies
from hookscope.cam.targets import Aim, Focus, Objective, Origins, aim_targets, infer_task
from hookscope.core.errors import HookscopeError, param
from hookscope.core.hooks import Call
from hookscope.core.run import Batch, Probe, Step, drive
from hookscope.core.select import all_sites

__all__ = ["BASELINES", "AttrBatch", "AttrOptions", "AttrReport", "AttrResult", "AttrRun",
           "AttributionProbe", "attr_options", "attribute", "overlay_map", "pair"]

BASELINES = ("zero", "blur", "noise")


@dataclass(frozen=True)
class AttrOptions(Aim):
    """The ``attribute`` command's options (docs/attribute.md): :class:`~hookscope.cam.targets.Aim`'s
    (``seed`` also the noise's; ``metrics`` those of each overlay's map), and

    ``baseline``: ``zero``, ``blur``, ``noise``, a file's path (.npy/.pt of the model input's
    shape) or a tensor; ``noise``: SmoothGrad's standard deviation as a fraction of each
    input's range; ``window``/``stride``: occlusion's, (height, width) in input pixels, the
    window covering every channel, set to ``value``; ``batch_cap``: the most rows one pass
    evaluates.
    """

    methods: Sequence[str] = ("saliency",)
    steps: int = 50
    baseline: Any = "zero"
    samples: int = 50
    noise: float = 0.15
    window: tuple[int, int] = (16, 16)
    stride: tuple[int, int] = (8, 8)
    value: float = 0.0
    batch_cap: int = 32

    def check(self) -> None:
        """Refuse an option out of range (HookscopeError naming it)."""
        for name in ("steps", "samples", "batch_cap"):
            if int(getattr(self, name)) < 1:
                raise HookscopeError(f"{param(name)} must be at least 1.")
        if not self.noise >= 0 or not math.isfinite(self.noise):
            raise HookscopeError(f"{param('noise')} must be a fraction of the input range, 0 "
                                 "or more.")
        for name in ("window", "stride"):
            pair = getattr(self, name)
            if len(pair) != 2 or min(pair) < 1:
                raise HookscopeError(f"{param(name)} must be two sizes of at least 1 pixel "
                                     "(height, width).")
        if any(s > w for s, w in zip(self.stride, self.window, strict=True)):
            raise HookscopeError(f"{param('stride')} {list(self.stride)} is larger than "
                                 f"{param('window')} {list(self.window)}: pixels would be "
                                 "skipped.")
        if isinstance(self.baseline, str) and self.baseline not in BASELINES \
                and not Path(self.baseline).is_file():
            raise HookscopeError(f"{param('baseline')} {self.baseline!r}: give zero, blur, "
                                 "noise or a .npy/.pt file of the model input's shape.")


def pair(value: str | int | Sequence[int], name: str) -> tuple[int, int]:
    """``"16"``, ``"16,8"``, 16 or (16, 8) as (height, width) (HookscopeError otherwise)."""
    if isinstance(value, int):
        return (value, value)
    parts = [p.strip() for p in value.split(",")] if isinstance(value, str) else list(value)
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) not in (1, 2):
        raise HookscopeError(f"{param(name)} {value!r}: give H,W or one size, in pixels.")
    return (sizes[0], sizes[-1])


def attr_options(methods: Sequence[str], **options: Any) -> AttrOptions:
    """Checked :class:`AttrOptions` (``window`` and ``stride`` as :func:`pair` reads them,
    ``metrics`` and ``percentiles`` as :class:`~hookscope.cam.faithfulness.MetricPlan`)."""
    for key in ("window", "stride"):
        if key in options:
            options[key] = pair(options[key], key)
    if options.get("metrics"):
        plan = MetricPlan.make(options["metrics"], options.get("percentiles"))
        options["metrics"], options["percentiles"] = plan.names, plan.percentiles
    opts = AttrOptions(methods=tuple(get_attribution(m).name for m in methods), **options)
    opts.check()
    return opts


def _load_baseline(path: str) -> torch.Tensor:
    try:
        if path.endswith(".npy"):
            return torch.from_numpy(np.load(path, allow_pickle=False))
        found = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one line
        raise HookscopeError(f"{param('baseline')} {path!r} cannot be read "
                             f"({type(exc).__name__}).") from None
    if not isinstance(found, torch.Tensor):
        raise HookscopeError(f"{param('baseline')} {path!r} holds no tensor.")
    return found


def _blur(x: torch.Tensor) -> torch.Tensor:
    """A Gaussian blur of each input, sigma 1/16 of the shorter side."""
    from torchvision.transforms.functional import gaussian_blur

    side = min(x.shape[-2:])
    sigma = max(side / 16.0, 0.5)
    kernel = min(2 * math.ceil(3 * sigma) + 1, side - (1 - side % 2))
    return gaussian_blur(x, [kernel, kernel], [sigma, sigma])


def per_input(x: torch.Tensor, seed: int,
              draw: Callable[[torch.Tensor, torch.Generator], torch.Tensor]) -> torch.Tensor:
    """``draw(x[i], generator)`` stacked over the inputs, input i's generator seeded with
    ``seed + i``: the same numbers for an input in any batching."""
    return torch.stack([draw(xi, torch.Generator().manual_seed((seed + i) % 2**64))
                        for i, xi in enumerate(x)]).to(x)


@dataclass
class AttrResult:
    """One method's attributions for a batch (or a whole run): (N, C, H, W) float32, and per
    input its target, score, sum, and with a baseline the baseline's score and the
    completeness gap sum - (score - baseline score)."""

    method: str
    attributions: np.ndarray
    targets: list[int]
    scores: list[float]
    sums: list[float]
    baseline_scores: list[float | None]
    gaps: list[float | None]
    #: A detector's: per input, the detections explained (Grad-CAM's rows).
    detections: list[list[dict[str, Any]]] | None = None
    #: Per metric asked for, its value per input (Grad-CAM's names).
    metrics: dict[str, np.ndarray] = field(default_factory=dict)

    @staticmethod
    def concat(parts: Sequence[AttrResult]) -> AttrResult:
        def joined(name: str) -> list[Any]:
            return [v for p in parts for v in getattr(p, name) or []]

        first = parts[0]
        return AttrResult(first.method, np.concatenate([p.attributions for p in parts]),
                          joined("targets"), joined("scores"), joined("sums"),
                          joined("baseline_scores"), joined("gaps"),
                          None if first.detections is None else joined("detections"),
                          {k: np.concatenate([p.metrics[k] for p in parts]) for k in first.metrics})


@dataclass
class AttrBatch:
    """One batch's results, for a sink (the ``attribute`` command's writer)."""

    batch: Batch | None
    start: int
    results: dict[str, AttrResult]
    boxes: list[Any]


@dataclass(frozen=True)
class AttrReport:
    """The run's methods and, without a sink, every result."""

    methods: list[str]
    results: dict[str, AttrResult] = field(default_factory=dict)


@dataclass
class Clean:
    """One batch's plain pass (with its baselines beside, when a method needs them): each
    input's target, its score, the baselines and their scores."""

    focus: Focus
    scores: torch.Tensor
    baseline: torch.Tensor
    baseline_scores: torch.Tensor | None = None


class AttrRun:
    """What a method may ask for on one batch: ``x``, its ``baseline``, the clean target
    scores (``clean``), and batched gradients and scores of derived inputs."""

    def __init__(self, probe: AttributionProbe, step: Step, clean: Clean,
                 method: Attribution) -> None:
        self.probe, self.step, self.focus, self.clean = probe, step, clean.focus, clean.scores
        self.options, self.method = probe.options, method
        self.x: torch.Tensor = step.x.detach()
        self.baseline, self.baseline_scores = clean.baseline, clean.baseline_scores

    def _chunks(self, count: int, cap: int) -> Iterator[torch.Tensor]:
        for lo in range(0, count, cap):
            yield torch.arange(lo, min(lo + cap, count), device=self.x.device)

    def gradients(self, count: int, rows: Callable[[torch.Tensor], tuple[torch.Tensor,
                  torch.Tensor]], *, paired: bool = False
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """For ``count`` derived inputs (``rows(index)`` makes them and names the input each
        is scored against), (index, owner, gradient of the target score), a chunk at a time;
        ``paired``: each runs beside its input's baseline (DeepLift)."""
        cap = self.options.batch_cap
        for index in self._chunks(count, max(1, cap // 2) if paired else cap):
            xs, owner = rows(index)
            yield index, owner, self._grad(xs, owner, paired)
            self.step.advance(len(index))

    def _grad(self, xs: torch.Tensor, owner: torch.Tensor, paired: bool) -> torch.Tensor:
        objective = self.probe.objective
        leaf = xs.detach().clone().requires_grad_(True)
        batch = torch.cat([leaf, self.baseline[owner]]) if paired else leaf
        with self.probe.rule(self.method.rule):
            out = objective.output(self.step.forward(batch, grad="grad"))
        found = score_grads(objective, out, self.focus, owner.tolist() * (2 if paired else 1),
                            [leaf])
        return or_zeros(found[0] if found else None, leaf)

    def gradient(self, x: torch.Tensor, *, paired: bool = False) -> torch.Tensor:
        """The gradient of each input's target score at ``x`` (one row per input)."""
        found = torch.zeros_like(x)
        for index, _, grads in self.gradients(len(x), lambda i: (x[i], i), paired=paired):
            found[index] = grads
        return found

    def scores(self, count: int, rows: Callable[[torch.Tensor], tuple[torch.Tensor,
               torch.Tensor]]) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """As :meth:`gradients`, the target scores (plain passes, no autograd)."""
        objective = self.probe.objective
        for index in self._chunks(count, self.options.batch_cap):
            xs, owner = rows(index)
            out = objective.output(self.step.forward(xs, grad="inference"))
            yield index, owner, objective.score(out, self.focus, owner.tolist()).float()
            self.step.advance(len(index))

    def noise(self) -> torch.Tensor:
        """(N, samples, C, H, W) Gaussian noise, each input's from its own generator (seed +
        its position among all inputs), scaled to ``noise`` times the input's range."""
        opts = self.options
        return per_input(self.x, opts.seed + self.step.start, lambda xi, gen: opts.noise * float(
            xi.max() - xi.min()) * torch.randn((opts.samples, *xi.shape), generator=gen))

    def windows(self) -> torch.Tensor:
        """Every occlusion window as a (W, 1, H, W) mask: captum's positions, at multiples
        of the stride, the last in each direction reaching the edge."""
        if self.x.dim() != 4:
            raise HookscopeError(f"occlusion slides a window over images (N, C, H, W); got "
                                 f"{list(self.x.shape)}.")
        (h, w), (wh, ww), (sh, sw) = self.x.shape[-2:], self.options.window, self.options.stride
        if wh > h or ww > w:
            raise HookscopeError(f"{param('window')} {wh}x{ww} is larger than the input "
                                 f"({h}x{w}).")
        tops = [k * sh for k in range(math.ceil((h - wh) / sh) + 1)]
        lefts = [k * sw for k in range(math.ceil((w - ww) / sw) + 1)]
        masks = torch.zeros((len(tops) * len(lefts), 1, h, w), dtype=torch.bool)
        for n, (top, left) in enumerate((t, le) for t in tops for le in lefts):
            masks[n, :, top:top + wh, left:left + ww] = True
        return masks.to(self.x.device)


class AttributionProbe(Probe[AttrReport]):
    """Computes one or more attribution methods, batch by batch (see the module's notes);
    ``sink`` receives each :class:`AttrBatch` (without one, the report keeps them);
    ``n_inputs`` (when known) sizes the progress."""

    grad = "off"
    counts_progress = True

    def __init__(self, model: nn.Module, options: AttrOptions = AttrOptions(), *,
                 transform: Any = None, sink: Callable[[AttrBatch], None] | None = None,
                 n_inputs: int | None = None) -> None:
        if not options.methods:
            raise HookscopeError(f"No attribution method given ({param('method')}).")
        options.check()
        self.options, self.transform, self.sink, self.n_inputs = options, transform, sink, n_inputs
        self.methods = list({m.name: m for m in map(get_attribution, options.methods)}.values())
        self.objective: Objective = options.objective(model)
        self.plan = metric_plan(options.metrics, options.percentiles, options.seed,
                                self.objective.kind)
        base = options.baseline
        self.fixed: torch.Tensor | None = base.detach() if isinstance(base, torch.Tensor) else \
            _load_baseline(base) if isinstance(base, str) and base not in BASELINES else None
        rules = {m.rule for m in self.methods if m.rule}
        types = tuple(t for r in rules for t in RULE_TYPES[r])
        self.sites = [s for s in all_sites(model) if type(s.module) in types]
        self.active: str | None = None
        self.kept: list[AttrBatch] = []
        self.expected = False

    @contextmanager
    def rule(self, rule: str | None) -> Iterator[None]:
        """Set ``rule`` at the nonlinearities while a pass runs (in-place ones writing copies)."""
        with writing_copies([s.module for s in self.sites] if rule else []):
            self.active = rule
            try:
                yield
            finally:
                self.active = None

    def on_exit(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any],
                output: Any) -> Any:
        if self.active is None or type(call.site.module) not in RULE_TYPES[self.active]:
            return None
        return apply_rule(self.active, call.site.module, args, output)

    def baseline_for(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """The baseline of each input of ``x`` (the inputs from number ``start``)."""
        name = self.options.baseline
        if self.fixed is not None:
            base = self.fixed.to(x)
            base = base[0] if base.dim() == x.dim() and len(base) == 1 else base
            if tuple(base.shape) != tuple(x.shape[1:]):
                raise HookscopeError(f"{param('baseline')} has shape {list(base.shape)}; the "
                                     f"model input's is {list(x.shape[1:])}.")
            return base.expand_as(x).contiguous()
        if name == "blur":
            if x.dim() != 4:
                raise HookscopeError(f"{param('baseline')} blur blurs images (N, C, H, W); got "
                                     f"{list(x.shape)}.")
            return _blur(x)
        if name == "noise":
            def uniform(xi: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
                low, high = float(xi.min()), float(xi.max())
                return low + (high - low) * torch.rand(xi.shape, generator=gen)

            return per_input(x, self.options.seed + start + 1_000_003, uniform)
        return torch.zeros_like(x)

    def step(self, step: Step) -> None:
        x = step.x
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise HookscopeError(f"Attributions take one floating-point input batch (N, C, "
                                 f"...); got {shape}.")
        if self.plan is not None and x.dim() != 4:
            raise HookscopeError(f"{param('metrics')} perturb images (N, C, H, W); got "
                                 f"{list(x.shape)}.")
        origins = Origins.of(step.batch, step.start, len(step), self.transform)
        clean = self._clean(step, origins)
        for why in filter(None, clean.focus.skipped):
            logging.getLogger("hookscope").warning(why)
        runs = [AttrRun(self, step, clean, m) for m in self.methods]
        if not self.expected and self.n_inputs:
            step.expect(sum(r.method.rows(r) for r in runs) * self.n_inputs)
            self.expected = True
        results = {r.method.name: self._result(r) for r in runs}
        if self.plan is not None:
            score = class_scorer(step, self.objective.output, clean.focus.classes)
            for res in results.values():
                maps = torch.from_numpy(np.stack([overlay_map(a) for a in res.attributions]))
                res.metrics = self.plan.evaluate(score, x, maps, self.options.batch_cap)
        (self.sink or self.kept.append)(AttrBatch(step.batch, step.start, results, origins.boxes))

    def _clean(self, step: Step, origins: Origins) -> Clean:
        """The plain pass: the inputs and, in the same pass, their baselines if needed."""
        x, n = step.x, len(step.x)
        needs = any(m.baseline or m.rule == "deeplift" for m in self.methods)
        baseline = self.baseline_for(x, step.start) if needs else torch.zeros_like(x)
        out = self.objective.output(step.forward(torch.cat([x, baseline]) if needs else x,
                                                 grad="inference"))
        focus = self.objective.select(out[:n], x, step.start, origins)
        rows = list(range(n))
        scores = self.objective.score(out[:n], focus, rows).float()
        base = self.objective.score(out[n:], focus, rows).double() if needs else None
        return Clean(focus, scores, baseline, base)

    def _result(self, run: AttrRun) -> AttrResult:
        attr = run.method.fn(run).detach().float()
        sums = attr.flatten(1).double().sum(dim=1)
        base = run.baseline_scores if run.method.baseline else None
        none: list[float | None] = [None] * len(attr)
        base_scores = none if base is None else base.tolist()
        gaps = none if base is None else (sums - (run.clean.double() - base)).tolist()
        return AttrResult(run.method.name, attr.cpu().numpy(), list(run.focus.classes),
                          run.clean.tolist(), sums.tolist(), base_scores, gaps,
                          detections=detection_rows(run.focus))

    def finish(self) -> AttrReport:
        names = [m.name for m in self.methods]
        results = {n: AttrResult.concat([b.results[n] for b in self.kept]) for n in names} \
            if self.kept else {}
        return AttrReport(methods=names, results=results)


def overlay_map(attribution: np.ndarray) -> np.ndarray:
    """(C, H, W) attributions as an (H, W) map in [0, 1] for an overlay: the absolute values
    summed over channels, divided by their 99th percentile and clipped."""
    summed = np.abs(np.nan_to_num(attribution.astype(np.float64))).sum(axis=0)
    top = float(np.percentile(summed, 99))
    return np.clip(summed / top, 0, 1).astype(np.float32) if top > 0 else \
        np.zeros_like(summed, dtype=np.float32)


def attribute(model: nn.Module, x: torch.Tensor | Iterable[torch.Tensor], *,
              method: str = "saliency", target: int | str | Sequence[int | str] | None = None,
              categories: Sequence[str] | None = None, progress: Callable[[int], None] | None
              = None, autocast: torch.dtype | None = None, **options: Any
              ) -> np.ndarray | tuple[np.ndarray, dict[str, np.ndarray]]:
    """Attributions of ``model``'s target score to each value of its input.

    Args:
        model: a classifier (or a segmentation model or detector, as for Grad-CAM); left
            with no hook, no ``.grad`` and its ``training`` flags unchanged.
        x: a preprocessed batch (N, C, H, W), one input (C, H, W), or an iterable of batches.
        method: one of :func:`hookscope.cam.attrmethods.attribution_names`.
        target: None or ``"top1"`` for the top class, ``"topK"``, a class index, a label
            (with ``categories``), or one per input.
        options: :class:`AttrOptions`' (``steps``, ``baseline``, ``samples``, ``noise``,
            ``window``, ``stride``, ``value``, ``batch_cap``, ``seed``, ``task``,
            ``box_index``, ``iou``, ``min_score``, ``metrics``, ``percentiles``).

    Returns:
        float32 attributions of the inputs' shape (N, C, H, W); with ``metrics``, they and
        each metric's values (N,) as :func:`hookscope.cam_metrics` returns them.

    Raises:
        HookscopeError: an unknown method, an option out of range, or a target list whose
            length does not match the number of inputs.
    """
    task = options.pop("task", None) or infer_task(model)
    batches = [x] if isinstance(x, torch.Tensor) else list(x)
    batches = [b.unsqueeze(0) if b.dim() == 3 else b for b in batches]
    targets = aim_targets(task, target, categories, sum(len(b) for b in batches))
    opts = attr_options((method,), targets=targets, task=task, **options)
    probe = AttributionProbe(model, opts)
    found = drive(model, batches, probe, progress=progress, autocast=autocast).results[
        probe.methods[0].name]
    return (found.attributions, found.metrics) if opts.metrics else found.attributions
