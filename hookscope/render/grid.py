"""Feature-grid outputs: PNG files (atomic), TensorBoard images and histograms, a summary table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType

from hookscope.errors import HookscopeError
from hookscope.render.output import atomic_path, format_shape
from hookscope.render.tables import data_table, header

if TYPE_CHECKING:
    from hookscope.features import FeatureGrid

TENSORBOARD_HINT = "pip install hookscope[tensorboard]"


def save_png(image: Any, path: Path, *, force: bool = False) -> Path:
    """Write a (3, H, W) float image in [0, 1] as a PNG, atomically."""
    from torchvision.utils import save_image

    with atomic_path(path, force=force) as tmp:
        save_image(image, tmp, format="png")
    return path


def check_outputs(out_dir: Path, names: Sequence[str], *, force: bool) -> None:
    """Fail before any work when ``out_dir`` is not a directory or a file already exists."""
    if out_dir.exists() and not out_dir.is_dir():
        raise HookscopeError(f"--out {out_dir} is a file; give a directory.")
    if force or not out_dir.exists():
        return
    for name in names:
        if (out_dir / name).exists():
            raise HookscopeError(
                f"{out_dir / name} already exists; pass --force to overwrite, or choose "
                "another --out directory."
            )


def require_tensorboard() -> None:
    """Raise a one-line install hint unless TensorBoard logging is available."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise HookscopeError(
            f"--tensorboard needs the tensorboard package: {TENSORBOARD_HINT}"
        ) from None


class Board:
    """TensorBoard output: one image per layer call and input, an activation histogram, and
    the number of non-finite activations (removed from the histogram, which rejects them)."""

    def __init__(self, logdir: Path) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        if logdir.exists() and not logdir.is_dir():
            raise HookscopeError(f"--tensorboard {logdir} is a file; give a directory.")
        self.logdir = logdir
        self.writer = SummaryWriter(log_dir=str(logdir))

    def add(self, grid: FeatureGrid) -> None:
        import torch

        self.writer.add_image(grid.tag, grid.image, global_step=grid.index, dataformats="CHW")
        values = grid.values.reshape(-1)
        finite = values[torch.isfinite(values)]
        if finite.numel():
            self.writer.add_histogram(f"{grid.tag}/activations", finite.double(),
                                      global_step=grid.index)
        self.writer.add_scalar(f"{grid.tag}/nonfinite", grid.nonfinite, global_step=grid.index)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()

    def __enter__(self) -> Board:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def features_view(doc: Mapping[str, Any]) -> RenderableType:
    """The ``features`` summary: one row per grid written."""
    table = data_table()
    table.add_column("input", overflow="fold")
    table.add_column("layer", overflow="fold")
    table.add_column("call", justify="right")
    table.add_column("shape")
    table.add_column("shown", justify="right")
    table.add_column("non-finite", justify="right")
    table.add_column("file", overflow="fold")
    for row in doc["grids"]:
        table.add_row(
            row["input"], row["layer"], str(row["call"]), format_shape(row["shape"]),
            f"{len(row['channels'])}/{row['shape'][0]}",
            str(row["nonfinite"]), row.get("path") or "-",
            style="red" if row["nonfinite"] else None,
        )
    extra = f"grids: {len(doc['grids'])}"
    if doc.get("tensorboard"):
        extra += f"  tensorboard: {doc['tensorboard']}"
    return Group(header(doc, extra), table)
