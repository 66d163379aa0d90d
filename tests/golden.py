"""Golden outputs: every command's JSON and CSV on the sample images, recorded and compared.

The files under ``tests/golden/`` were recorded before the run pipeline was rebuilt
(issue 8); ``tests/test_golden.py`` checks that today's outputs still equal them, up to
float rounding and the documented fixes listed in :data:`DOCUMENTED`.

    python -m tests.golden record     # rewrite tests/golden/ from the current code
    python -m tests.golden compare    # print the differences
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
SMALL = ["--weights", "none", "--size", "96"]
IMAGES = ["sample_images/cat.jpg", "sample_images/coffee.jpg"]

#: name -> CLI arguments. Paths are relative to the repository root; ``OUT`` is replaced
#: by a fresh folder name under the working directory.
CASES: dict[str, list[str]] = {
    "stats.json": ["stats", "resnet18", *IMAGES, *SMALL, "-f", "json"],
    "stats.csv": ["stats", "resnet18", *IMAGES, *SMALL, "-f", "csv", "--input-stats"],
    "stats_layers.json": ["stats", "resnet18", *IMAGES, *SMALL, "-f", "json", "--max-depth", "2",
                          "--type", "Sequential"],
    "models.json": ["models", "resnet", "-f", "json"],
    "layers.json": ["layers", "resnet18", IMAGES[0], *SMALL, "-f", "json"],
    "layers.csv": ["layers", "mobilenet_v3_small", *SMALL, "-f", "csv"],
    "debug.json": ["debug", "resnet18", *IMAGES, *SMALL, "-f", "json", "--layers", "layer1.*"],
    "debug.ndjson": ["debug", "resnet18", IMAGES[0], *SMALL, "-f", "ndjson", "--max-depth", "1"],
    "gradcam.json": ["gradcam", "resnet18", *IMAGES, *SMALL, "-f", "json", "-m", "gradcam",
                     "-m", "eigencam", "--out", "OUT", "--save-raw"],
    "grads.json": ["grads", "resnet18", *IMAGES, *SMALL, "-f", "json"],
    "grads.csv": ["grads", "resnet18", *IMAGES, *SMALL, "-f", "csv", "--loss", "ce",
                  "--label", "3"],
    "features.json": ["features", "resnet18", *IMAGES, *SMALL, "-f", "json", "--layer",
                      "layer1.0.conv1", "--layer", "layer2.*.conv2", "--out", "OUT"],
    "features.csv": ["features", "resnet18", IMAGES[0], *SMALL, "-f", "csv", "--type", "MaxPool2d",
                     "--out", "OUT"],
    "ablate.json": ["ablate", "resnet18", *IMAGES, *SMALL, "-f", "json", "--layer", "layer4",
                    "--channels", "0-63", "--mode", "noise:0.5"],
    "ablate.csv": ["ablate", "resnet18", IMAGES[0], *SMALL, "-f", "csv", "--layer", "layer4.1.conv2",
                   "--channels", "0-15"],
    "sweep.json": ["ablate", "resnet18", IMAGES[0], *SMALL, "-f", "json", "--layer",
                   "layer4.1.conv2", "--channels", "0-47", "--sweep", "--sweep-batch", "16"],
    "sweep.csv": ["ablate", "resnet18", *IMAGES, *SMALL, "-f", "csv", "--layer", "layer3",
                  "--channels", "0-9", "--sweep"],
}

def _drop_column(name: str) -> Callable[[Any, Any], tuple[Any, Any]]:
    """A CSV column added since the recording: compare the others."""
    def change(recorded: Any, new: Any) -> tuple[Any, Any]:
        index = new[0].index(name)
        return recorded, [row[:index] + row[index + 1:] for row in new]
    return change


def _json_spelling(recorded: Any, new: Any) -> tuple[Any, Any]:
    """CSV booleans are written as JSON spells them (true/false), no longer True/False."""
    spelt = {"True": "true", "False": "false"}
    return [[spelt.get(c, c) if isinstance(c, str) else c for c in row] for row in recorded], new


def _leaves_only(recorded: Any, new: Any) -> tuple[Any, Any]:
    """``--layers 'layer1.*'`` selects the leaves under layer1, as the README says, no longer
    the BasicBlock containers layer1.0 and layer1.1 too."""
    containers = {"layer1.0", "layer1.1"}
    events = [e for e in recorded["events"] if e.get("name") not in containers]
    dropped = sum(1 for e in recorded["events"]
                  if e.get("name") in containers and e["event"] == "exit")
    summary = recorded["summary"] | {"calls": recorded["summary"]["calls"] - dropped}
    return recorded | {"events": events, "summary": summary}, new


def _new_key(key: str) -> Callable[[Any, Any], tuple[Any, Any]]:
    """A JSON field added since the recording."""
    return lambda recorded, new: (recorded, {k: v for k, v in new.items() if k != key})


#: Fields the envelope gained since the recording (issue 9): the model's source, its labels,
#: its preprocessing and, under ``weights``, its class count.
ENVELOPE_ADDITIONS = ("source", "labels", "preprocessing", "precision")


def _without_envelope_additions(doc: Any) -> Any:
    if isinstance(doc, list):
        return [_without_envelope_additions(d) for d in doc]
    if not isinstance(doc, dict) or "weights" not in doc:
        if isinstance(doc, dict) and isinstance(doc.get("summary"), dict):
            return doc | {"summary": _without_envelope_additions(doc["summary"])}
        return doc
    kept = {k: v for k, v in doc.items() if k not in ENVELOPE_ADDITIONS}
    if isinstance(doc["weights"], dict):
        kept["weights"] = {k: v for k, v in doc["weights"].items() if k != "num_classes"}
    if isinstance(kept.get("summary"), dict):
        kept["summary"] = _without_envelope_additions(kept["summary"])
    return kept


#: Fields ``layers`` gained since the recording (issue 9): FLOPs, MACs and bytes.
LAYERS_ADDITIONS = ("flops", "macs", "flops_own", "macs_own", "params_bytes",
                    "params_bytes_total", "output_bytes", "activation_bytes", "input_bytes")


def _without(keys: tuple[str, ...], doc: Any) -> Any:
    if isinstance(doc, list):
        return [_without(keys, d) for d in doc]
    if isinstance(doc, dict):
        return {k: _without(keys, v) for k, v in doc.items() if k not in keys}
    return doc


def _layers_json(recorded: Any, new: Any) -> tuple[Any, Any]:
    return recorded, _without(LAYERS_ADDITIONS, new)


def _layers_csv(recorded: Any, new: Any) -> tuple[Any, Any]:
    """Five columns added at the end (FLOPs, MACs, bytes), and JSON-spelt booleans."""
    return _json_spelling(recorded, [row[:10] for row in new])


#: Fields ``gradcam`` gained since the recording (issue 11): several layers, the task, the
#: smoothing options, metrics and skipped inputs; each result's ``layers`` and (issue 21)
#: ``constant``.
GRADCAM_ADDITIONS = ("layers", "layer_shapes", "task", "aug_smooth", "eigen_smooth", "guided",
                     "metrics", "skipped")


def _gradcam_json(recorded: Any, new: Any) -> tuple[Any, Any]:
    kept = {k: v for k, v in new.items() if k not in GRADCAM_ADDITIONS}
    kept["results"] = [{k: v for k, v in row.items() if k not in ("layers", "constant")}
                       for row in new["results"]]
    return recorded, kept


#: Documented changes since the recording (issue 8): case -> a function of the recorded and
#: the new output that takes out the documented difference and nothing else.
DOCUMENTED: dict[str, Callable[[Any, Any], tuple[Any, Any]]] = {
    "stats.csv": _drop_column("output_shapes"),
    "layers.csv": _layers_csv,
    "layers.json": _layers_json,
    "debug.json": _leaves_only,
    "grads.json": _new_key("first_nonfinite_param"),
    "gradcam.json": _gradcam_json,
}


def _run(args: list[str], workdir: Path) -> str:
    from typer.testing import CliRunner

    from hookscope.cli import app

    out = workdir / "out"
    argv = [str(out) if a == "OUT" else a for a in args]
    result = CliRunner().invoke(app, argv)
    if result.exit_code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.exit_code}: {result.stderr}")
    return result.stdout.replace(str(out), "OUT")


def outputs() -> Iterator[tuple[str, str]]:
    """Every case's output, run in-process from the repository root."""
    os.environ.setdefault("HOOKSCOPE_OFFLINE", "1")
    os.environ.setdefault("COLUMNS", "200")
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        for name, args in CASES.items():
            with tempfile.TemporaryDirectory(prefix="hookscope-golden-") as tmp:
                yield name, _run(args, Path(tmp))
    finally:
        os.chdir(cwd)


