"""Grad-CAM beyond classifiers: segmentation models (a class over a region) and detectors
(their boxes), against pytorch-grad-cam's ``SemanticSegmentationTarget`` and
``FasterRCNNBoxScoreTarget``; default layers; masks; skipped inputs; bad input.

Random weights (seeded). A detector's classification head gets a large bias towards class
18 so that it detects something.
"""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_grad_cam as pgc  # the test extra installs it
import torch
from PIL import Image
from pytorch_grad_cam.utils.model_targets import (
    FasterRCNNBoxScoreTarget,
    SemanticSegmentationTarget,
)
from torch import nn

from hookscope.cam.probe import default_layer, explain
from hookscope.core.classes import parse_targets
from hookscope.core.errors import HookscopeError
from hookscope.core.hooks import hook_count
from tests.test_cam import TOL, _minmax, _no_inplace, pgc_cam_image
from tests.test_cam_methods import _signed

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = {"min_size": 128, "max_size": 128}


def build(name: str, **kwargs):
    from torchvision.models import get_model

    torch.manual_seed(0)
    return get_model(name, weights=None, weights_backbone=None, **kwargs).eval()


def detects(name: str, model: nn.Module, label: int = 18) -> nn.Module:
    """Bias the classification head towards ``label`` so random weights detect it."""
    if hasattr(model, "roi_heads"):
        model.roi_heads.box_predictor.cls_score.bias.data[label] = 12.0
    elif name.startswith("ssd"):
        for layer in model.head.classification_head.module_list:
            conv = layer if isinstance(layer, nn.Conv2d) else layer[-1]
            conv.bias.data.view(-1, 91)[:, label] = 12.0
    else:
        model.head.classification_head.cls_logits.bias.data.view(-1, 91)[:, label] = 6.0
    return model


def _clean(model):
    assert hook_count(model) == 0
    assert all(p.grad is None for p in model.parameters())


# ----------------------------------------------------------------------------- segmentation


