"""Serialisation and all-or-nothing output: one file, a stream or device, or a staged folder.

Where data goes is decided once, before any model loads (:func:`resolve_output`,
:func:`check_folder`), and every write follows the same rules:

- ``None`` or ``"-"`` is stdout. A symlink to this process's own stdout or stderr
  (``/dev/stdout``, ``/dev/fd/2``) is that stream, whatever it is connected to.
- A character device, FIFO or socket, or a symlink to one (``/dev/null``, a ``mkfifo``), is
  written in place: never replaced, never renamed over, no ``force`` needed.
- A regular file is written to a hidden temporary file beside it and renamed into place
  only when complete. Through a symlink (dangling or not) the temporary file sits beside the
  link's final target and the target is replaced, so the link stays a link. An existing
  file needs ``force``; a directory is never replaced.
- Every ``OSError`` becomes one :class:`HookscopeError` line naming the path, and no
  temporary file survives a failure, Ctrl-C included.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Any

from hookscope.core.errors import HookscopeError
from hookscope.render.streams import data as _data_stream

# ----------------------------------------------------------------- serialisation


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


def _scalar(value: Any) -> Any:
    """numpy and 0-d torch scalars as Python numbers; anything else unchanged."""
    if callable(getattr(value, "item", None)) and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def _cell(value: Any) -> Any:
    value = _scalar(value)
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
    """CSV with a header row, one line per row.

    Cells: shapes as ``AxBxC`` (several joined by ``;``), other lists and mappings as
    compact JSON, booleans as ``true``/``false`` (the JSON spelling, so a column reads the
    same in both formats), and None and non-finite floats as empty cells.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()


# ----------------------------------------------------------------- where output goes


class OutputKind(str, Enum):
    """How an :class:`Output` is written."""

    STDOUT = "stdout"  # sys.stdout
    STDERR = "stderr"  # sys.stderr, reached through a link such as /dev/stderr
    DEVICE = "device"  # a character device or FIFO: opened and written in place
    SOCKET = "socket"  # a Unix socket: connected to and written
    FILE = "file"  # a regular file, new or existing: replaced atomically


@dataclass(frozen=True)
class Output:
    """Where one command's data goes, decided before the model runs.

    Attributes:
        kind: how it is written.
        path: the path as given; None for stdout.
        target: the regular file that is replaced (a symlink's final target); None unless
            ``kind`` is FILE.
        force: whether an existing regular file may be replaced.
    """

    kind: OutputKind
    path: Path | None = None
    target: Path | None = None
    force: bool = False

    @property
    def is_stdout(self) -> bool:
        """Data goes to ``sys.stdout`` (where a table may be drawn directly)."""
        return self.kind is OutputKind.STDOUT

    def write(self, text: str) -> None:
        """Write ``text``; see :func:`write`."""
        write(self, text)

    def __str__(self) -> str:
        return str(self.path) if self.path is not None else self.kind.value


def resolve_output(path: str | Path | None, *, force: bool) -> Output:
    """Decide where data goes and prove it can be written there, before any work.

    Args:
        path: a file, a device, FIFO or socket, or None / ``"-"`` for stdout.
        force: allow replacing an existing regular file.

    Raises:
        HookscopeError: an existing file without ``force``, a directory, a block device, a
            missing or non-directory parent, or a parent where no file can be created.
    """
    if path is None or str(path) == "-":
        return Output(OutputKind.STDOUT, force=force)
    output = _classify(Path(path), force=force)
    if output.target is not None:
        _probe_dir(output.target.parent, output)
    return output


def _classify(given: Path, *, force: bool) -> Output:
    """The :class:`Output` for a path; checks the parent but creates nothing."""
    st = _stat(given)
    link = given.is_symlink()
    if st is not None and link:
        stream = _own_stream(st)
        if stream is not None:
            return Output(stream, given, force=force)
    if st is not None and not stat.S_ISREG(st.st_mode):
        return Output(_special_kind(given, st.st_mode), given, force=force)
    target = Path(os.path.realpath(given)) if link else given
    if st is not None and not force:
        raise _exists_error(given)
    blocker = _blocking_file(target.parent)
    if blocker is not None:
        raise HookscopeError(f"Cannot write {given}: {blocker} is not a directory.")
    if not target.parent.is_dir():
        raise HookscopeError(
            f"Cannot write {given}: the folder {target.parent} does not exist; create it first."
        )
    return Output(OutputKind.FILE, given, target, force)


