"""Attributions of a detector: the target score is Grad-CAM's (pytorch-grad-cam's
``FasterRCNNBoxScoreTarget`` of the chosen boxes), and each method equals captum's on a
wrapper that returns that scalar. Tolerance as in tests/test_attribute.py: the same float32
operations in the same batches."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pytorch_grad_cam.utils.model_targets import FasterRCNNBoxScoreTarget
from torch import nn

from hookscope.cam.attribution import AttributionProbe, AttrResult, attr_options, attribute
from hookscope.cam.attrmethods import attribution_names
from hookscope.core.classes import as_targets
from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count
from hookscope.core.run import drive
from tests.test_attribute import TOL, _captum, _options
from tests.test_cam_tasks import SMALL, build, detector_file  # noqa: F401  (a fixture)

captum = pytest.importorskip("captum.attr")
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


class TinyDetector(nn.Module):
    """torchvision's detector output from a small conv net: per 4x4 cell an anchor box moved
    by four offsets and three class scores (softmax), the best class's, sorted best first."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 7, 4, stride=4))

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        cells = self.net(x)
        h, w = cells.shape[-2:]
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        anchors = torch.stack([xs * 4, ys * 4, xs * 4 + 8, ys * 4 + 8], -1).reshape(-1, 4)
        found = []
        for c in cells.flatten(2).transpose(1, 2):
            scores, labels = torch.softmax(c[:, 4:], dim=-1).max(dim=-1)
            order = scores.argsort(descending=True)
            found.append({"boxes": (anchors + 2 * c[:, :4])[order], "labels": labels[order],
                          "scores": scores[order]})
        return found


class BoxScore(nn.Module):
    """The detector with pytorch-grad-cam's box score of fixed boxes as its (N, 1) output."""

    def __init__(self, detector: nn.Module, target: FasterRCNNBoxScoreTarget) -> None:
        super().__init__()
        self.detector, self.target = detector, target

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.target(out) for out in self.detector(x)])[:, None]


def _chosen(model: nn.Module, x: torch.Tensor, label: int, index: list[int], min_score: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """gradcam's choice, by hand: the detections of ``label`` above ``min_score``, ``index``."""
    with torch.no_grad():
        out = model(x)[0]
    keep = torch.nonzero((out["scores"] >= min_score) & (out["labels"] == label)).flatten()
    assert len(keep) > max(index)
    return out["boxes"][keep[index]], out["labels"][keep[index]]


def _explained(result: AttrResult, hand: tuple[torch.Tensor, torch.Tensor]
               ) -> FasterRCNNBoxScoreTarget:
    """The boxes hookscope explained, checked against the choice by hand. captum gets these
    very boxes: an explained box is an output box, at IoU 1, where the IoU has a kink (its
    min and max of equal coordinates), so a box one float32 step away has another gradient."""
    rows = result.detections[0]
    boxes = np.array([d["box"] for d in rows], dtype=np.float32)
    np.testing.assert_allclose(boxes, hand[0].numpy(), rtol=1e-5)
    assert [d["label"] for d in rows] == hand[1].tolist()
    return FasterRCNNBoxScoreTarget(hand[1], boxes, iou_threshold=0.5)


@pytest.mark.parametrize("method", attribution_names())
def test_each_method_on_a_detector_equals_captum_on_the_box_score(method: str) -> None:
    torch.manual_seed(0)
    model = TinyDetector().eval()
    x = torch.randn(1, 3, 16, 16)
    options = _options(method, 16)
    opts = attr_options([method], targets=as_targets(1, None), task="detection", box_index=[0, 2],
                        min_score=0.36, batch_cap=7, **options)
    found = drive(model, x, AttributionProbe(model, opts)).results[method]
    target = _explained(found, _chosen(model, x, 1, [0, 2], 0.36))
    ref = _captum(method, BoxScore(model, target).eval(), x.clone(), 0, **options)
    ref = ref.detach().numpy()
    assert np.abs(ref).max() > 0 and found.scores[0] == pytest.approx(float(target(
        model(x)[0])), rel=1e-6)
    assert np.abs(found.attributions - ref).max() <= TOL * np.abs(ref).max()
    assert hook_count(model) == 0 and all(p.grad is None for p in model.parameters())


def test_faster_rcnn_saliency_is_captums_on_the_box_score() -> None:
    model = build("fasterrcnn_mobilenet_v3_large_320_fpn", **SMALL)
    model.roi_heads.box_predictor.cls_score.bias.data[18] = 5.0  # detects class 18
    torch.manual_seed(3)
    x = torch.rand(1, 3, 96, 128)
    opts = attr_options(["saliency"], targets=as_targets(18, None), box_index=[0], min_score=0.2)
    found = drive(model, x, AttributionProbe(model, opts)).results["saliency"]
    target = _explained(found, _chosen(model, x, 18, [0], 0.2))
    ref = captum.Saliency(BoxScore(model, target)).attribute(x, target=0).detach().numpy()
    assert np.abs(ref).max() > 0
    assert np.abs(found.attributions - ref).max() <= TOL * np.abs(ref).max()
    with pytest.raises(HookscopeError, match="score a classifier's confidence"):
        attribute(model, x, method="saliency", metrics="drop")


def test_command_on_a_detector(cli, cat_jpg, detector_file, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "o"
    r = cli("attribute", f"{detector_file}:Detector", cat_jpg, "--out", out, "-m",
            "saliency", "--target", "18", "--box-index", "0", "--save-raw", "-f", "json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["results"][0]
    assert row["target"] == 18 and [d["label"] for d in row["detections"]] == [18]
    assert np.load(row["raw"]).shape[0] == 3 and (out / "cat.saliency.png").is_file()
    blind = cli("attribute", f"{detector_file}:Blind", cat_jpg, "--out", tmp_path / "b",
                "-m", "saliency", "--save-raw", "-f", "json")
    assert blind.exit_code == 0, blind.output
    assert "no detection above min_score=0.5" in blind.stderr
    row = json.loads(blind.stdout)["results"][0]
    assert row["detections"] == [] and not np.load(row["raw"]).any()
    bad = cli("attribute", f"{detector_file}:Detector", cat_jpg, "--out", tmp_path / "m",
              "--metrics", "drop")
    assert bad.exit_code == 2 and "detection model" in bad.stderr
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())
