"""Documents (their envelope, JSON and CSV), and all-or-nothing output: one file, a stream
or device, or a staged folder.

Streams (``-``, links to our stdout/stderr), devices, FIFOs and sockets are written in place;
a regular file (or a link's target) is written beside itself and renamed into place, an
existing one only with ``force``. Every ``OSError`` becomes one :class:`HookscopeError`, and
no temporary file survives a failure, Ctrl-C included."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import secrets
import socket
import stat
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from enum import Enum
from itertools import takewhile
from pathlib import Path
from typing import Any

from hookscope import __version__
from hookscope.core.errors import HookscopeError
from hookscope.core.streams import data as _data_stream


def envelope(command: str, *, model: str | None = None, weights: Any = None,
             device: str | None = None, inputs: Iterable[str] = (), **more: Any) -> dict[str, Any]:
    """The head every command's JSON document starts with, then ``more``."""
    return {"hookscope": __version__, "command": command, "model": model, "weights": weights,
            "device": device, "inputs": list(inputs), **more}


_PLAIN = frozenset({int, str, bool, type(None)})


def jsonable(obj: Any) -> Any:
    """Plain JSON types, from subclasses, tuples, paths, enums, rows and scalars too;
    non-finite floats become None (written as ``null``)."""
    kind = type(obj)  # the exact built-in types first: a watch line is thousands of them
    if kind is float:
        return obj if math.isfinite(obj) else None
    if kind in _PLAIN:
        return obj
    if kind is dict:
        return {k if type(k) is str else str(k): jsonable(v) for k, v in obj.items()}
    if kind is list:
        return [jsonable(v) for v in obj]
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
    if callable(getattr(obj, "item", None)):  # numpy / torch scalars
        return jsonable(obj.item())
    return obj


def dumps_json(doc: Any, *, indent: int | None = 2) -> str:
    """One JSON document, strict (no NaN/Infinity tokens), newline-terminated."""
    return json.dumps(jsonable(doc), indent=indent, allow_nan=False) + "\n"


def dumps_ndjson(event: Any) -> str:
    """One compact JSON object on one line."""
    return json.dumps(jsonable(event), allow_nan=False, separators=(",", ":")) + "\n"


def _cell(value: Any) -> Any:
    if callable(getattr(value, "item", None)) and getattr(value, "ndim", None) == 0:
        value = value.item()  # numpy and 0-d torch scalars
    if value is None:
        return ""
    if isinstance(value, bool):  # before numbers: bool is an int
        return "true" if value else "false"
    if isinstance(value, float):  # float() first: repr of a numpy float names its type
        return repr(float(value)) if math.isfinite(value) else ""
    if isinstance(value, (list, tuple)):
        return format_shapes(value)
    if isinstance(value, Mapping):
        return json.dumps(jsonable(value), separators=(",", ":"))
    return value


def format_shape(shape: Sequence[int] | None) -> str:
    """``[1, 3, 224, 224]`` as ``1x3x224x224``."""
    return "" if shape is None else "x".join(str(d) for d in shape)


def format_shapes(value: Sequence[Any]) -> str:
    """A shape, or a list of shapes joined by ``;``; any other list as compact JSON."""
    if value and all(isinstance(v, (list, tuple)) for v in value):
        return ";".join(format_shape(v) for v in value)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return format_shape(value)
    return json.dumps(jsonable(value), separators=(",", ":"))


