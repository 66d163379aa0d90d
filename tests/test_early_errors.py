"""A missing INPUT, or an output file or folder that cannot be written, is refused before torch is imported
(importing it takes seconds, and tens of seconds on a loaded machine): whether torch got
imported is asked of the process, not timed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import SAMPLES

#: Runs the command line in-process once per argument list; prints each one's exit code,
#: stderr and whether torch is imported by then.
SCRIPT = """
import contextlib, io, json, sys
from hookscope.cli import app

found = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            app(args, prog_name="hookscope")
        except SystemExit as exc:
            code = exc.code
    found.append([code, err.getvalue(), "torch" in sys.modules])
print(json.dumps(found))
"""

CAT = str(SAMPLES / "cat.jpg")
MISSING = [
    ["stats", "resnet18", "missing.jpg"],
    ["stats", "resnet18", CAT, "missing.jpg"],
    ["layers", "resnet18", "missing.jpg"],
    ["debug", "resnet18", "missing.jpg"],
    ["gradcam", "resnet18", "missing.jpg", "--out", "cams"],
    ["grads", "resnet18", "missing.jpg"],
    ["features", "resnet18", "missing.jpg", "--out", "feats"],
    ["ablate", "resnet18", "missing.jpg", "--layer", "layer4"],
    ["check", "resnet18", "missing.jpg"],
    ["diff", "resnet18", "missing.jpg", "--against-weights", "none"],
    ["report", "resnet18", "missing.jpg", "-o", "page.html"],
    ["watch", "resnet18", "missing.jpg"],
]


@pytest.mark.slow
def test_a_missing_input_or_output_is_refused_before_torch_is_imported(tmp_path) -> None:
    runs = [*MISSING, ["features", "resnet18", CAT, "-l", "layer1", "--out", "/proc/feats"],
            ["gradcam", "resnet18", CAT, "--out", "/proc/cams"],
            ["stats", "resnet18", CAT, "--output", "no/such/dir/out.json"]]
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(runs)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    for args, (code, err, torch_imported) in zip(runs, found, strict=True):
        assert code == 2, (args, err)
        assert len(err.strip().splitlines()) == 1, (args, err)
        assert not torch_imported, (args, err)
    for _, err, _ in found[:len(MISSING)]:
        assert err.strip() == "hookscope: error: missing.jpg: no such file or directory."
    assert all("Cannot write to folder /proc/" in err for _, err, _ in found[-3:-1])
    assert "no/such/dir" in found[-1][1]
    assert list(tmp_path.iterdir()) == []  # nothing written, not even an empty folder