def _stat(given: Path) -> os.stat_result | None:
    """``os.stat`` (following links); None when nothing is there yet (or a link dangles)."""
    try:
        return os.stat(given)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        blocker = _blocking_file(given.parent) or given.parent
        raise HookscopeError(f"Cannot write {given}: {blocker} is not a directory.") from None
    except OSError as exc:  # ELOOP, EACCES, ENAMETOOLONG...
        raise HookscopeError(f"Cannot write {given}: {_reason(exc)}.") from None


def _own_stream(st: os.stat_result) -> OutputKind | None:
    """STDOUT or STDERR when ``st`` is that stream's file (``/dev/stdout`` and the like).

    Writing to the stream itself keeps a shell's ``>`` or ``>>`` redirection intact, where
    reopening or renaming over the file would truncate or detach it.
    """
    for fd, kind in ((1, OutputKind.STDOUT), (2, OutputKind.STDERR)):
        try:
            if os.path.samestat(st, os.fstat(fd)):
                return kind
        except OSError:  # that descriptor is closed
            continue
    return None


def _special_kind(given: Path, mode: int) -> OutputKind:
    if stat.S_ISDIR(mode):
        raise HookscopeError(f"{given} is a directory; give a file name.")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return OutputKind.DEVICE
    if stat.S_ISSOCK(mode):
        return OutputKind.SOCKET
    raise HookscopeError(f"{given} is a block device or other special file; give a file name.")


def _blocking_file(path: Path) -> Path | None:
    """The nearest existing one of ``path`` and its parents, when it is not a directory."""
    for candidate in (path, *path.parents):
        try:
            st = os.stat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise HookscopeError(f"Cannot use {candidate}: {_reason(exc)}.") from None
        return None if stat.S_ISDIR(st.st_mode) else candidate
    return None


def _probe_dir(folder: Path, shown: object) -> None:
    """Create and remove a hidden file in ``folder``: as root ``os.access`` always says
    yes, and a read-only file system or ``/proc`` only shows itself on a real attempt."""
    try:
        fd, name = tempfile.mkstemp(prefix=".hookscope-probe-", dir=folder)
    except OSError as exc:
        raise HookscopeError(
            f"Cannot write {shown}: no file can be created in {folder} ({_reason(exc)})."
        ) from None
    try:
        os.close(fd)
    finally:
        with suppress(OSError):
            os.unlink(name)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _exists_error(shown: object) -> HookscopeError:
    return HookscopeError(f"{shown} already exists; pass --force to overwrite it.")


def _write_error(output: Output, exc: OSError) -> HookscopeError:
    return HookscopeError(f"Cannot write {output}: {_reason(exc)}.")


# ----------------------------------------------------------------- writing one output


def write(output: Output, text: str) -> None:
    """Write ``text`` (UTF-8) to ``output``: stdout and devices directly, files atomically.

    Raises:
        HookscopeError: any OS error (a full disk, a read-only file system...), naming the
            path; a regular file is then left as it was and no temporary file remains.
    """
    if output.kind in (OutputKind.STDOUT, OutputKind.STDERR):
        stream = _data_stream() if output.kind is OutputKind.STDOUT else sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:  # the reader left (`| head`): the CLI exits quietly
            raise
        except OSError as exc:
            raise _write_error(output, exc) from exc
        return
    data = text.encode("utf-8", "surrogateescape")  # undecodable file names round-trip
    if output.kind is OutputKind.FILE:
        with atomic_path(output) as tmp, open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # the rename must not publish a file still in the cache
        return
    try:
        _send(output, data)
    except OSError as exc:
        raise _write_error(output, exc) from exc


def emit(text: str, output: Output | str | Path | None, *, force: bool = False) -> None:
    """Send data to ``output`` (resolved now unless it is an :class:`Output`) or stdout."""
    where = output if isinstance(output, Output) else resolve_output(output, force=force)
    write(where, text)


