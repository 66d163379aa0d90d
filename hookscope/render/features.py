"""Feature-grid outputs: PNG files (atomic), TensorBoard images and histograms, a summary table."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType

from hookscope.core.errors import HookscopeError
from hookscope.core.output import Staging, format_shape
from hookscope.render.tables import DataTable, header, num

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from hookscope.probes.features import FeatureGrid


def require_tensorboard() -> None:
    """Raise a one-line install hint unless TensorBoard logging is available."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise HookscopeError(
            "--tensorboard needs the tensorboard package: pip install hookscope[tensorboard]"
        ) from None


class GridWriter:
    """Sink for :class:`hookscope.probes.features.FeaturesProbe`: each grid into a staged PNG in
    ``out_dir`` and, optionally, the ``tensorboard`` log directory: one image per layer call
    and input, an activation histogram, and the number of non-finite activations (removed
    from the histogram, which rejects them).

    TensorBoard events are logged into a hidden folder beside ``tensorboard`` and moved into
    it only when the run completes, so a failed run leaves no event file either.
    """

    def __init__(self, staging: Staging, out_dir: Path, tensorboard: Path | None = None) -> None:
        self.staging, self.out_dir, self.tensorboard = staging, out_dir, tensorboard
        self.board: SummaryWriter | None = None
        self._scratch: Path | None = None

    def __enter__(self) -> GridWriter:
        if self.tensorboard is not None:
            if self.tensorboard.exists() and not self.tensorboard.is_dir():
                raise HookscopeError(f"--tensorboard {self.tensorboard} is a file; give a "
                                     "directory.")
            parent = self.tensorboard.parent
            try:
                parent.mkdir(parents=True, exist_ok=True)
                self._scratch = Path(tempfile.mkdtemp(prefix=".hookscope-tb-", dir=parent))
            except OSError as exc:
                raise HookscopeError(f"Cannot write {self.tensorboard}: "
                                     f"{exc.strerror or exc}.") from exc
            require_tensorboard()
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(log_dir=str(self._scratch))
        return self

    def add(self, grid: FeatureGrid) -> dict[str, Any]:
        """Stage one grid; its row gets the file's ``path``."""
        path = self.out_dir / grid.filename
        self.staging.save_png(grid.image, path)
        if self.board is not None:
            import torch

            self.board.add_image(grid.tag, grid.image, global_step=grid.index, dataformats="CHW")
            values = grid.values.reshape(-1)
            finite = values[torch.isfinite(values)]
            if finite.numel():
                self.board.add_histogram(f"{grid.tag}/activations", finite.double(),
                                         global_step=grid.index)
            self.board.add_scalar(f"{grid.tag}/nonfinite", grid.nonfinite, global_step=grid.index)
        return {"path": str(path)}

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if self.board is not None:
            self.board.close()  # flushes first
        if self._scratch is None or self.tensorboard is None:
            return
        try:
            if exc_type is None:
                self.tensorboard.mkdir(parents=True, exist_ok=True)
                for event in self._scratch.iterdir():
                    os.replace(event, self.tensorboard / event.name)
        except OSError as exc:
            raise HookscopeError(f"Cannot write {self.tensorboard}: {exc.strerror or exc}.") \
                from exc
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)


def features_view(doc: Mapping[str, Any]) -> RenderableType:
    """The ``features`` summary: one row per grid written."""
    grids = doc["grids"]
    table = DataTable(["input", "layer", num("call"), "shape", num("shown"), num("non-finite"),
                       "file"])
    for row in grids:
        table.add_row(row["input"], row["layer"], str(row["call"]), format_shape(row["shape"]),
                      f"{len(row['channels'])}/{row['shape'][0]}", str(row["nonfinite"]),
                      row.get("path") or "-", style="red" if row["nonfinite"] else None)
    extra = f"grids: {len(grids)}"
    if doc.get("tensorboard"):
        extra += f"  tensorboard: {doc['tensorboard']}"
    return Group(header(doc, extra), table)
