"""Golden outputs: one recorded output per command and format, compared field by field.

Every case runs the CLI in-process on the seeded tiny model ``tests/golden_model.py:Tiny``
(``--weights none``, 32 px, the two sample images), with one thread, tables at a fixed width
of 160 columns. Only what cannot repeat is normalised: this checkout's and the temporary
folder's paths, the versions of hookscope, torch, torchvision and Python, timestamps,
embedded images' bytes (kept as their format and size), and matplotlib's SVG ids. Nothing
else is filtered: a field added to an output changes its golden file.

To re-record after an intended change of outputs (new fields, new values)::

    python -m tests.golden record     # rewrite tests/golden/ from the current code
    git diff tests/golden             # exactly what changed: review it, commit it
    python -m tests.golden compare    # print the differences without writing

Numbers are compared with tolerances derived from how they are computed (see
:func:`tolerance`), so the goldens hold on any CPU (AVX2 or AVX-512, Intel or AMD).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import platform
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
MODEL = "tests/golden_model.py:Tiny"
IMAGES = ["sample_images/cat.jpg", "sample_images/coffee.jpg"]
SMALL = ["--weights", "none", "--size", "32"]
RUN = [MODEL, *IMAGES, *SMALL]
#: The width tables are drawn at.
WIDTH = "160"


@dataclass(frozen=True)
class Case:
    """A command line (``OUT`` is a fresh folder), the file it writes there to record instead
    of stdout, its exit code, and what it needs in ``OUT`` first."""

    args: list[str]
    read: str | None = None
    code: int = 0
    setup: Callable[[Path], None] | None = None


def _stats_documents(out: Path) -> None:
    """Two stats documents of different seeds: a baseline and another run."""
    for seed, name in (("0", "a.json"), ("1", "b.json")):
        _run(["stats", *RUN, "--seed", seed, "-f", "json", "-o", str(out / name)], out, 0)


def _other_weights(out: Path) -> None:
    """A checkpoint of the tiny model with another seed, for a live diff."""
    import torch

    from tests.golden_model import Tiny

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        torch.save(Tiny().state_dict(), out / "other.pt")


CHECK = ["check", *RUN, "--max-zero-fraction", "0.5"]  # the ReLUs' 55% zeros fail it
SWEEP = ["ablate", *RUN, "--layer", "features.3", "--channels", "0-7", "--sweep"]

CASES: dict[str, Case] = {
    "stats.json": Case(["stats", *RUN, "-f", "json", "--percentiles", "1,50,99"]),
    "stats.csv": Case(["stats", *RUN, "-f", "csv", "--input-stats"]),
    "stats.txt": Case(["stats", *RUN]),
    "stats_channels.json": Case(["stats", *RUN, "-f", "json", "--per-channel", "--layers",
                                 "features.3"]),
    "models.json": Case(["models", "resnet", "-f", "json"]),
    "models.csv": Case(["models", "resnet", "-f", "csv"]),
    "models.txt": Case(["models", "resnet"]),
    "layers.json": Case(["layers", MODEL, IMAGES[0], *SMALL, "-f", "json"]),
    "layers.csv": Case(["layers", MODEL, IMAGES[0], *SMALL, "-f", "csv"]),
    "layers.txt": Case(["layers", MODEL, IMAGES[0], *SMALL]),
    "debug.json": Case(["debug", *RUN, "-f", "json"]),
    "debug.ndjson": Case(["debug", MODEL, IMAGES[0], *SMALL,
                          "-f", "ndjson", "--max-depth", "1"]),
    "gradcam.json": Case(["gradcam", *RUN, "-f", "json", "-m", "gradcam", "-m", "eigencam",
                          "--out", "OUT/cams", "--save-raw"]),
    "grads.json": Case(["grads", *RUN, "-f", "json"]),
    "grads.csv": Case(["grads", *RUN, "-f", "csv", "--loss", "ce", "--label", "3"]),
    "grads.txt": Case(["grads", *RUN]),
    "features.json": Case(["features", *RUN, "-f", "json", "--layer", "features.0",
                           "--layer", "features.3", "--out", "OUT/maps"]),
    "features.csv": Case(["features", MODEL, IMAGES[0], *SMALL, "-f", "csv", "--type", "ReLU",
                          "--out", "OUT/maps"]),
    "ablate.json": Case(["ablate", *RUN, "-f", "json", "--layer", "features.3", "--channels",
                         "0-7", "--mode", "noise:0.5"]),
    "ablate.csv": Case(["ablate", *RUN, "-f", "csv", "--layer", "features.3", "--channels",
                        "0-3"]),
    "ablate.txt": Case(["ablate", *RUN, "--layer", "features.3", "--channels", "0-3"]),
    "sweep.json": Case([*SWEEP, "-f", "json", "--sweep-batch", "4"]),
    "sweep.csv": Case([*SWEEP, "-f", "csv"]),
    "check.txt": Case(CHECK, code=1),
    "check.json": Case([*CHECK, "-f", "json", "--baseline", "OUT/b.json", "--max-mean-drift",
                        "0.5"], code=1, setup=_stats_documents),
    "check.github": Case([*CHECK, "-f", "github"], code=1),
    "check.junit.xml": Case([*CHECK, "--junit", "OUT/check.xml"], read="check.xml", code=1),
    "diff.json": Case(["diff", *RUN, "-f", "json", "--against-weights", "OUT/other.pt"],
                      setup=_other_weights),
    "diff.txt": Case(["diff", *RUN, "--against-weights", "OUT/other.pt"], setup=_other_weights),
    "diff_offline.json": Case(["diff", "OUT/a.json", "OUT/b.json", "-f", "json"],
                              setup=_stats_documents),
    "diff_offline.txt": Case(["diff", "OUT/a.json", "OUT/b.json"], setup=_stats_documents),
    "report.html": Case(["report", *RUN, "-o", "OUT/report.html"], read="report.html"),
}


def _run(argv: list[str], out: Path, code: int) -> str:
    from typer.testing import CliRunner

    from hookscope.cli import app
    from hookscope.render import console

    console._stdout = None  # made afresh, at WIDTH columns, and forgotten after
    try:
        result = CliRunner().invoke(app, argv, env={"COLUMNS": WIDTH, "HOOKSCOPE_OFFLINE": "1"})
    finally:
        console._stdout = None
    if result.exit_code != code:
        raise RuntimeError(f"{' '.join(argv)} exited {result.exit_code}, not {code}: "
                           f"{result.stderr}")
    return result.stdout


def output(name: str) -> str:
    """One case's output, normalised, run in-process from the repository root on one thread."""
    import torch

    case = CASES[name]
    cwd, threads = Path.cwd(), torch.get_num_threads()
    os.chdir(ROOT)
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="hookscope-golden-") as tmp:
            out = Path(tmp)
            if case.setup is not None:
                case.setup(out)
            text = _run([a.replace("OUT", str(out)) for a in case.args], out, case.code)
            if case.read is not None:
                text = (out / case.read).read_text(encoding="utf-8")
            return normalise(text, out)
    finally:
        torch.set_num_threads(threads)
        os.chdir(cwd)