def parse(name: str, text: str) -> Any:
    """JSON, NDJSON (a list of documents) or CSV (a list of rows, numbers as floats)."""
    if name.endswith(".ndjson"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if name.endswith(".json"):
        return json.loads(text)
    rows = list(csv.reader(io.StringIO(text)))
    return [[_number(cell) for cell in row] for row in rows]


def _number(cell: str) -> Any:
    try:
        return float(cell)
    except ValueError:
        return cell


def differences(a: Any, b: Any, path: str = "", rel: float = 1e-4) -> list[str]:
    """Where two parsed outputs differ; floats are equal within ``rel`` (or 1e-6 absolute)."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = [f"{path}.{k}: only in the recording" for k in a if k not in b]
        found += [f"{path}.{k}: only in the new output" for k in b if k not in a]
        common = [k for k in b if k in a]
        if [k for k in a if k in b] != common:
            found.append(f"{path}: keys in another order: {common}")
        for k in a:
            if k in b:
                found += differences(a[k], b[k], f"{path}.{k}", rel)
        return found
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{path}[{i}]", rel)]
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        if math.isclose(a, b, rel_tol=rel, abs_tol=1e-6) or (math.isnan(a) and math.isnan(b)):
            return []
    elif a == b:
        return []
    return [f"{path}: {a!r} != {b!r}"]


def compare() -> dict[str, list[str]]:
    """Per case, the differences between the recording (updated by DOCUMENTED) and now."""
    found: dict[str, list[str]] = {}
    for name, text in outputs():
        recorded = parse(name, (GOLDEN / name).read_text(encoding="utf-8"))
        new = _without_envelope_additions(parse(name, text))
        if name in DOCUMENTED:
            recorded, new = DOCUMENTED[name](recorded, new)
        diff = differences(recorded, new)
        if diff:
            found[name] = diff
    return found


def main(argv: list[str]) -> int:
    if argv[:1] == ["record"]:
        GOLDEN.mkdir(exist_ok=True)
        for name, text in outputs():
            (GOLDEN / name).write_text(text, encoding="utf-8")
            print(f"recorded {name}", file=sys.stderr)
        return 0
    if argv[:1] == ["compare"]:
        found = compare()
        for name, diff in found.items():
            print(f"{name}: {len(diff)} difference(s)")
            for line in diff[:20]:
                print(f"  {line}")
        return 1 if found else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