@contextmanager
def atomic_path(path: Output | str | Path | None, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary file to write; on success it becomes the output.

    For a regular file the temporary file lies beside the (link's) target and is renamed
    into place; for stdout, a device or FIFO its bytes are copied there. On any exception,
    KeyboardInterrupt included, it is removed and the output is left untouched.

    Raises:
        HookscopeError: see :func:`resolve_output`; any OS error while writing, naming
            the output.
    """
    output = path if isinstance(path, Output) else resolve_output(path, force=force)
    tmp = _make_temp(output)
    try:
        yield tmp
        _deliver(output, tmp)
    except OSError as exc:
        raise _write_error(output, exc) from exc
    finally:
        _discard(tmp)


@lru_cache(maxsize=1)
def _umask() -> int:
    # Read once: os.umask can only be read by setting it, which races with other threads.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _make_temp(output: Output) -> Path:
    """A new hidden ``.part`` file: beside the target for a file, else in the temp folder."""
    folder = output.target.parent if output.target is not None else None
    name = output.target.name[:80] if output.target is not None else "hookscope"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
    except OSError as exc:
        raise _write_error(output, exc) from exc
    os.close(fd)
    return Path(tmp)


def _discard(tmp: Path) -> None:
    with suppress(OSError):  # already renamed, or the folder is gone: nothing to clean
        os.unlink(tmp)


def _deliver(output: Output, tmp: Path) -> None:
    """Publish a finished temporary file: rename it into place, or send its bytes."""
    if output.target is None:
        _send(output, tmp.read_bytes())
        return
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual mode
    if output.force:
        os.replace(tmp, output.target)
        return
    try:
        os.link(tmp, output.target)  # fails if the name was taken meanwhile: no clobbering
    except FileExistsError:
        raise _exists_error(output) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        if os.path.lexists(output.target):  # no hard links here: check, then rename
            raise _exists_error(output) from None
        os.replace(tmp, output.target)


def _send(output: Output, data: bytes) -> None:
    """Write bytes to a stream, device, FIFO or socket, in place."""
    if output.kind in (OutputKind.STDOUT, OutputKind.STDERR):
        stream = _data_stream() if output.kind is OutputKind.STDOUT else sys.stderr
        stream.flush()  # keep order with text written before
        binary = getattr(stream, "buffer", None)
        if binary is None:
            raise HookscopeError(f"{output} takes text only; give a file name for binary data.")
        binary.write(data)
        binary.flush()
        return
    if output.kind is OutputKind.SOCKET:
        import socket

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(output.path))
            sock.sendall(data)
        return
    # No O_CREAT or O_TRUNC: a device or FIFO is never created, replaced or truncated.
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(str(output.path), flags)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise HookscopeError(f"{output} was replaced by a regular file while we worked.")
        view = memoryview(data)
        while view:  # a FIFO or device may take fewer bytes than offered
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


# ----------------------------------------------------------------- folders


def check_folder(path: str | Path, *, planned: Iterable[Path] = (), force: bool) -> Path:
    """Check an output folder before any work: it (or, while it does not exist, its nearest
    existing parent) is a directory where files can be created, and no planned file exists
    unless ``force``.

    Raises:
        HookscopeError: a file in the way (``cat.jpg is not a directory``), a broken link,
            a folder where nothing can be created, a planned file that is a directory, or
            one that exists without ``force``.
    """
    folder = Path(path)
    blocker = _blocking_file(folder)
    if blocker is not None:
        raise HookscopeError(f"Cannot write to folder {folder}: {blocker} is not a directory.")
    if folder.is_symlink() and not folder.exists():
        raise HookscopeError(f"Cannot write to folder {folder}: it is a broken symbolic link.")
    existing = next(p for p in (folder, *folder.parents, Path(".")) if p.is_dir())
    _probe_dir(existing, folder)
    if existing == folder:
        _check_planned(list(planned), force=force)
    return folder


def _check_planned(planned: list[Path], *, force: bool) -> None:
    dirs = [p for p in planned if p.is_dir()]
    if dirs:
        raise HookscopeError(f"{dirs[0]} is a directory; move it away or choose another --out.")
    if force:
        return
    taken = [p for p in planned if p.is_file()]  # a dangling link or a device needs no force
    if taken:
        more = f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""
        raise HookscopeError(
            f"{taken[0]} already exists{more}; pass --force to overwrite, or choose another --out."
        )


def _make_folder(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those created, outermost first."""
    missing: list[Path] = []
    for p in (folder, *folder.parents):
        if p.is_dir():
            break
        missing.append(p)
    created: list[Path] = []
    for p in reversed(missing):
        try:
            os.mkdir(p)
        except FileExistsError:
            if p.is_dir():  # made by someone else meanwhile: theirs, not ours to remove
                continue
            _remove_empty(created)
            raise HookscopeError(f"Cannot create folder {p}: a file is in the way.") from None
        except OSError as exc:
            _remove_empty(created)
            raise HookscopeError(f"Cannot create folder {p}: {_reason(exc)}.") from exc
        created.append(p)
    return created


def _remove_empty(created: list[Path]) -> None:
    """Remove folders this run created, innermost first, while they are empty."""
    for p in reversed(created):
        try:
            os.rmdir(p)
        except OSError:  # not empty (or gone): its parents are not empty either
            return


def encode_png(image: Any, path: Path) -> None:
    """Save a PIL image, or a (3, H, W) float tensor in [0, 1], as a PNG at ``path`` as is
    (no temporary file: callers pass one from :func:`atomic_path` or :class:`Staging`)."""
    from PIL import Image

    if isinstance(image, Image.Image):
        image.save(path, format="PNG", compress_level=3)
    else:
        from torchvision.utils import save_image

        save_image(image, path, format="png")


class Staging:
    """Files staged under hidden temporary names, moved into place together on commit.

    As a context manager: a clean exit commits; an exception, KeyboardInterrupt or
    SystemExit aborts, deleting every temporary file and then any folder the staging
    created, if empty. Writes may run in worker threads (:meth:`submit`). Each file follows
    the rules of :func:`resolve_output` (links written through, devices in place).

    Args:
        folder: created with its parents on entering; None when the folders exist.
        force: allow replacing existing regular files.
        workers: threads for :meth:`submit`.
    """

    def __init__(self, folder: str | Path | None = None, *, force: bool = False,
                 workers: int = 2) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.force = force
        self._staged: list[tuple[Path, Output]] = []
        self._created: list[Path] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers),
                                        thread_name_prefix="hookscope-write")
        self._futures: list[Future[None]] = []

    def temp_for(self, path: str | Path) -> Path:
        """A new temporary file that :meth:`commit` moves to ``path``."""
        output = replace(_classify(Path(path), force=True), force=self.force)  # commit checks
        tmp = _make_temp(output)
        with self._lock:
            self._staged.append((tmp, output))
        return tmp

    def save_png(self, image: Any, path: str | Path) -> None:
        """Stage a PNG from a PIL image or a (3, H, W) float tensor in [0, 1]."""
        encode_png(image, self.temp_for(path))

    def save_npy(self, array: Any, path: str | Path) -> None:
        """Stage a float32 ``.npy`` file."""
        import numpy as np

        with open(self.temp_for(path), "wb") as fh:
            np.save(fh, np.asarray(array, dtype=np.float32), allow_pickle=False)

    def save_text(self, text: str, path: str | Path) -> None:
        """Stage a UTF-8 text file."""
        self.temp_for(path).write_bytes(text.encode("utf-8", "surrogateescape"))

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Run a write in a worker; at most 8 in flight, so memory stays bounded."""
        while len(self._futures) >= 8:
            if self._futures[0].exception() is not None:  # waits for it
                self.wait()  # re-raises the failure
            self._futures.pop(0)
        self._futures.append(self._pool.submit(fn, *args, **kwargs))

    def wait(self) -> None:
        """Wait for every write; re-raise the first failure (an OS error as one line)."""
        futures, self._futures = self._futures, []
        for f in futures:
            try:
                f.result()
            except OSError as exc:
                where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
                raise HookscopeError(f"Could not write{where}: {_reason(exc)}.") from exc

    def commit(self) -> None:
        """Move every staged file into place; if one fails, remove the new files placed.

        Raises:
            HookscopeError: a planned file appeared meanwhile (without ``force``), or an OS
                error, naming the file.
        """
        self.wait()
        if not self.force:
            taken = [out for _, out in self._staged if out.target is not None
                     and os.path.lexists(out.target)]
            if taken:
                raise _exists_error(taken[0])
        placed: list[Path] = []
        try:
            for tmp, out in self._staged:
                new = out.target is not None and not os.path.lexists(out.target)
                try:
                    _deliver(out, tmp)
                except OSError as exc:
                    raise _write_error(out, exc) from exc
                if new and out.target is not None:
                    placed.append(out.target)
        except BaseException:
            for p in placed:  # all or nothing, as far as files that were new go
                with suppress(OSError):
                    os.unlink(p)
            raise
        staged, self._staged = self._staged, []
        for tmp, _ in staged:
            _discard(tmp)  # those copied to a device or stream

    def abort(self) -> None:
        """Delete every temporary file (after running writes finish), then any folder this
        staging created that is empty again."""
        for f in self._futures:
            f.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            staged, self._staged = self._staged, []
        for tmp, _ in staged:
            _discard(tmp)
        self._futures.clear()
        _remove_empty(self._created)
        self._created = []

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> Staging:
        if self.folder is not None:
            self._created = _make_folder(self.folder)
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        try:
            if exc_type is None:
                try:
                    self.commit()
                except BaseException:
                    self.abort()
                    raise
            else:
                self.abort()
        finally:
            self.close()
