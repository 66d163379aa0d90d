"""How faithful a class activation map is: the model's confidence (the target's softmax
probability) on inputs perturbed by it, as pytorch-grad-cam's ``ROADCombined``,
``DropInConfidence`` and ``IncreaseInConfidence`` and torchcam's ``DeletionInsertionMetric``
compute it ("Metrics" in docs/gradcam.md). Perturbed inputs run ``batch`` at a time, all
metrics' together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from hookscope.cam.methods import PLAIN, resize
from hookscope.cam.targets import class_probs
from hookscope.core.classes import Targets, as_targets, parse_targets
from hookscope.core.errors import HookscopeError, param, suggest
from hookscope.core.logits import class_logits
from hookscope.core.run import Probe, Step, drive

__all__ = ["METRICS", "MetricPlan", "cam_metrics", "class_scorer", "impute", "metric_plan",
           "parse_metrics"]

#: The names ``metrics`` takes (``road`` also reports ``road_morf`` and ``road_lerf``).
METRICS = ("road", "deletion", "insertion", "drop", "increase")
DEFAULT_PERCENTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)
#: pytorch-grad-cam's ROAD imputation: neighbour offsets (row, column) and weights.
NEIGHBOURS = (((1, 1), 1 / 12), ((0, 1), 1 / 6), ((-1, 1), 1 / 12), ((1, -1), 1 / 12),
              ((0, -1), 1 / 6), ((-1, -1), 1 / 12), ((1, 0), 1 / 6), ((-1, 0), 1 / 6))
Score = Callable[[torch.Tensor, list[int]], torch.Tensor]
#: A metric's perturbed inputs, the input each stands for, and its values from their scores.
Part = tuple[list[torch.Tensor], list[int], Callable[[torch.Tensor], dict[str, Any]]]


def parse_metrics(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """``road,deletion`` or ``all`` (or a list) as metric names; HookscopeError if unknown."""
    if not spec:
        return ()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [i.strip().lower() for i in items if i.strip()]
    if "all" in names:
        return METRICS
    for name in names:
        if name not in METRICS:
            raise HookscopeError(f"{param('metrics')} {name!r} is not a metric.{suggest(name, METRICS)} "
                                 f"Choose from: {', '.join(METRICS)}, or all.")
    return tuple(dict.fromkeys(names))


def _percentiles(values: str | Sequence[float] | None) -> tuple[float, ...]:
    """``10,50,90`` (or numbers) as percentiles strictly between 0 and 100."""
    if isinstance(values, str):
        try:
            values = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise HookscopeError(f"{param('percentiles')} {values!r}: give numbers separated "
                                 "by commas, e.g. 10,50,90.") from None
    found = tuple(float(v) for v in (values or DEFAULT_PERCENTILES))
    if not found or any(not 0 < v < 100 for v in found):
        raise HookscopeError(f"{param('percentiles')} must lie strictly between 0 and 100; "
                             f"got {', '.join(f'{v:g}' for v in found) or 'none'}.")
    return found


def impute(img: np.ndarray, keep: np.ndarray, noise: float = 0.01,
           generator: torch.Generator | None = None) -> np.ndarray:
    """pytorch-grad-cam's ``NoisyLinearImputer``: in ``img`` (C, H, W), each pixel not in
    ``keep`` (H, W) becomes the weighted mean of its 8 neighbours (one sparse linear system),
    plus Gaussian noise of std ``noise``."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import spsolve

    h, w = keep.shape
    flat = keep.reshape(-1)
    missing = np.flatnonzero(~flat)
    n = len(missing)
    if n == 0:
        return img
    values = img.reshape(img.shape[0], -1)
    slot = np.zeros(h * w, dtype=np.int64)
    slot[missing] = np.arange(n)
    rows, cols, data = [], [], []
    b = np.zeros((n, img.shape[0]))
    total = np.ones(n)
    y, x = missing // w, missing % w
    for (dy, dx), weight in NEIGHBOURS:
        inside = (y + dy >= 0) & (x + dx >= 0) & (y + dy < h) & (x + dx < w)
        ids = np.flatnonzero(inside)
        where = missing[ids] + dy * w + dx
        known = flat[where]
        b[ids[known]] -= weight * values[:, where[known]].T
        rows.append(ids[~known])
        cols.append(slot[where[~known]])
        data.append(np.full(int((~known).sum()), weight))
        total[~inside] -= weight
    rows.append(np.arange(n))
    cols.append(np.arange(n))
    data.append(-total)
    a = coo_matrix((np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))),
                   shape=(n, n)).tocsc()
    solved = torch.tensor(spsolve(a, b), dtype=torch.float).reshape(n, -1).t()
    if noise:
        solved = solved + noise * torch.randn(solved.shape, generator=generator)
    out = values.copy()
    out[:, missing] = solved.numpy()
    return out.reshape(img.shape)


