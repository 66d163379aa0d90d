"""A watch's log directory: ``watch.jsonl``, ``nonfinite.json`` and TensorBoard events.

Each line of ``watch.jsonl`` is flushed as its step ends, so a crash loses at most the step
in progress; ``nonfinite.json`` is written whole, atomically. The format (docs/watch.md) is
a contract.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hookscope.core.errors import HookscopeError, param
from hookscope.core.files import Staging, dumps_json, dumps_ndjson, emit
from hookscope.training.log_reader import EVENT_FILE, LOG_FILE

__all__ = ["WatchLog", "check_log_dir", "publish"]


def check_log_dir(log_dir: Path, *, force: bool = False) -> None:
    """Refuse, before any work, a ``log_dir`` that is a file, or holds a watch log (without
    ``force``) or a directory in its place."""
    path = log_dir / LOG_FILE
    shown = f"{param('log_dir')} {str(log_dir)!r}"
    try:
        if log_dir.exists() and not log_dir.is_dir():
            raise HookscopeError(f"{shown} is a file, not a directory.")
        if path.is_dir():
            raise HookscopeError(f"{shown} holds a directory named {LOG_FILE}; move it away, or "
                                 "choose another directory.")
        if os.path.lexists(path) and not force:
            raise HookscopeError(f"{shown} already holds a watch log ({LOG_FILE}); choose another "
                                 f"directory, or pass {param('force')} to replace it.")
    except OSError as exc:
        raise _unwritable(log_dir, exc) from None


def _unwritable(log_dir: Path, exc: OSError) -> HookscopeError:
    return HookscopeError(f"{param('log_dir')} {str(log_dir)!r} cannot be written: "
                          f"{exc.strerror or exc}.")


class WatchLog:
    """Appends a watch's lines to ``log_dir/watch.jsonl`` and, with ``tensorboard``, writes
    TensorBoard scalars (per layer and parameter) and parameter histograms."""

    def __init__(self, log_dir: str | Path, *, force: bool = False,
                 tensorboard: bool = False) -> None:
        self.dir = Path(log_dir)
        self.path = self.dir / LOG_FILE
        try:
            check_log_dir(self.dir, force=force)
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / EVENT_FILE).unlink(missing_ok=True)  # the previous run's event
            self._file: IO[str] = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise _unwritable(self.dir, exc) from None
        self.board: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self._file.close()
                raise HookscopeError(f"{param('tensorboard')} needs the tensorboard package: "
                                     "pip install 'hookscope[tensorboard]'.") from None
            self.board = SummaryWriter(log_dir=os.fspath(log_dir))

    def write(self, line: Mapping[str, Any], weights: Sequence[tuple[str, Any]] = ()) -> None:
        """Append one line (non-finite numbers as ``null``) and flush it to the disk; a
        logging step's line also goes to TensorBoard, with histograms of ``weights``."""
        try:
            self._file.write(dumps_ndjson(line))
            self._file.flush()
        except OSError as exc:
            raise HookscopeError(f"{str(self.path)!r} cannot be written: "
                                 f"{exc.strerror or exc}.") from None
        if self.board is not None and "step" in line:
            self._board(line, weights)

    def _board(self, line: Mapping[str, Any], weights: Sequence[tuple[str, Any]]) -> None:
        step = int(line["step"])
        scalars = {"loss": line.get("loss")}
        for row in line["layers"]:
            name = row["name"] + (f"#{row['call']}" if row["call"] else "")
            scalars |= {f"layers/{name}/{key}": row.get(key)
                        for key in ("mean", "std", "zero_fraction", "grad_norm", "drift")}
        for row in line["params"]:
            scalars |= {f"params/{row['name']}/{key}": row.get(key)
                        for key in ("norm", "grad_norm", "update_ratio")}
        for tag, value in scalars.items():
            if isinstance(value, (int, float)):
                self.board.add_scalar(tag, value, step)
        for name, weight in weights:
            self.board.add_histogram(f"params/{name}", weight.detach().float().cpu(), step)
        self.board.flush()

    def nonfinite(self, doc: Mapping[str, Any]) -> Path:
        """Write the flight recorder, ``nonfinite.json`` (all or nothing)."""
        path = self.dir / EVENT_FILE
        emit(dumps_json(doc), path, force=True)
        return path

    def close(self) -> None:
        self._file.close()
        if self.board is not None:
            self.board.close()


def publish(staged: Path, log_dir: Path, *, force: bool = False) -> None:
    """Move ``hookscope watch``'s finished log from ``staged`` into ``log_dir`` as one
    :class:`Staging` (an interruption leaves ``log_dir`` as it was). A training script's
    ``hookscope.watch`` writes in place instead, so a crash keeps the steps it logged."""
    files = [name for name in (LOG_FILE, EVENT_FILE) if (staged / name).is_file()]
    with Staging(log_dir, force=force) as folder:
        for name in files:
            with folder.file(log_dir / name) as tmp:
                shutil.copyfile(staged / name, tmp)
    if EVENT_FILE not in files:  # an earlier run's event is not this log's
        (log_dir / EVENT_FILE).unlink(missing_ok=True)
