"""The Python API makes exactly the JSON document the command writes (``gradcam``,
``features``): the documents are built by the library, not by the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hookscope.core.output import Staging, dumps_json
from hookscope.core.run import drive
from hookscope.inputs.resolve import iter_batches, resolve_inputs
from hookscope.sources import load_model

MODEL = "tests/golden_model.py:Tiny"  # seeded, so both runs build the same weights
SMALL = ("--weights", "none", "--size", "32")

pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(samples: Path) -> list[str]:
    return [str(samples / "cat.jpg"), str(samples / "coffee.jpg")]


def _loaded_and_inputs(samples: Path):
    loaded = load_model(MODEL, weights="none", size=32)
    resolved = resolve_inputs(_inputs(samples), ndim=loaded.input_ndim)
    return loaded, resolved


def test_gradcam_document_from_the_python_api_is_the_commands(cli, samples, tmp_path) -> None:
    from hookscope.cam.probe import explain
    from hookscope.cam.result import CamRows
    from hookscope.render.heatmap import output_paths

    out, methods = tmp_path / "cams", ["gradcam", "eigencam"]
    r = cli("gradcam", MODEL, *_inputs(samples), *SMALL, "-f", "json", "-m", "gradcam",
            "-m", "eigencam", "--out", out, "--save-raw")
    assert r.exit_code == 0, r.output

    loaded, resolved = _loaded_and_inputs(samples)
    rows = CamRows(output_paths(resolved.stems, methods, out, save_raw=True), loaded.label,
                   save_raw=True)  # the rows alone: no file is written
    report = explain(loaded.model, iter_batches(resolved, loaded.preprocess, keep_images=True),
                     methods=methods, transform=loaded.preprocess, sink=rows,
                     autocast=loaded.autocast)
    doc = loaded.envelope("gradcam", resolved.names) | rows.document(
        report, out=out, layer_default=True)
    assert len(doc["results"]) == 4 and doc["results"][0]["peak"] is not None
    assert dumps_json(doc) == r.stdout


def test_features_document_from_the_python_api_is_the_commands(cli, samples, tmp_path) -> None:
    from hookscope.probes.features import FeaturesProbe, feature_sites
    from hookscope.render.features import GridWriter

    out, api = tmp_path / "maps", tmp_path / "api"
    r = cli("features", MODEL, *_inputs(samples), *SMALL, "-f", "json", "--layer",
            "features.0", "--layer", "features.3", "--out", out)
    assert r.exit_code == 0, r.output

    loaded, resolved = _loaded_and_inputs(samples)
    sites = feature_sites(loaded.model, ["features.0", "features.3"])
    with Staging(api) as staging, GridWriter(staging, api) as writer:
        probe = FeaturesProbe(sites, sink=writer.add, stems=resolved.stems)
        report = drive(loaded.model, iter_batches(resolved, loaded.preprocess), probe)
    doc = loaded.envelope("features", resolved.names) | report.document(api)
    assert len(doc["files"]) == 4 and all(Path(f).is_file() for f in doc["files"])
    assert dumps_json(doc).replace(str(api), str(out)) == r.stdout


def test_debug_document_from_the_python_api_is_the_commands(cli, samples) -> None:
    from hookscope.probes.debug import DebugProbe

    r = cli("debug", MODEL, *_inputs(samples), *SMALL, "-f", "json")
    assert r.exit_code == 0, r.output

    loaded, resolved = _loaded_and_inputs(samples)
    report = drive(loaded.model, iter_batches(resolved, loaded.preprocess),
                   DebugProbe(loaded.model, record=True))
    doc = report.document(loaded.envelope("debug", resolved.names))
    assert doc["events"] and doc["summary"]["samples"] == 2
    assert dumps_json(doc) == r.stdout
