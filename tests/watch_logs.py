"""Reading a watch's log directory in the tests: plain JSON, no hookscope code involved."""

from __future__ import annotations

import json
from pathlib import Path


def read_log(folder: str | Path) -> tuple[dict, list[dict], dict | None]:
    """The envelope (first line of ``watch.jsonl``), the logging-step lines, and
    ``nonfinite.json`` (None when absent)."""
    folder = Path(folder)
    lines = [json.loads(text) for text in (folder / "watch.jsonl").read_text().splitlines()]
    event = folder / "nonfinite.json"
    return lines[0], lines[1:], json.loads(event.read_text()) if event.exists() else None
