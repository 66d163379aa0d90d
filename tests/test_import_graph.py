"""hookscope's modules import one another without a circle, lazy imports included.

Every module under ``hookscope/`` is parsed (not imported) and every ``import`` statement
counts, at the top or inside a function; only ``if TYPE_CHECKING:`` blocks are left out,
since they never run. A circle hidden behind a function-level import is still a circle: the
two modules cannot be understood, tested or moved apart.

The layers are checked too: a module imports only from its own layer or the ones below it, so
the arrows run downward from the command line to the core.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hookscope"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def imports(path: Path, modules: set[str]) -> set[str]:
    """The hookscope modules ``path`` imports (a name imported from a package counts as its
    submodule when there is one)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                      for a in node.names}
    return {name for name in found if name in modules and name != here}


def graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports(f, modules) for f in files}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_lazy_imports() -> None:
    edges = graph()
    assert "hookscope.render.views" in edges["hookscope.cli"] or any(
        "hookscope.render" in e for e in edges["hookscope.cli"])
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    assert cycles(graph()) == []


# Lowest first. A module belongs to the first layer whose prefix it starts with; the package
# root (``hookscope``, a lazy table that Python imports before any submodule) belongs to none.
LAYERS = (
    ("hookscope.core",),
    ("hookscope.numerics",),
    ("hookscope.inputs",),
    ("hookscope.sources",),
    ("hookscope.cam",),
    ("hookscope.probes",),
    ("hookscope.checks", "hookscope.report"),
    ("hookscope.training",),
    ("hookscope.integrations",),
    ("hookscope.render",),
    ("hookscope.catalog", "hookscope.session", "hookscope.options",
     "hookscope.cli_watch", "hookscope.cli", "hookscope.__main__"),
)


def layer(module: str) -> int | None:
    for level, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return None


def upward(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            low, high = layer(source), layer(target)
            if low is not None and high is not None and high > low:
                found.append(f"{source} -> {target}")
    return found


def test_every_module_has_a_layer() -> None:
    assert [m for m in graph() if m != "hookscope" and layer(m) is None] == []


def test_imports_only_run_downward() -> None:
    assert upward({"hookscope.core.run": {"hookscope.render.views"}}) == [
        "hookscope.core.run -> hookscope.render.views"]
    assert upward(graph()) == []