def dumps_csv(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """CSV with a header row: shapes as ``AxBxC`` (``;``-joined), other lists and mappings as
    compact JSON, booleans as ``true``/``false``, None and non-finite floats empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_cell(row.get(c)) for c in columns] for row in rows)
    return buf.getvalue()


class OutputKind(str, Enum):
    STDOUT = "stdout"
    STDERR = "stderr"  # reached through a link such as /dev/stderr
    DEVICE = "device"  # a character device, FIFO or Unix socket, written in place
    FILE = "file"  # a regular file, replaced atomically


@dataclass(frozen=True)
class Output:
    """Where data goes: ``path`` as given (None for stdout), ``target`` the regular file
    replaced (a link's final target; None unless FILE), ``force`` to replace an existing one."""

    kind: OutputKind
    path: Path | None = None
    target: Path | None = None
    force: bool = False

    @property
    def is_stdout(self) -> bool:
        return self.kind is OutputKind.STDOUT

    def __str__(self) -> str:
        return str(self.path) if self.path is not None else self.kind.value


def resolve_output(path: str | Path | None, *, force: bool) -> Output:
    """Decide where data goes and prove it can be written there, before any work: an
    existing file without ``force``, a directory, a block device, or a parent that is missing
    or where no file can be created is a :class:`HookscopeError`."""
    if path is None or str(path) == "-":
        return Output(OutputKind.STDOUT, force=force)
    output = _classify(Path(path), force)
    if output.target is not None:
        _probe(output.target.parent, output)
    return output


def _classify(given: Path, force: bool) -> Output:
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    try:
        st = os.stat(given)
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet: the probe says why
        return Output(OutputKind.FILE, given, target, force)
    except OSError as exc:  # ELOOP, EACCES, ENAMETOOLONG...
        raise _error(given, exc) from None
    for fd, kind in ((1, OutputKind.STDOUT), (2, OutputKind.STDERR)):
        with suppress(OSError):  # that descriptor is closed
            if given.is_symlink() and os.path.samestat(st, os.fstat(fd)):
                return Output(kind, given, force=force)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        return Output(OutputKind.DEVICE, given, force=force)
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "a block device or other special file"
        raise HookscopeError(f"{given} is {what}; give a file name.")
    if not force:
        raise _exists_error(given)
    return Output(OutputKind.FILE, given, target, force)


def _existing(path: Path) -> Path:
    """The nearest of ``path`` and its parents that exists."""
    return next((p for p in (path, *path.parents) if os.path.exists(p)), Path("."))


def _probe(folder: Path, shown: object) -> None:
    """Create and remove a file in ``folder``: as root ``os.access`` always says yes, and a
    read-only file system or ``/proc`` only shows itself on a real attempt."""
    try:
        with tempfile.NamedTemporaryFile(prefix=".hookscope-probe-", dir=folder):
            pass
    except OSError as exc:
        existing = _existing(folder)
        why = (f"{existing} is not a directory" if not existing.is_dir() else
               f"the folder {folder} does not exist; create it first" if existing != folder
               else f"no file can be created in {folder} ({_reason(exc)})")
        raise HookscopeError(f"Cannot write {shown}: {why}.") from None


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _error(shown: object, exc: OSError) -> HookscopeError:
    return HookscopeError(f"Cannot write {shown}: {_reason(exc)}.")


def _exists_error(shown: object) -> HookscopeError:
    return HookscopeError(f"{shown} already exists; pass --force to overwrite it.")


def write(output: Output, text: str) -> None:
    """Write ``text`` to ``output``: streams and devices directly, files atomically (UTF-8).
    Any OS error is a :class:`HookscopeError` naming the path; a file is then left as it was."""
    if output.target is None:
        _send(output, text)
        return
    with atomic_path(output) as tmp, open(tmp, "wb") as fh:
        fh.write(text.encode("utf-8", "surrogateescape"))  # undecodable names round-trip
        fh.flush()
        os.fsync(fh.fileno())  # the rename must not publish a file still in the cache


def emit(text: str, output: Output | str | Path | None, *, force: bool = False) -> None:
    """Send data to ``output`` (resolved now unless it is an :class:`Output`) or stdout."""
    write(output if isinstance(output, Output) else resolve_output(output, force=force), text)


@contextmanager
def atomic_path(path: Output | str | Path | None, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary file that becomes the output on success (renamed over a file, or
    copied to a stream or device); on any exception it is removed, the output untouched.
    Raises as :func:`resolve_output` does, and any OS error as one naming the output."""
    output = path if isinstance(path, Output) else resolve_output(path, force=force)
    tmp = _temp_for(output)
    try:
        yield tmp
        _deliver(output, tmp, force=output.force)
    except OSError as exc:
        raise _error(output, exc) from exc
    finally:
        with suppress(OSError):  # already renamed
            tmp.unlink()


def _temp_for(output: Output) -> Path:
    """A new hidden file beside the target for a file, else in the temp folder."""
    folder = output.target.parent if output.target else Path(tempfile.gettempdir())
    name = output.target.name[:80] if output.target else "hookscope"
    tmp = folder / f".{name}.{secrets.token_hex(6)}.part"
    try:
        tmp.touch(exist_ok=False)  # a new file's usual mode (mkstemp's would be 0600)
    except OSError as exc:
        raise _error(output, exc) from exc
    return tmp


def _deliver(output: Output, tmp: Path, *, force: bool) -> None:
    """Publish a finished temporary file: rename it into place, or send its bytes."""
    if output.target is None:
        _send(output, tmp.read_bytes())
    elif force:
        os.replace(tmp, output.target)
    else:  # a link fails if the name was taken meanwhile: never clobbered, even in a race
        try:
            os.link(tmp, output.target)
        except FileExistsError:
            raise _exists_error(output) from None
        except OSError:  # a file system without hard links: check, then rename
            if os.path.lexists(output.target):
                raise _exists_error(output) from None
            os.replace(tmp, output.target)


def _send(output: Output, data: str | bytes) -> None:
    """Write text or bytes in place: to a stream, device, FIFO or socket."""
    try:
        if output.kind is not OutputKind.DEVICE:
            stream: Any = _data_stream() if output.is_stdout else sys.stderr
            if isinstance(data, bytes):
                stream.flush()  # keep order with text written before
                stream = stream.buffer
            stream.write(data)
            stream.flush()
            return
        raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
        if stat.S_ISSOCK(os.stat(str(output.path)).st_mode):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(str(output.path))
                sock.sendall(raw)
        else:  # a device or FIFO: no O_CREAT or O_TRUNC, so never created or truncated
            with open(os.open(str(output.path), os.O_WRONLY | getattr(os, "O_NOCTTY", 0)), "wb") as fh:
                fh.write(raw)
    except BrokenPipeError:  # the reader left (`| head`): the CLI exits quietly
        raise
    except OSError as exc:
        raise _error(output, exc) from exc


def check_folder(path: str | Path, *, planned: Iterable[Path] = (), force: bool) -> Path:
    """Check before any work that files can be created in ``path`` (or its nearest existing
    parent), and that no planned file is a directory, or exists without ``force``; a
    :class:`HookscopeError` names the file in the way (or the broken link)."""
    folder = Path(path)
    if folder.is_symlink() and not folder.exists():
        raise HookscopeError(f"Cannot write to folder {folder}: it is a broken symbolic link.")
    _probe(_existing(folder), f"to folder {folder}")
    planned = list(planned) if folder.is_dir() else []
    dirs = [p for p in planned if p.is_dir()]
    if dirs:
        raise HookscopeError(f"{dirs[0]} is a directory; move it away or choose another --out.")
    taken = [] if force else [p for p in planned if p.is_file()]  # a link to a device: no force
    if taken:
        more = f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""
        raise HookscopeError(
            f"{taken[0]} already exists{more}; pass --force to overwrite, or choose another --out.")
    return folder


class Staging:
    """A folder of files staged under hidden temporary names, moved into place together on
    a clean exit (the new ones removed if one fails); any exception deletes every temporary
    file, then each folder created, if empty. Writes may run in two threads (:meth:`submit`)."""

    def __init__(self, folder: str | Path, *, force: bool = False) -> None:
        self.folder, self.force = Path(folder), force
        self._staged: list[tuple[Path, Output]] = []
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hookscope-write")
        self._futures: deque[Future[None]] = deque()
        self._created: list[Path] = []

    @contextmanager
    def file(self, path: str | Path) -> Iterator[Path]:
        """A new temporary file that the commit moves to ``path``; OS errors as one line."""
        output = _classify(Path(path), force=True)  # the commit checks for existing files
        self._staged.append((_temp_for(output), output))
        try:
            yield self._staged[-1][0]
        except OSError as exc:
            raise _error(output, exc) from exc

    def save_png(self, image: Any, path: str | Path) -> None:
        """Stage a PNG from a PIL image or a (3, H, W) float tensor in [0, 1]."""
        from PIL import Image

        with self.file(path) as tmp:
            if isinstance(image, Image.Image):
                image.save(tmp, format="PNG", compress_level=3)
            else:
                from torchvision.utils import save_image

                save_image(image, tmp, format="png")

    def save_npy(self, array: Any, path: str | Path) -> None:
        """Stage a float32 ``.npy`` file."""
        import numpy as np

        with self.file(path) as tmp, open(tmp, "wb") as fh:
            np.save(fh, np.asarray(array, dtype=np.float32), allow_pickle=False)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run a write in a worker; at most 8 in flight, so memory stays bounded."""
        if len(self._futures) >= 8:
            self._futures.popleft().result()
        self._futures.append(self._pool.submit(fn, *args, **kwargs))

    def wait(self) -> None:
        """Wait for every write; re-raise the first failure."""
        while self._futures:
            self._futures.popleft().result()

    def _commit(self) -> None:
        self.wait()
        placed: list[Path] = []
        try:
            for tmp, out in self._staged:
                new = out.target is not None and not os.path.lexists(out.target)
                try:
                    _deliver(out, tmp, force=self.force)
                except OSError as exc:
                    raise _error(out, exc) from exc
                if new and out.target is not None:
                    placed.append(out.target)
        except BaseException:
            for p in placed:  # all or nothing, as far as new files go
                with suppress(OSError):
                    p.unlink()
            raise

    def __enter__(self) -> Staging:
        parents = (self.folder, *self.folder.parents)
        self._created = list(takewhile(lambda p: not p.is_dir(), parents))  # innermost first
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._remove_created()
            raise HookscopeError(f"Cannot create folder {self.folder}: {_reason(exc)}.") from None
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        try:
            if exc_type is None:
                self._commit()
                self._created = []  # kept
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)  # then nothing writes
            for tmp, _out in self._staged:  # those renamed are gone already
                with suppress(OSError):
                    tmp.unlink()
            self._remove_created()

    def _remove_created(self) -> None:
        """Remove the folders this staging created, innermost first, while empty."""
        for p in self._created:
            try:
                p.rmdir()
            except OSError:  # not empty (or gone): its parents are not empty either
                return