class Out(nn.Module):
    """pytorch-grad-cam's segmentation wrapper: the ``out`` entry of the model's dict."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


@pytest.fixture(scope="module")
def lraspp():
    return build("lraspp_mobilenet_v3_large")


def _seg_reference(model, layer, x, cls, masks):
    module = dict(model.named_modules())[layer]
    with _no_inplace(model):
        targets = [SemanticSegmentationTarget(cls, m) for m in masks]
        ref, outputs = pgc_cam_image(pgc.GradCAM(Out(model), [module]), module, x, targets)
        scores = [float(t(o)) for t, o in zip(targets, outputs, strict=True)]
    return _minmax(ref), scores


@pytest.mark.parametrize("layer", ["backbone.4", "backbone.16"])
def test_segmentation_matches_semantic_segmentation_target(lraspp, layer):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 64, 64)
    report = explain(lraspp, x, layer=layer, methods=["gradcam"])
    res = report.results["gradcam"]
    assert report.task == "segmentation"
    with torch.no_grad():
        pred = lraspp(x)["out"].argmax(1)
    cls = res.targets[0]
    assert res.targets == [cls, cls] or True  # top1 is chosen per input
    for i in range(2):
        counts = torch.bincount(pred[i].flatten(), minlength=21)
        if (counts[1:] > 0).any():
            counts[0] = -1
        assert res.targets[i] == int(counts.argmax())
    # the reference, per input, with its predicted mask
    for i in range(2):
        c = res.targets[i]
        mask = (pred[i] == c).float().numpy()
        ref, scores = _seg_reference(lraspp, layer, x[i : i + 1], c, [mask])
        assert res.scores[i] == pytest.approx(scores[0], rel=1e-5)
        np.testing.assert_array_equal(res.regions[i], mask > 0)
        np.testing.assert_allclose(_minmax(res.raw[i : i + 1]), ref, atol=TOL, rtol=0)
    _clean(lraspp)


def test_segmentation_mask_file_and_given_class(lraspp, tmp_path):
    torch.manual_seed(2)
    x = torch.randn(1, 3, 64, 64)
    mask = np.zeros((64, 64), dtype=bool)
    mask[10:40, 20:50] = True
    report = explain(lraspp, x, layer="backbone.16", methods=["gradcam", "hirescam"],
                     targets=parse_targets("15", None), mask=mask)
    res = report.results["gradcam"]
    assert res.targets == [15]
    np.testing.assert_array_equal(res.regions[0], mask)
    ref, scores = _seg_reference(lraspp, "backbone.16", x, 15, [mask.astype(np.float32)])
    assert res.scores[0] == pytest.approx(scores[0], rel=1e-5)
    np.testing.assert_allclose(_minmax(res.raw), ref, atol=TOL, rtol=0)
    with pytest.raises(HookscopeError, match=r"mask is 30x20 pixels.*64x64 \(the model input\)"):
        explain(lraspp, x, layer="backbone.16", mask=np.ones((20, 30), dtype=bool))
    _clean(lraspp)


@pytest.mark.parametrize(("name", "layer"), [
    ("lraspp_mobilenet_v3_large", "backbone.16"),
    ("deeplabv3_mobilenet_v3_large", "backbone.16"),
    pytest.param("fcn_resnet50", "backbone.layer4", marks=pytest.mark.slow),
    ("fasterrcnn_mobilenet_v3_large_320_fpn", "backbone.body.16"),
    pytest.param("retinanet_resnet50_fpn", "backbone.body.layer4", marks=pytest.mark.slow),
])
def test_default_layer_is_the_backbones_last_stage(name, layer):
    from hookscope.cam.targets import infer_task

    model = build(name, **(SMALL if "fpn" in name else {}))
    task = infer_task(model)
    assert task in ("segmentation", "detection")
    assert default_layer(model, torch.rand(1, 3, 64, 64), task=task)[0] == layer


# ----------------------------------------------------------------------------- detection


@pytest.fixture(scope="module")
def frcnn():
    name = "fasterrcnn_mobilenet_v3_large_320_fpn"
    return detects(name, build(name, **SMALL))


def test_detection_score_matches_faster_rcnn_box_score_target(frcnn):
    torch.manual_seed(3)
    x = torch.rand(2, 3, 96, 128)
    with torch.no_grad():
        outputs = frcnn(x)
    report = explain(frcnn, x, layer="backbone.body.13", methods=["gradcam"],
                     targets=parse_targets("18", None), box_index=[0, 2], min_score=0.5)
    res = report.results["gradcam"]
    assert report.task == "detection" and res.skipped == [None, None]
    layer = dict(frcnn.named_modules())["backbone.body.13"]
    for i in range(2):
        keep = torch.nonzero(outputs[i]["scores"] >= 0.5).flatten()
        keep = keep[outputs[i]["labels"][keep] == 18][[0, 2]]
        boxes, labels = outputs[i]["boxes"][keep], outputs[i]["labels"][keep]
        np.testing.assert_allclose([d["box"] for d in res.detections[i]], boxes.numpy(), rtol=1e-5)
        target = FasterRCNNBoxScoreTarget(labels, boxes.numpy(), iou_threshold=0.5)
        assert res.scores[i] == pytest.approx(float(target(outputs[i])), rel=1e-5)
        with _no_inplace(frcnn):
            cam = pgc.GradCAM(frcnn, [layer])
            try:
                outs = cam.activations_and_grads(x[i : i + 1])
                target(outs[0]).sum().backward()
                acts = cam.activations_and_grads.activations[0].numpy()
                grads = cam.activations_and_grads.gradients[0].numpy()
                ref = cam.get_cam_image(x, layer, [target], acts, grads, False)
            finally:
                cam.activations_and_grads.release()
                frcnn.zero_grad(set_to_none=True)
        np.testing.assert_allclose(_minmax(res.raw[i : i + 1]), _minmax(ref), atol=TOL, rtol=0)
    _clean(frcnn)


DETECTORS = [
    ("fasterrcnn_mobilenet_v3_large_320_fpn", SMALL),
    ("ssdlite320_mobilenet_v3_large", {}),
    ("retinanet_resnet50_fpn", SMALL),
    ("fcos_resnet50_fpn", SMALL),
    pytest.param("ssd300_vgg16", {}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("name", "kwargs"), DETECTORS)
def test_eigencam_works_for_every_detector(name, kwargs):
    model = build(name, **kwargs) if name != "fasterrcnn_mobilenet_v3_large_320_fpn" else None
    model = detects(name, model or build(name, **kwargs))
    torch.manual_seed(4)
    x = torch.rand(1, 3, 96, 128)
    report = explain(model, x, methods=["eigencam"])
    res = report.results["eigencam"]
    assert res.skipped == [None] and len(res.detections[0]) > 0
    assert res.maps.shape == (1, 96, 128) and np.isfinite(res.maps).all()
    module = dict(model.named_modules())[report.layer]
    with torch.no_grad(), _no_inplace(model):
        cam = pgc.EigenCAM(model, [module])
        try:
            cam.activations_and_grads(x)
            acts = cam.activations_and_grads.activations[0].numpy()
        finally:
            cam.activations_and_grads.release()
    from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection

    np.testing.assert_allclose(_minmax(res.raw), _minmax(_signed(get_2d_projection(acts))),
                               atol=TOL, rtol=0)
    _clean(model)


def test_no_detection_skips_the_input():
    model = build("fasterrcnn_mobilenet_v3_large_320_fpn", **SMALL)  # random: detects nothing
    report = explain(model, torch.rand(2, 3, 64, 64), methods=["eigencam", "gradcam"])
    res = report.results["gradcam"]
    assert res.skipped == [f"input {i}: no detection above min_score=0.5 (--min-score); "
                           "skipped." for i in range(2)]
    assert report.notes[:2] == res.skipped
    _clean(model)


@pytest.mark.parametrize("task", ["segmentation", "detection"])
def test_one_target_per_input_over_several_batches(task, lraspp, frcnn):
    """Per-input targets follow the inputs across batches: batches of one give the maps,
    classes and scores of one batch of two (a batch used to be checked against the total)."""
    torch.manual_seed(4)
    model, layer, target = ((lraspp, "backbone.16", "15,3") if task == "segmentation"
                            else (frcnn, "backbone.body.13", "18,18"))
    x = torch.rand(2, 3, 96, 128)
    whole = explain(model, x, layer=layer, targets=parse_targets(target, None)).results["gradcam"]
    split = explain(model, [x[:1], x[1:]], layer=layer,
                    targets=parse_targets(target, None)).results["gradcam"]
    assert split.targets == whole.targets
    assert split.scores == pytest.approx(whole.scores, rel=1e-5)
    np.testing.assert_allclose(split.raw, whole.raw, atol=TOL, rtol=0)
    with pytest.raises(HookscopeError, match="lists 2 targets for 3 input"):
        explain(model, [x[:1], x], layer=layer, targets=parse_targets(target, None))
    _clean(model)


def test_detection_errors(frcnn):
    x = torch.rand(1, 3, 96, 128)
    with pytest.raises(HookscopeError, match=r"box_index 500 is out of range: input 0 has \d+ "
                       r"detection\(s\) of class 18 above min_score 0.5"):
        explain(frcnn, x, targets=parse_targets("18", None), box_index=[500])
    with pytest.raises(HookscopeError, match="not a rank"):
        explain(frcnn, x, targets=parse_targets("top1", None))
    with pytest.raises(HookscopeError, match="compares a classifier's classes"):
        explain(frcnn, x, methods=["finercam"])
    with pytest.raises(HookscopeError, match="aug_smooth"):
        explain(frcnn, x, aug_smooth=True)
    _clean(frcnn)


def test_detection_options_on_a_classifier():
    from torchvision.models import resnet18

    model = resnet18(num_classes=4).eval()
    with pytest.raises(HookscopeError, match="box_index selects detections; this is a "
                       "classification model"):
        explain(model, torch.rand(1, 3, 32, 32), box_index=[0])
    with pytest.raises(HookscopeError, match="mask sets a segmentation region"):
        explain(model, torch.rand(1, 3, 32, 32), mask=np.ones((32, 32), dtype=bool))


# ----------------------------------------------------------------------------- command line


DETECTOR_CODE = '''
import torch
from torchvision.models import get_model


def Detector():
    torch.manual_seed(0)
    model = get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None,
                      weights_backbone=None, min_size=128, max_size=128)
    model.roi_heads.box_predictor.cls_score.bias.data[18] = 12.0
    return model


def Blind():
    torch.manual_seed(0)
    return get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None,
                     weights_backbone=None, min_size=128, max_size=128)
'''


@pytest.fixture(scope="module")
def detector_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("det") / "det.py"
    path.write_text(DETECTOR_CODE)
    return path


def test_cli_detector_draws_boxes(cli, cat_jpg, detector_file, tmp_path):
    import json

    out = tmp_path / "o"
    r = cli("gradcam", f"{detector_file}:Detector", cat_jpg, "--out", out, "-m", "eigencam",
            "--target", "18", "--box-index", "0", "--box-index", "1", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["task"] == "detection" and doc["layer"] == "backbone.body.16"
    row = doc["results"][0]
    assert row["target"] == 18 and len(row["detections"]) == 2
    from hookscope.cam.targets import crop_box
    from hookscope.inputs.preprocess import Preprocess

    overlay = np.asarray(Image.open(row["overlay"]))
    left, top, right, _ = crop_box(Preprocess(), Image.open(cat_jpg).size)  # 256, crop 224
    scale = (right - left) / 224
    bx0, by0, bx1, by1 = row["detections"][0]["box"]
    x, y = int(left + bx0 * scale), int(top + (by0 + by1) / 2 * scale)
    assert (overlay[y, x - 2 : x + 3] == 255).all(axis=-1).any()  # the box's white edge
    x = int(left + (bx0 + bx1) / 2 * scale)
    assert not (overlay[y, x - 2 : x + 3] == 255).all(axis=-1).any()  # inside: the heatmap


def test_cli_no_detection_is_one_line_per_input(cli, samples, detector_file, tmp_path):
    images = sorted(samples.glob("*.jpg"))[:2]
    out = tmp_path / "o"
    r = cli("gradcam", f"{detector_file}:Blind", *images, "--out", out, "-m", "eigencam",
            "--format", "json", "--batch-size", "1")
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if "no detection" in line]
    assert len(lines) == 2 and all("min_score=0.5 (--min-score)" in line for line in lines)
    assert "Traceback" not in r.output
    doc = __import__("json").loads(r.stdout)
    assert doc["results"] == [] and len(doc["skipped"]) == 2
    assert not out.exists() or not any(out.iterdir())


def one_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_cli_bad_inputs(cli, cat_jpg, detector_file, tmp_path):
    small = tmp_path / "small.png"
    Image.new("L", (7, 9), 255).save(small)
    fast = ("--weights", "none", "--size", "64", "--out", tmp_path / "o", "-q")
    line = one_line(cli("gradcam", "lraspp_mobilenet_v3_large", cat_jpg, "--mask", small,
                        "--target", "15", *fast))
    assert "--mask is 7x9 pixels" in line and "451x300 (the image)" in line
    line = one_line(cli("gradcam", f"{detector_file}:Detector", cat_jpg, "--box-index", "999",
                        "--out", tmp_path / "o", "-q"))
    assert "--box-index 999 is out of range" in line
    line = one_line(cli("gradcam", "resnet18", cat_jpg, "--metrics", "road,rod", *fast))
    assert "--metrics 'rod' is not a metric" in line
    line = one_line(cli("gradcam", "resnet18", cat_jpg, "--box-index", "0", *fast))
    assert "--box-index selects detections; this is a classification model" in line
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