def _versions() -> dict[str, str]:
    import torch
    import torchvision

    import hookscope

    return {hookscope.__version__: "<hookscope-version>", torch.__version__: "<torch-version>",
            torchvision.__version__: "<torchvision-version>",
            platform.python_version(): "<python-version>"}


TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?")
#: Matplotlib's SVG ids: a hash of the drawn path, which float noise changes.
SVG_ID = re.compile(r"(?<=[\"#(])[mp][0-9a-f]{10}(?=[\")])")
IMAGE = re.compile(r"data:image/(png|jpeg|webp);base64,([A-Za-z0-9+/=]+)")


def _image_size(match: re.Match[str]) -> str:
    """An embedded image as its format and size: its bytes depend on the codec's version."""
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(match.group(2)))) as image:
        size = f"{image.width}x{image.height}"
    return f"data:image/{match.group(1)};base64,<{match.group(1)} {size}>"


def normalise(text: str, out: Path) -> str:
    """What cannot repeat from one run or machine to another, replaced by a placeholder."""
    text = text.replace(str(out), "OUT").replace(f"{ROOT}/", "").replace(str(ROOT), ".")
    for version, placeholder in sorted(_versions().items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf'(?<![\w.]){re.escape(version)}(?![\w])', placeholder, text)
    text = SVG_ID.sub("<svg-id>", TIMESTAMP.sub("<time>", text))
    return IMAGE.sub(_image_size, text)


# ---------------------------------------------------------------------------- comparing

#: Relative noise allowed in a float, of its operands' magnitude. A float32 sum of n terms
#: is off by at most n·u·Σ|x| (u = 2^-24): the tiny model's longest float32 sums are its
#: 16x16 average pool (256 terms) and its convolutions (72), so another order of summation
#: (another SIMD width or CPU) moves a layer's output by at most 256·u = 1.5e-5 of its
#: operands, and four such layers deep by 6e-5. The statistics' own sums are float64, or
#: float32 held to 1e-4 by tests/test_stats.py.
REL = 1e-4
#: The largest |logit| of the tiny model on the sample images is about 5 (logits scaled by 10,
#: see ``golden_model.Tiny``): differences of logits are held to REL of this.
LOGITS = 10.0
#: Fields that are differences of logits: their operands are logits, not the result.
LOGIT_DIFFERENCES = frozenset({"drop", "delta_logit", "logit_drop"})
#: Fields that are differences of probabilities: their operands are at most 1, so two nearly
#: equal probabilities cancel to a result far smaller than their noise (REL of 1).
PROB_DIFFERENCES = frozenset({"delta_prob"})


