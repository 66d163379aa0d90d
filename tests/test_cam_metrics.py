"""CAM metrics against pytorch-grad-cam's and torchcam's classes on the same maps, within
1e-4: ROAD (with the same imputation noise), deletion and insertion, drop and increase in
confidence; batching; the API; bad names."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
import torchcam  # noqa: F401  (the test extra installs it)
from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

import hookscope
from hookscope.cam.faithfulness import MetricPlan, impute, parse_metrics
from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count
from tests.test_cam import InplaceNet

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = InplaceNet().eval()
    x = torch.randn(3, 3, 16, 16)
    maps = hookscope.gradcam(model, x, "features.3", method="layercam", target=[1, 3, 5]).maps
    return model, x, maps, [1, 3, 5]


@contextmanager
def same_noise(seed: int | None):
    """pytorch-grad-cam's imputer draws ``torch.randn_like``; make it draw what hookscope's
    seeded generator draws, in the same order (zeros with ``seed`` None)."""
    gen = torch.Generator().manual_seed(seed or 0)
    original = torch.randn_like
    torch.randn_like = (lambda t, **kw: torch.zeros(t.shape)) if seed is None else (  # type: ignore
        lambda t, **kw: torch.randn(t.shape, generator=gen))
    try:
        yield
    finally:
        torch.randn_like = original


def _targets(classes):
    return [ClassifierOutputSoftmaxTarget(c) for c in classes]


@pytest.mark.parametrize("percentiles", [(10, 50, 90), (20, 40, 60, 80)])
def test_road_matches_pytorch_grad_cam(setup, percentiles):
    from pytorch_grad_cam.metrics.road import (
        ROADCombined,
        ROADLeastRelevantFirstAverage,
        ROADMostRelevantFirstAverage,
    )

    model, x, maps, classes = setup
    with same_noise(7):
        ref = ROADCombined(percentiles=list(percentiles))(x, maps, _targets(classes), model)
    got = hookscope.cam_metrics(model, x, maps, classes, metrics="road",
                                percentiles=percentiles, seed=7, batch_size=5)
    np.testing.assert_allclose(got["road"], ref, atol=TOL, rtol=0)
    assert np.abs(ref).max() > 1e-3
    # Alone, each averager draws its noise from the start: compare them without noise.
    plain = hookscope.cam_metrics(model, x, maps, classes, metrics="road",
                                  percentiles=percentiles, noise=0.0)
    with same_noise(None):
        morf = ROADMostRelevantFirstAverage(list(percentiles))(x, maps, _targets(classes), model)
        lerf = ROADLeastRelevantFirstAverage(list(percentiles))(x, maps, _targets(classes), model)
    np.testing.assert_allclose(plain["road_morf"], morf, atol=TOL, rtol=0)
    np.testing.assert_allclose(plain["road_lerf"], lerf, atol=TOL, rtol=0)
    assert hook_count(model) == 0


def test_imputer_matches_pytorch_grad_cam():
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer

    rng = np.random.default_rng(0)
    img = rng.normal(size=(3, 12, 10)).astype(np.float32)
    keep = rng.random((12, 10)) > 0.4
    ref = NoisyLinearImputer(noise=0.0)(torch.from_numpy(img),
                                        torch.from_numpy(keep.astype(np.float32)))
    np.testing.assert_allclose(impute(img, keep, noise=0.0), ref.numpy(), atol=1e-5, rtol=0)
    assert np.array_equal(impute(img, keep, 0.0)[:, keep], img[:, keep])


def test_drop_and_increase_match_pytorch_grad_cam(setup):
    from pytorch_grad_cam.metrics.cam_mult_image import DropInConfidence, IncreaseInConfidence

    model, x, maps, classes = setup
    got = hookscope.cam_metrics(model, x, maps, classes, metrics="drop,increase")
    drop = DropInConfidence()(x, maps, _targets(classes), model)
    increase = IncreaseInConfidence()(x, maps, _targets(classes), model)
    np.testing.assert_allclose(got["drop"], drop, atol=TOL, rtol=0)
    np.testing.assert_array_equal(got["increase"], increase)


class GivenMaps:
    """A torchcam CAM extractor that returns fixed maps (so both score the same maps)."""

    def __init__(self, model, maps):
        self.model, self.maps = model, maps

    def __call__(self, class_idx=None, scores=None, normalized=True, **kwargs):
        return [torch.from_numpy(self.maps)]

    @staticmethod
    def fuse_cams(cams):
        return cams[0]

    @contextmanager
    def _hooks_off(self):
        yield


@pytest.mark.parametrize("steps", [20, 7])
def test_deletion_insertion_match_torchcam(setup, steps):
    from functools import partial

    from torchcam.metrics import DeletionInsertionMetric

    model, x, maps, classes = setup
    metric = DeletionInsertionMetric(GivenMaps(model, maps), partial(torch.softmax, dim=-1),
                                     steps=steps, batch_size=7)
    metric.update(x, class_idx=classes)
    plan = MetricPlan.make("deletion,insertion")
    plan.steps = steps

    def score(inputs, rows):
        with torch.no_grad():
            probs = torch.softmax(model(inputs), dim=1)
        return probs[torch.arange(len(rows)), torch.tensor([classes[r] for r in rows])]

    got = plan.evaluate(score, x, torch.from_numpy(maps), batch=11)
    summary = metric.summary()
    assert got["deletion"].mean() == pytest.approx(summary["deletion_auc"], abs=TOL)
    assert got["insertion"].mean() == pytest.approx(summary["insertion_auc"], abs=TOL)
    if steps == 20:  # the API, per input, against one input at a time
        api = hookscope.cam_metrics(model, x, maps, classes, metrics="deletion,insertion")
        for i in range(3):
            one = DeletionInsertionMetric(GivenMaps(model, maps[i : i + 1]),
                                          partial(torch.softmax, dim=-1))
            one.update(x[i : i + 1], class_idx=[classes[i]])
            assert api["deletion"][i] == pytest.approx(one.summary()["deletion_auc"], abs=TOL)


def test_perturbed_inputs_run_batched(setup):
    model, x, maps, classes = setup
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(lambda _m, args: sizes.append(args[0].shape[0]))
    try:
        hookscope.cam_metrics(model, x, maps, classes, metrics="all", percentiles=(50,),
                              batch_size=16)
    finally:
        handle.remove()
    # one clean pass for the targets, one for the base scores, then the perturbed inputs:
    # ROAD 2 x 1 x 3, deletion/insertion 3 x (1 + 2 x 19), drop/increase 3
    total = 6 + 3 * 39 + 3
    assert sizes[:2] == [3, 3] and sum(sizes[2:]) == total
    assert all(s == 16 for s in sizes[2:-1])


def test_metric_names_and_errors():
    assert parse_metrics("all") == ("road", "deletion", "insertion", "drop", "increase")
    assert parse_metrics("drop, road") == ("drop", "road")
    with pytest.raises(HookscopeError, match="'rod' is not a metric.*road"):
        parse_metrics("rod")
    with pytest.raises(HookscopeError, match="between 0 and 100"):
        MetricPlan.make("road", (0, 50))


def test_gradcam_metrics_in_the_probe(setup):
    """explain(..., metrics=) gives the same values as cam_metrics on its maps."""
    model, x, maps, classes = setup
    r = hookscope.gradcam(model, x, "features.3", target=classes, metrics=("drop", "deletion"))
    got = hookscope.cam_metrics(model, x, r.maps, classes, metrics="drop,deletion")
    np.testing.assert_allclose(r.metrics["drop"], got["drop"], atol=1e-6)
    np.testing.assert_allclose(r.metrics["deletion"], got["deletion"], atol=1e-6)
