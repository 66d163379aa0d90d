"""The one output path: every command's document drawn as a table or written as JSON or CSV.

Each command registers its view here once: a function that draws the document with Rich,
and, where the command has one, a function that lays it out as CSV rows and columns.
:func:`emit` does the rest for every command, so adding a command adds a view, not a switch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import RenderableType

from hookscope.errors import HookscopeError
from hookscope.render import console
from hookscope.render.output import Output, dumps_csv, dumps_json, dumps_ndjson, write

Doc = Mapping[str, Any]
Rows = tuple[list[dict[str, Any]], Sequence[str]]


@dataclass(frozen=True)
class View:
    """How one command's document is shown: a Rich renderable, and optionally CSV, a
    matplotlib figure (``--plot``) and formats of its own, each the document as text (such
    as ``check``'s GitHub annotations)."""

    table: Callable[..., RenderableType]
    csv: Callable[..., Rows] | None = None
    plot: Callable[..., Any] | None = None
    texts: Mapping[str, Callable[[Doc], str]] = field(default_factory=dict)


VIEWS: dict[str, View] = {}


def register(command: str, *, csv: Callable[..., Rows] | None = None,
             plot: Callable[..., Any] | None = None,
             texts: Mapping[str, Callable[[Doc], str]] | None = None,
             ) -> Callable[[Callable[..., RenderableType]], Callable[..., RenderableType]]:
    """Register ``command``'s table view (the decorated function), its CSV layout, its
    figure and its own text formats."""

    def wrap(table: Callable[..., RenderableType]) -> Callable[..., RenderableType]:
        if command in VIEWS:
            raise ValueError(f"a view for {command!r} is already registered")
        VIEWS[command] = View(table, csv, plot, dict(texts or {}))
        return table

    return wrap


def formats(command: str) -> list[str]:
    """The formats ``command`` can be emitted in."""
    _load()
    view = VIEWS[command]
    return ["table", "json", *(["csv"] if view.csv else []), *view.texts]


def emit(command: str, doc: Doc, fmt: str, output: Output, **options: Any) -> None:
    """Write ``doc`` as ``fmt`` (table, json, ndjson, csv, or a text format of the command's
    own) to ``output``.

    A table goes to the terminal with colour, or as plain text into a file. ``options`` go
    to the view (for example ``input_stats=True`` for ``stats``).

    Raises:
        HookscopeError: the command has no such format, or the output cannot be written.
    """
    _load()
    view = VIEWS[command]
    if fmt == "json":
        write(output, dumps_json(doc))
    elif fmt == "ndjson":
        write(output, dumps_ndjson(doc))
    elif fmt in view.texts:
        write(output, view.texts[fmt](doc))
    elif fmt == "csv":
        if view.csv is None:
            raise HookscopeError(f"{command} has no CSV output; use --format table or json.")
        rows, columns = view.csv(doc, **options)
        write(output, dumps_csv(rows, columns))
    elif output.is_stdout and console.stdout().is_terminal:
        console.stdout().print(view.table(doc, **options))
    else:  # a file or a pipe: plain text, at the width a pipe gets
        width = console.stdout().width if output.is_stdout else 160
        write(output, console.render_text(view.table(doc, **options), width))


def emit_plot(command: str, doc: Doc, output: Output | None, **options: Any) -> None:
    """Draw ``command``'s figure of ``doc`` and write it to ``output`` (SVG or PNG, from its
    suffix; atomically). Nothing happens without an output."""
    if output is None:
        return
    from hookscope.render.plots import render_plot, write_plot

    _load()
    figure = VIEWS[command].plot
    if figure is None:
        raise HookscopeError(f"{command} has no plot.")
    write_plot(render_plot(figure(doc, **options), output), output)


def _load() -> None:
    """Import the modules that register views (they import Rich, so only when drawing)."""
    from hookscope.render import layouts  # noqa: F401