@dataclass
class MetricPlan:
    """Which metrics, with what settings, and the noise generator (seeded)."""

    names: tuple[str, ...]
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    steps: int = 20
    noise: float = 0.01
    generator: torch.Generator = field(default_factory=torch.Generator)

    @classmethod
    def make(cls, names: str | Sequence[str],
             percentiles: str | Sequence[float] | None = None,
             seed: int = 0, noise: float = 0.01) -> MetricPlan:
        """The plan; HookscopeError for an unknown metric or a percentile outside (0, 100)."""
        chosen = parse_metrics(names)
        if not chosen:
            raise HookscopeError(f"{param('metrics')} names no metric; choose from "
                                 f"{', '.join(METRICS)}, or all.")
        return cls(chosen, _percentiles(percentiles), noise=noise,
                   generator=torch.Generator().manual_seed(seed))

    def evaluate(self, score: Score, x: torch.Tensor, maps: torch.Tensor, batch: int = 32
                 ) -> dict[str, np.ndarray]:
        """Each metric's value per input.

        Args:
            score: ``score(inputs, rows)``: the target's probability for each input, the
                j-th input being one of input ``rows[j]``'s (one forward pass).
            x: the inputs (N, C, H, W).
            maps: (N, H, W) in [0, 1] (resized to the inputs' size when not already).
            batch: perturbed inputs per forward pass.
        """
        maps = resize(maps.float(), x.shape[-2:]).to(x.device)
        base = score(x, list(range(len(x)))).float().cpu()
        parts = []
        if "road" in self.names:
            parts.append(self._road(x, maps, base))
        if {"deletion", "insertion"} & set(self.names):
            parts.append(self._curves(x, maps, base))
        if {"drop", "increase"} & set(self.names):
            parts.append(self._drop(x, maps, base))
        inputs, rows = [t for p in parts for t in p[0]], [r for p in parts for r in p[1]]
        step = max(1, int(batch))
        scores = torch.cat([score(torch.stack(inputs[s : s + step]), rows[s : s + step]).float().cpu()
                            for s in range(0, len(inputs), step)])
        found: dict[str, Any] = {}
        for inputs, _, values in parts:
            found |= values(scores[: len(inputs)])
            scores = scores[len(inputs) :]
        return {k: v.astype(np.float64) for k, v in found.items()}

    def _road(self, x: torch.Tensor, maps: torch.Tensor, base: torch.Tensor) -> Part:
        """ROAD's imputed inputs: LeRF then MoRF, each percentile, each input (the order
        pytorch-grad-cam draws its noise in)."""
        n, k = len(x), len(self.percentiles)
        images, ranks = x.detach().float().cpu().numpy(), maps.cpu().numpy()
        inputs = []
        for least in (True, False):
            for p in self.percentiles:
                for i in range(n):
                    mask = 1 - ranks[i] if least else ranks[i]
                    keep = mask < np.percentile(mask, p)
                    inputs.append(torch.from_numpy(impute(images[i], keep, self.noise,
                                                          self.generator)).to(x))

        def values(scores: torch.Tensor) -> dict[str, Any]:
            diffs = scores.reshape(2, k, n) - base
            lerf, morf = diffs[0].mean(dim=0), diffs[1].mean(dim=0)
            return {"road": ((lerf - morf) / 2).numpy(), "road_morf": morf.numpy(),
                    "road_lerf": lerf.numpy()}

        return inputs, [i for _ in range(2 * k) for i in range(n)], values

    def _curves(self, x: torch.Tensor, maps: torch.Tensor, base: torch.Tensor) -> Part:
        """torchcam's curves: per input the all-zero input, then each inner step's deleted
        and inserted inputs."""
        positions = maps[0].numel()
        size = (positions + self.steps - 1) // self.steps
        counts = [*range(0, positions, size), positions]
        order = torch.argsort(maps.flatten(1), dim=1, descending=True, stable=True)
        ranks = torch.argsort(order, dim=1).reshape(maps.shape)
        inputs, rows = [], []
        for i, image in enumerate(x):
            zero = torch.zeros_like(image)
            inputs.append(zero)
            for count in counts[1:-1]:
                top = (ranks[i] < count).unsqueeze(0)
                inputs += [torch.where(top, zero, image), torch.where(top, image, zero)]
            rows += [i] * (2 * len(counts) - 3)
        fractions = torch.tensor(counts, dtype=torch.float32) / positions

        def values(scores: torch.Tensor) -> dict[str, Any]:
            per = scores.reshape(len(x), -1)
            zero, full = per[:, :1], base[:, None]
            curves = {"deletion": torch.cat([full, per[:, 1::2], zero], dim=1),
                      "insertion": torch.cat([zero, per[:, 2::2], full], dim=1)}
            return {k: torch.trapezoid(v, fractions, dim=1).numpy()
                    for k, v in curves.items() if k in self.names}

        return inputs, rows, values

    def _drop(self, x: torch.Tensor, maps: torch.Tensor, base: torch.Tensor) -> Part:
        """The input times the map, for ``drop`` and ``increase``."""

        def values(scores: torch.Tensor) -> dict[str, Any]:
            change = scores - base
            found = {"drop": np.maximum(-change.numpy(), 0),
                     "increase": (change > 0).float().numpy()}
            return {k: v for k, v in found.items() if k in self.names}

        return list(x * maps.unsqueeze(1)), list(range(len(x))), values


