"""``hookscope report``'s attribution beside the CAM: the page's figure and the JSON's
``attribution``, checked against autograd on the model's preprocessed input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.test_report import Tags, _small, evil, run  # noqa: F401  (evil: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_report_holds_the_attribution_of_the_cams_target(evil) -> None:  # noqa: F811
    from hookscope.core.files import dumps_json
    from hookscope.inputs.resolve import iter_batches, resolve_inputs
    from hookscope.report import ReportOptions, build_report
    from hookscope.sources import LoadOptions, load

    loaded = load(evil["model"], LoadOptions(size=32, labels=str(evil["labels"])))
    inputs = resolve_inputs([str(evil["image"])])

    def batches():
        return iter_batches(inputs, loaded.preprocess, keep_images=True)

    report = build_report(loaded, batches, inputs.names,
                          ReportOptions(attribution="inputxgradient"))
    x = next(iter(batches())).tensor.clone().requires_grad_(True)
    logits = loaded.model(x)
    target = int(logits.argmax())
    (grad,) = torch.autograd.grad(logits[0, target], x)
    attr = (x * grad).detach().double().numpy()[0]
    summed = np.abs(attr).sum(axis=0)  # the overlay's map: |a| over channels / its p99
    want = np.clip(summed / np.percentile(summed, 99), 0, 1)
    assert report.attribution is not None
    assert np.abs(report.attribution.maps[0] - want).max() <= 1e-5
    doc = json.loads(dumps_json(report))["attribution"]
    cam = json.loads(dumps_json(report))["gradcam"]["inputs"][0]["targets"]["gradcam"]
    row = doc["inputs"][0]
    assert doc["method"] == "inputxgradient" and row["input"] == inputs.names[0]
    assert row["target"]["index"] == target == cam["index"]
    assert row["target"]["label"] == cam["label"] and row["target"]["prob"] is None
    assert row["target"]["score"] == pytest.approx(float(logits[0, target].detach()), rel=1e-5)
    assert row["sum"] == pytest.approx(attr.sum(), abs=1e-6 * np.abs(attr).sum())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in loaded.model.modules())
    assert all(p.grad is None for p in loaded.model.parameters())


def test_the_page_draws_it_beside_the_cam(evil, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "r.html"
    r = run("report", *_small(evil), "-o", out, "--attribution", "integrated-gradients")
    assert r.exit_code == 0, r.output
    tags = Tags()
    tags.feed(out.read_text(encoding="utf-8"))
    alts = [a.get("alt") or "" for t, a in tags.tags if t == "img"]
    assert [a.split(" for ")[0] for a in alts[1:]] == ["gradcam", "integrated-gradients"]
    assert "beside them the pixel attribution integrated-gradients" in "".join(tags.text)
    bad = run("report", *_small(evil), "-o", tmp_path / "b.html", "--attribution", "nope")
    assert bad.exit_code == 2 and not (tmp_path / "b.html").exists()
