"""Consoles, log lines, errors and progress bars: data on stdout, chatter on stderr."""

from __future__ import annotations

import io
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from hookscope.core.streams import DataFile, data

_stdout: Console | None = None
_stderr: Console | None = None


class _DataConsole(Console):
    """stdout console whose closed pipe (``hookscope ... | head``) is not an error."""

    def on_broken_pipe(self) -> None:
        # Rich would exit with code 1; the CLI treats BrokenPipeError as a reader that left.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, data().fileno())
        raise BrokenPipeError("stdout was closed")


def _width(terminal: bool, pipe: int) -> int | None:
    """The width to draw at: COLUMNS when it is a positive number (None: Rich reads it);
    otherwise the terminal's, or ``pipe`` columns for a pipe or file."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return None
    return shutil.get_terminal_size().columns if terminal else pipe


def stdout() -> Console:
    """The console for data (tables, trees); it writes to :func:`~.streams.data`."""
    global _stdout
    if _stdout is None:
        file: object = DataFile()
        terminal = Console(file=file).is_terminal  # type: ignore[arg-type]
        # Piped tables keep one row per line instead of folding at 80 columns.
        _stdout = _DataConsole(soft_wrap=False, file=file,  # type: ignore[arg-type]
                               width=_width(terminal, 200))
    return _stdout


def stderr() -> Console:
    """The console for chatter: progress, notes, warnings, errors."""
    global _stderr
    if _stderr is None:
        width = None if "COLUMNS" not in os.environ else _width(sys.stderr.isatty(), 80)
        _stderr = Console(stderr=True, highlight=False, width=width)
    return _stderr


def render_text(renderable: RenderableType, width: int = 160) -> str:
    """Render to plain text (no colour, no trailing spaces), for a file or a pipe."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(renderable)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


def error(message: str) -> None:
    """One plain line on stderr (no markup, so file names print as they are)."""
    sys.stderr.write(f"hookscope: error: {message}\n")
    sys.stderr.flush()


class _LineHandler(logging.Handler):
    """One line per message; a message said once already in this invocation is not
    repeated (``diff`` loads the model twice, and each load has the same notes)."""

    def __init__(self) -> None:
        super().__init__()
        self._said: set[tuple[int, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        said = (record.levelno, record.getMessage())
        if said not in self._said:
            self._said.add(said)
            level = "warning" if record.levelno >= logging.WARNING else "note"
            sys.stderr.write(f"hookscope: {level}: {said[1]}\n")
            sys.stderr.flush()


def setup_logging(*, quiet: bool = False) -> None:
    """Route the library's ``hookscope`` logger to one line per message on stderr."""
    logger = logging.getLogger("hookscope")
    for handler in list(logger.handlers):
        if isinstance(handler, _LineHandler):
            logger.removeHandler(handler)
    logger.addHandler(_LineHandler())
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False


class Bar:
    """Progress callback: ``bar(n)`` advances by ``n``; ``bar.expect(total)`` sets the total
    once it is known. Does nothing when no bar is shown."""

    def __init__(self, update: Callable[..., None] = lambda **_: None) -> None:
        self._update = update  # Progress.update of one task

    def __call__(self, n: int = 1) -> None:
        self._update(advance=n)

    def expect(self, total: int) -> None:
        self._update(total=total)


@contextmanager
def progress(total: int | None, description: str, *, enabled: bool) -> Iterator[Bar]:
    """A Rich progress bar on stderr, shown only when stderr is a terminal."""
    console = stderr()
    if not enabled or not console.is_terminal:
        yield Bar()
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                  transient=True) as bar:
        yield Bar(partial(bar.update, bar.add_task(description, total=total)))
