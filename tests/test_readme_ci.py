"""The README's CI job runs as written on the sample images."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ci_script() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- ci-job -->\n```bash\n(.*?)\n```", text, re.S)
    assert found, "the README lost its CI job"
    return found.group(1)


@pytest.mark.slow
def test_the_readme_ci_job_runs_as_written(tmp_path) -> None:
    shutil.copytree(ROOT / "sample_images", tmp_path / "sample_images")
    env = os.environ | {"HOOKSCOPE_OFFLINE": "1",
                        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(["bash", "-c", ci_script()], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "::notice title=hookscope check::resnet18: all 5 rules passed" in run.stdout
    import json
    import xml.etree.ElementTree as ET

    suite = ET.parse(tmp_path / "hookscope-junit.xml").getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests")) == 5
    diff = json.loads((tmp_path / "diff-bfloat16.json").read_text())
    assert diff["first_divergence"] is None and diff["outputs"]["top1_agreement"] == 1.0
    # The baseline is reused on the second run; a changed model fails the job.
    again = subprocess.run(["bash", "-c", ci_script()], cwd=tmp_path, env=env | {"WEIGHTS": "none",
                           "MODEL": "resnet18", "IMAGES": "sample_images/"},
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    changed = subprocess.run(
        ["bash", "-c", ci_script().replace('--weights "$WEIGHTS" --rules',
                                           '--weights "$WEIGHTS" --seed 1 --rules')],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert changed.returncode == 1 and "::error title=hookscope check%3A" in changed.stdout