def metric_plan(metrics: Sequence[str], percentiles: Sequence[float] | None, seed: int,
                task: str) -> MetricPlan | None:
    """The plan of Grad-CAM's and attribution's ``metrics`` (None without any); HookscopeError
    for a model of ``task`` other than classification (they score a class's probability)."""
    if not metrics:
        return None
    if task != "classification":
        raise HookscopeError(f"{param('metrics')} score a classifier's confidence in its "
                             f"class; this is a {task} model.")
    return MetricPlan.make(metrics, percentiles, seed)


def class_scorer(step: Step, logits: Callable[[Any], torch.Tensor], classes: Sequence[int],
                 place: Callable[[torch.Tensor, list[int]], Any] | None = None) -> Score:
    """The metrics' ``score``: the softmax probability of input ``rows[j]``'s class for the
    j-th input, the logits taken by ``logits`` from one plain pass; ``place`` puts the
    perturbed input among the forward's other inputs."""

    def score(inputs: torch.Tensor, rows: list[int]) -> torch.Tensor:
        args = place(inputs, rows) if place is not None else inputs
        return class_probs(logits(step.forward(args, grad=PLAIN)),
                           [classes[r] for r in rows])

    return score


class MetricsProbe(Probe[dict[str, np.ndarray]]):
    """Scores given maps batch by batch (for :func:`cam_metrics`)."""

    grad = PLAIN

    def __init__(self, plan: MetricPlan, maps: torch.Tensor, targets: Targets,
                 output_key: str | None, batch: int) -> None:
        self.plan, self.maps, self.targets = plan, maps, targets
        self.output_key, self.batch = output_key, batch
        self.found: list[dict[str, np.ndarray]] = []

    def step(self, step: Step) -> None:
        x = step.x
        maps = self.maps[step.start : step.start + len(x)]
        if len(maps) != len(x):
            raise HookscopeError(f"{param('maps')} holds {len(self.maps)} maps; there are more "
                                 "inputs than that.")
        logits = partial(class_logits, key=self.output_key, analysis="The metrics")
        classes = self.targets.resolve(logits(step.forward()), step.start)
        self.found.append(self.plan.evaluate(class_scorer(step, logits, classes), x, maps,
                                             self.batch))

    def finish(self) -> dict[str, np.ndarray]:
        if not self.found:
            return {}
        return {k: np.concatenate([f[k] for f in self.found]) for k in self.found[0]}


def cam_metrics(model: nn.Module, inputs: Any, maps: Any,
                targets: int | Sequence[int] | str | None = None, *,
                metrics: str | Sequence[str] = "all",
                percentiles: Sequence[float] | None = None, batch_size: int = 32,
                seed: int = 0, noise: float = 0.01, categories: Sequence[str] | None = None,
                output_key: str | None = None) -> dict[str, np.ndarray]:
    """Faithfulness metrics of class activation maps: one value per input and metric.

    Args:
        model: a classifier; left as it came (eval mode while it runs, no hooks).
        inputs: a preprocessed batch (N, C, H, W), or an iterable of batches.
        maps: (N, H, W) maps in [0, 1] (a numpy array or tensor; resized to the inputs).
        targets: the class per input (as :func:`hookscope.gradcam`'s ``target``); None:
            the top class.
        metrics: names from :data:`METRICS` (a list, a comma string, or ``all``).
        percentiles: ROAD's percentiles (default 10, 20, ..., 90).
        batch_size: perturbed inputs per forward pass.
        seed, noise: ROAD's imputation noise: its seed and std (pytorch-grad-cam's 0.01).
        categories: class labels, for label targets.
        output_key: the entry of a dict or tuple output holding the logits.

    Returns:
        Per metric asked for (``road`` also gives ``road_morf`` and ``road_lerf``), (N,).

    Raises:
        HookscopeError: an unknown metric, a bad percentile, or maps that do not match
            the inputs.
    """
    plan = MetricPlan.make(metrics, percentiles, seed, noise)
    tensor = torch.as_tensor(maps).detach().float()
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() != 3:
        raise HookscopeError(f"{param('maps')} must be (N, H, W); got {list(tensor.shape)}.")
    parsed = as_targets(targets, categories) if targets is not None else parse_targets(None, None)
    probe = MetricsProbe(plan, tensor, parsed, output_key, batch_size)
    return drive(model, inputs, probe)
