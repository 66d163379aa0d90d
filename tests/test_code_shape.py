"""The size limits of the design notes, enforced: a module fits in 600 lines, a class in 250
and a function on a screen (60).

A failure names the offender, so splitting it by idea is the next step, not a raised limit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hookscope"
SOURCES = sorted(PACKAGE.rglob("*.py"))
LIMITS = {"module": 600, "class": 250, "function": 60}


def _too_long(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(root)
    found = []
    if (lines := len(text.splitlines())) > LIMITS["module"]:
        found.append(f"{where}: {lines} lines")
    for node in ast.walk(ast.parse(text)):
        kind = "class" if isinstance(node, ast.ClassDef) else "function" if isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef) else None
        if kind is not None:
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMITS[kind]:
                found.append(f"{where}:{node.lineno} {kind} {node.name}: {length} lines")
    return found


def test_the_sources_are_found() -> None:
    assert len(SOURCES) > 50 and PACKAGE / "cli.py" in SOURCES


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(PACKAGE)) for p in SOURCES])
def test_within_the_size_limits(path: Path) -> None:
    assert not _too_long(path), _too_long(path)


def test_the_check_can_fail(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(70))
    long.write_text(f"def f():\n{body}\n", encoding="utf-8")
    assert _too_long(long, tmp_path) == ["long.py:1 function f: 71 lines"]
