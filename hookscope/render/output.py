"""Serialisation and all-or-nothing file writing, shared by every command."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

from hookscope.errors import HookscopeError


def jsonable(obj: Any) -> Any:
    """Plain JSON types; non-finite floats become None (written as ``null``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Enum):
        return obj.value
    if hasattr(obj, "to_dict"):
        return jsonable(obj.to_dict())
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return jsonable(obj.item())
    return obj


def dumps_json(doc: Any, *, indent: int | None = 2) -> str:
    """One JSON document, strict (no NaN/Infinity tokens), newline-terminated."""
    return json.dumps(jsonable(doc), indent=indent, allow_nan=False) + "\n"


def dumps_ndjson(event: Any) -> str:
    """One compact JSON object on one line."""
    return json.dumps(jsonable(event), allow_nan=False, separators=(",", ":")) + "\n"


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return format_shapes(value)
    if isinstance(value, Mapping):
        return json.dumps(jsonable(value), separators=(",", ":"))
    return value


def format_shape(shape: Sequence[int] | None) -> str:
    """``[1, 3, 224, 224]`` as ``1x3x224x224``."""
    return "" if shape is None else "x".join(str(d) for d in shape)


def format_shapes(value: Sequence[Any]) -> str:
    """A shape, or a list of shapes joined by ``;``."""
    if value and all(isinstance(v, (list, tuple)) for v in value):
        return ";".join(format_shape(v) for v in value)
    if all(isinstance(v, int) for v in value):
        return format_shape(value)
    return json.dumps(jsonable(value), separators=(",", ":"))


def dumps_csv(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """CSV with a header; shapes as ``AxBxC`` (several joined by ``;``), non-finite as empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def check_writable(path: Path, *, force: bool) -> None:
    """Fail before any work when ``path`` exists (without ``force``) or cannot be created."""
    if path.exists() and not force:
        raise HookscopeError(f"{path} already exists; pass --force to overwrite it.")
    if path.exists() and path.is_dir():
        raise HookscopeError(f"{path} is a directory; give a file name.")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise HookscopeError(f"{parent}: no such directory for the output file.")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only on success.

    On any exception the temporary file is removed, so no partial output ever exists.
    """
    check_writable(path, force=force)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent or ".")
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual mode
    try:
        yield tmp_path
        if path.exists() and not force:  # appeared while we worked
            raise HookscopeError(f"{path} already exists; pass --force to overwrite it.")
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(path: Path, text: str, *, force: bool = False) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path, force=force) as tmp:
        tmp.write_text(text, encoding="utf-8")


def emit(text: str, output: Path | None, *, force: bool = False) -> None:
    """Send data to ``output`` (atomically) or to stdout."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text(output, text, force=force)
