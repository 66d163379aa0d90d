"""``attribute --metrics``: the CAM faithfulness metrics on each attribution's overlay map,
through the code Grad-CAM's metrics run, checked against pytorch-grad-cam's and torchcam's
classes on the same maps (tolerance as in tests/test_cam_metrics.py: both compute the same
float32 softmax probabilities of the same perturbed inputs, in other batches)."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
import torch
from pytorch_grad_cam.metrics.cam_mult_image import DropInConfidence, IncreaseInConfidence
from pytorch_grad_cam.metrics.road import ROADCombined

import hookscope
from hookscope.cam.attribution import overlay_map
from hookscope.cam.faithfulness import MetricPlan
from hookscope.core.hooks import hook_count
from tests.test_attribute import FAST, _small
from tests.test_cam_metrics import TOL, GivenMaps, _targets, same_noise

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::UserWarning")]
CLASSES = [1, 3, 4]


@pytest.fixture(scope="module")
def setup():
    model = _small()
    with torch.no_grad():  # confident: the probabilities move by more than the tolerance
        model.fc.weight *= 30
    torch.manual_seed(8)
    return model, torch.randn(3, 3, 16, 16)


def test_attribution_metrics_equal_the_peer_libraries_on_its_overlay_maps(setup):
    from torchcam.metrics import DeletionInsertionMetric

    model, x = setup
    attr, found = hookscope.attribute(model, x, method="integrated-gradients", steps=8,
                                      target=CLASSES, metrics="all", percentiles=(20, 50, 80),
                                      seed=7, batch_cap=5)
    maps = np.stack([overlay_map(a) for a in attr])
    assert maps.shape == (3, 16, 16) and 0 <= maps.min() and maps.max() == 1
    with same_noise(7):
        road = ROADCombined(percentiles=[20, 50, 80])(x, maps, _targets(CLASSES), model)
    np.testing.assert_allclose(found["road"], road, atol=TOL, rtol=0)
    drop = DropInConfidence()(x, maps, _targets(CLASSES), model)
    np.testing.assert_allclose(found["drop"], drop, atol=TOL, rtol=0)
    increase = IncreaseInConfidence()(x, maps, _targets(CLASSES), model)
    np.testing.assert_array_equal(found["increase"], increase)
    for i in range(3):  # torchcam's curves (20 steps, hookscope's default), one input each
        curve = DeletionInsertionMetric(GivenMaps(model, maps[i : i + 1]),
                                        partial(torch.softmax, dim=-1), steps=20)
        curve.update(x[i : i + 1], class_idx=[CLASSES[i]])
        summary = curve.summary()
        assert found["deletion"][i] == pytest.approx(summary["deletion_auc"], abs=TOL)
        assert found["insertion"][i] == pytest.approx(summary["insertion_auc"], abs=TOL)
    assert np.abs(road).max() > 1e-2 and np.abs(drop).max() > 1e-2
    assert hook_count(model) == 0 and all(p.grad is None for p in model.parameters())


def test_a_cam_and_an_attribution_are_scored_by_the_same_code(setup, monkeypatch):
    """Both call MetricPlan.evaluate once per batch, on their (N, H, W) maps, with the same
    scorer: so each equals cam_metrics on its maps, with the same names."""
    model, x = setup
    seen: list[tuple[int, ...]] = []
    evaluate = MetricPlan.evaluate

    def spy(self, score, inputs, maps, batch=32):
        seen.append(tuple(maps.shape))
        return evaluate(self, score, inputs, maps, batch)

    monkeypatch.setattr(MetricPlan, "evaluate", spy)
    cam = hookscope.gradcam(model, x, "c4", target=CLASSES, metrics=("deletion", "drop"))
    attr, found = hookscope.attribute(model, x, method="saliency", target=CLASSES,
                                      metrics="deletion,drop")
    assert seen == [(3, 16, 16), (3, 16, 16)]
    assert set(found) == set(cam.metrics) == {"deletion", "drop"}
    maps = np.stack([overlay_map(a) for a in attr])
    for given, want in ((cam.maps, cam.metrics), (maps, found)):
        again = hookscope.cam_metrics(model, x, given, CLASSES, metrics="deletion,drop")
        for name in ("deletion", "drop"):
            np.testing.assert_allclose(want[name], again[name], atol=1e-6, rtol=0)


def test_command_metrics_have_gradcams_fields(cli, cat_jpg, tmp_path):
    args = (cat_jpg, *FAST, "--metrics", "deletion,drop", "-f", "json")
    att = cli("attribute", "resnet18", *args, "-m", "saliency", "-m", "inputxgradient",
              "--out", tmp_path / "a")
    cam = cli("gradcam", "resnet18", *args, "--out", tmp_path / "c")
    assert att.exit_code == 0 and cam.exit_code == 0, att.output + cam.output
    a, c = json.loads(att.stdout), json.loads(cam.stdout)
    assert {k for r in a["results"] for k in r["metrics"]} == \
        {k for r in c["results"] for k in r["metrics"]} == {"deletion", "drop"}
    assert set(a["metrics"]) == {"saliency", "inputxgradient"}
    for method, means in a["metrics"].items():
        rows = [r for r in a["results"] if r["method"] == method]
        assert means == {k: pytest.approx(np.mean([r["metrics"][k] for r in rows]))
                         for k in ("deletion", "drop")}
    csv = cli("attribute", "resnet18", cat_jpg, *FAST, "--metrics", "road", "-f", "csv",
              "--out", tmp_path / "csv")
    assert csv.exit_code == 0, csv.output
    assert csv.stdout.splitlines()[0].endswith("raw,road,road_morf,road_lerf")


@pytest.mark.parametrize(("args", "message"), [
    (("--metrics", "rod"), "'rod' is not a metric"),
    (("--metrics", "road", "--percentiles", "0,50"), "between 0 and 100")])
def test_bad_metrics_are_one_line_exit_2_no_files(cli, cat_jpg, tmp_path, args, message):
    out = tmp_path / "o"
    r = cli("attribute", "resnet18", cat_jpg, *FAST, "--out", out, *args)
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.output
    assert not out.exists()