def tolerance(field: str, value: float, row: dict[str, Any]) -> float:
    """The absolute tolerance of a float ``field`` in ``row``: REL of its operands' magnitude.

    A difference of logits: REL of the logits' magnitude; of probabilities: REL of 1. Any
    other float: REL of the largest float in its row (a mean near zero is the sum of values
    as large as the row's min, max and std, and carries their noise, not a noise relative to
    itself).
    """
    if field in LOGIT_DIFFERENCES:
        return REL * max(abs(value), LOGITS)
    if field in PROB_DIFFERENCES:
        return REL * max(abs(value), 1.0)
    floats = [abs(v) for v in row.values() if isinstance(v, float) and math.isfinite(v)]
    return REL * max([abs(value), *floats])


def parse(name: str, text: str) -> Any:
    """JSON, NDJSON (a list), CSV (a list of rows as dicts) or text (a list of lines)."""
    if name.endswith(".ndjson"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if name.endswith(".json"):
        return json.loads(text)
    if name.endswith(".csv"):
        return [{k: _cell(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]
    return text.splitlines()


def _cell(cell: str) -> Any:
    for kind in (int, float):
        try:
            return kind(cell)
        except ValueError:
            pass
    return cell


def differences(a: Any, b: Any, path: str = "", field: str = "", row: Any = None
                ) -> list[str]:
    """Where a recorded and a new parsed output differ: strings, ints and bools exactly,
    floats within :func:`tolerance`, lines of text within :func:`line_differences`."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return [f"{path}: keys {list(a)} != {list(b)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}", k, a)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        if all(isinstance(x, str) for x in a) and a and all(isinstance(x, str) for x in b):
            if path == "":  # text: one line each
                return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                        for d in line_differences(x, y, f"line {i + 1}")]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]", field, row)]
    if type(a) is float and type(b) in (float, int):
        if math.isclose(a, b, rel_tol=0, abs_tol=tolerance(field, a, row or {})):
            return []
    elif type(a) is int and type(b) is float and a == b:
        return []
    elif a == b and type(a) is type(b):
        return []
    return [f"{path}: {a!r} != {b!r}"]


NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def line_differences(a: str, b: str, where: str) -> list[str]:
    """A line of text: the words alike (runs of spaces aside, since a table's columns take
    their width from what they print) and each number within REL of the line's largest
    number, or one unit of its last printed digit (a value on a rounding boundary)."""
    words_a, words_b = NUMBER.split(a), NUMBER.split(b)
    numbers_a, numbers_b = NUMBER.findall(a), NUMBER.findall(b)
    if len(numbers_a) != len(numbers_b) or \
            [" ".join(w.split()) for w in words_a] != [" ".join(w.split()) for w in words_b]:
        return [f"{where}: {a.strip()!r} != {b.strip()!r}"]
    scale = max([abs(float(n)) for n in numbers_a] or [0.0])
    for x, y in zip(numbers_a, numbers_b, strict=True):
        if abs(float(x) - float(y)) > max(REL * scale, _last_digit(x), _last_digit(y)):
            return [f"{where}: {x} != {y} in {a.strip()!r} / {b.strip()!r}"]
    return []


def _last_digit(number: str) -> float:
    """One unit of the last printed digit: 0.01 for ``1.25``, 1e-6 for ``1.5e-05``."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** max(-300, min(300, int(exponent or 0) - decimals))


def compare(name: str) -> list[str]:
    """The differences between the recording of ``name`` and its output now."""
    recorded = (GOLDEN / name).read_text(encoding="utf-8")
    return differences(parse(name, recorded), parse(name, output(name)))


def record(names: Iterator[str] | list[str]) -> None:
    GOLDEN.mkdir(exist_ok=True)
    for stale in set(p.name for p in GOLDEN.iterdir()) - set(CASES):
        (GOLDEN / stale).unlink()
    for name in names:
        (GOLDEN / name).write_text(output(name), encoding="utf-8")
        print(f"recorded {name}", file=sys.stderr)


def main(argv: list[str]) -> int:
    os.environ.setdefault("HOOKSCOPE_OFFLINE", "1")
    names = [n for n in argv[1:] if n in CASES] or list(CASES)
    if argv[:1] == ["record"]:
        record(names)
        return 0
    if argv[:1] == ["compare"]:
        found = {name: diff for name in names if (diff := compare(name))}
        for name, diff in found.items():
            print(f"{name}: {len(diff)} difference(s)")
            for line in diff[:20]:
                print(f"  {line}")
        return 1 if found else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
