"""The one output path: every command's document drawn as a table or written as JSON, CSV or
an HTML page, through the views registered in :mod:`hookscope.render.layouts`. The one
exception is ``debug``'s live trace, which streams (:class:`hookscope.render.tree.TraceWriter`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from hookscope.core.errors import HookscopeError
from hookscope.core.files import Output, dumps_csv, dumps_json, dumps_ndjson, write
from hookscope.render import console
from hookscope.render.html import count


def emit(command: str, doc: Any, fmt: str, output: Output, **options: Any) -> None:
    """Write ``doc`` as ``fmt`` (table, json, ndjson, csv, or a text format of the command's
    own, such as ``html``) to ``output``; ``options`` go to the view.

    ``doc`` is the command's JSON document, or for a page the report it draws. A table goes
    to the terminal with colour, or as plain text into a file or a pipe.

    Raises:
        HookscopeError: the command has no such format, or the output cannot be written.
    """
    from hookscope.render.layouts import VIEWS  # imports every view module

    view, start = VIEWS[command], time.perf_counter()
    if fmt in view.texts:
        text = view.texts[fmt](doc, **options)
        write(output, text)
        if fmt == "html":
            size = len(text.encode("utf-8", "surrogateescape"))
            logging.getLogger("hookscope").info("wrote %s (%s) in %.2f s", output,
                                                count(size, "B"), time.perf_counter() - start)
    elif fmt == "json":
        write(output, dumps_json(doc))
    elif fmt == "ndjson":
        write(output, dumps_ndjson(doc))
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


def emit_plot(command: str, doc: Mapping[str, Any], output: Output | None, **options: Any) -> None:
    """Draw ``command``'s figure of ``doc`` and write it to ``output`` (SVG or PNG, from its
    suffix; atomically). Nothing happens without an output."""
    if output is None:
        return
    from hookscope.render.layouts import VIEWS
    from hookscope.render.plots import write_plot

    figure = VIEWS[command].plot
    if figure is None:
        raise HookscopeError(f"{command} has no plot.")
    write_plot(figure(doc, **options), output)
