"""The ``hookscope`` command line: parse options, call the library, hand results to rendering.

Start-up stays fast: torch, torchvision and Rich are imported inside the commands, never at
module level, so ``hookscope --help`` does not load them.
"""

from __future__ import annotations

import sys
import traceback as tb
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from hookscope import __version__
from hookscope.errors import HookscopeError

if TYPE_CHECKING:
    from hookscope.inputs import InputSet
    from hookscope.models import LoadedModel

app = typer.Typer(
    name="hookscope",
    help="Inspect PyTorch vision models through hooks that are always removed.\n\n"
    "Data goes to stdout, progress and notes to stderr; exit codes: 0 ok, 1 a requested "
    "check failed, 2 bad input.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Format(str, Enum):
    """Output formats of the tabular commands."""

    table = "table"
    json = "json"
    csv = "csv"


# ----------------------------------------------------------------- shared options

ModelArg = Annotated[
    str, typer.Argument(help="A torchvision model name, e.g. resnet18 (see `hookscope models`).",
                        metavar="MODEL", show_default=False)
]
InputsArg = Annotated[
    list[str],
    typer.Argument(help="Image files, directories of images, '-' for stdin, or .pt/.npy tensors "
                   "of shape (C,H,W) or (N,C,H,W).", metavar="INPUT...", show_default=False),
]
WeightsOpt = Annotated[
    str,
    typer.Option("--weights", "-w", help="auto (pretrained when cached or downloadable, else "
                 "random with a warning), DEFAULT, an enum name such as IMAGENET1K_V1, none "
                 "(random, --seed), or a checkpoint path (.pt/.pth/.safetensors)."),
]
SeedOpt = Annotated[int, typer.Option(help="Seed for random initialisation (and noise).")]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")]
SizeOpt = Annotated[
    Optional[int],  # noqa: UP007 - Typer needs Optional on Python 3.10 here
    typer.Option(help="Resize/crop inputs to this size instead of the weights' default.",
                 min=8, show_default=False),
]
BatchOpt = Annotated[int, typer.Option("--batch-size", "-b", help="Inputs per forward pass.",
                                       min=1)]
TrustOpt = Annotated[
    bool, typer.Option("--trust-checkpoint", help="Allow checkpoints that need arbitrary "
                       "unpickling (only for files you trust).")
]
LayersOpt = Annotated[
    Optional[list[str]],  # noqa: UP007
    typer.Option("--layers", "-l", help="fnmatch pattern on dotted module names (repeatable), "
                 "e.g. 'layer4.*'.", show_default=False),
]
TypeOpt = Annotated[
    Optional[list[str]],  # noqa: UP007
    typer.Option("--type", "-t", help="Module class name, e.g. Conv2d (repeatable).",
                 show_default=False),
]
AllModulesOpt = Annotated[
    bool, typer.Option("--all-modules", help="Hook containers too, not only leaf modules.")
]
MaxDepthOpt = Annotated[
    Optional[int],  # noqa: UP007
    typer.Option("--max-depth", help="Cut the module tree at this depth (1 = top-level children).",
                 min=1, show_default=False),
]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format.")]
OutputOpt = Annotated[
    Optional[Path],  # noqa: UP007
    typer.Option("--output", "-o", help="Write the output to this file (atomically) instead of "
                 "stdout.", show_default=False, dir_okay=False),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite existing output files.")]
TracebackOpt = Annotated[
    bool, typer.Option("--traceback", help="Show the Python traceback for errors.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors on stderr.")]


# ----------------------------------------------------------------- plumbing


@contextmanager
def failures(show_traceback: bool) -> Iterator[None]:
    """Turn a HookscopeError into one stderr line and its exit code; Ctrl-C into 130."""
    from hookscope.render import console

    try:
        yield
    except HookscopeError as exc:
        if show_traceback:
            tb.print_exc()
        console.error(str(exc))
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        console.error("interrupted")
        raise typer.Exit(130) from None
    except BrokenPipeError:  # `hookscope ... | head`: the reader left; not an error
        sys.stderr.close()
        raise typer.Exit(0) from None


def _load(model: str, weights: str, seed: int, device: str, size: int | None,
          trust: bool) -> LoadedModel:
    from hookscope.models import load_model

    return load_model(model, weights=weights, seed=seed, device=device, size=size,
                      trust_checkpoint=trust)


def _inputs(specs: list[str], model: str) -> InputSet:
    """Resolve inputs before the model loads, so a bad path fails fast."""
    from hookscope.inputs import resolve_inputs
    from hookscope.models import check_model_name, input_ndim

    return resolve_inputs(specs, ndim=input_ndim(check_model_name(model)))


def _show_progress(fmt: Format | str, output: Path | None) -> bool:
    return getattr(fmt, "value", fmt) == "table" or output is not None


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"hookscope {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        Optional[bool],  # noqa: UP007
        typer.Option("--version", callback=version_callback, is_eager=True,
                     help="Print the version and exit."),
    ] = None,
) -> None:
    """Inspect PyTorch vision models through hooks that are always removed."""


# ----------------------------------------------------------------- stats


@app.command()
def stats(
    model: ModelArg,
    inputs: InputsArg,
    weights: WeightsOpt = "auto",
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    size: SizeOpt = None,
    batch_size: BatchOpt = 8,
    trust_checkpoint: TrustOpt = False,
    layers: LayersOpt = None,
    type_: TypeOpt = None,
    all_modules: AllModulesOpt = False,
    max_depth: MaxDepthOpt = None,
    input_stats: Annotated[
        bool, typer.Option("--input-stats", help="Also summarise each module's first input.")
    ] = False,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = None,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Per-layer output statistics: shapes, mean, std, min, max, zeros, non-finite values.

    Example: hookscope stats resnet18 cat.jpg --format json | jq '.layers[] | select(.nonfinite > 0)'
    """
    from hookscope.render import console

    console.setup_logging(quiet=quiet)
    with failures(traceback):
        from hookscope.inputs import iter_batches
        from hookscope.render import output as out
        from hookscope.render import tables
        from hookscope.stats import collect_stats

        if output is not None:
            out.check_writable(output, force=force)
        resolved = _inputs(inputs, model)
        loaded = _load(model, weights, seed, device, size, trust_checkpoint)
        batches = iter_batches(resolved, loaded.preprocess, batch_size=batch_size,
                               ndim=loaded.input_ndim)
        with console.progress(len(resolved), "stats", enabled=_show_progress(fmt, output)) as step:
            report = collect_stats(
                loaded.model, (b.tensor for b in batches), layers=layers, types=type_,
                all_modules=all_modules, max_depth=max_depth, input_stats=input_stats,
                categories=loaded.categories, on_batch=step,
            )
        names = [item.name for item in resolved.items]
        doc = loaded.envelope("stats", names) | report.to_dict()
        if fmt is Format.json:
            out.emit(out.dumps_json(doc), output, force=force)
        elif fmt is Format.csv:
            rows = [_flatten_input_stats(r) for r in doc["layers"]]
            columns = list(STATS_COLUMNS) + (list(INPUT_STATS_COLUMNS) if input_stats else [])
            out.emit(out.dumps_csv(rows, columns), output, force=force)
        else:
            view = tables.stats_view(doc, input_stats=input_stats)
            if output is None:
                tables.print_view(view, console.stdout())
            else:
                out.emit(console.render_text(view), output, force=force)


STATS_COLUMNS = ("name", "type", "call", "input_shapes", "output_shape", "mean", "std", "min",
                 "max", "zero_fraction", "nonfinite")
INPUT_STATS_COLUMNS = ("input_mean", "input_std", "input_min", "input_max",
                       "input_zero_fraction", "input_nonfinite")


def _flatten_input_stats(row: dict) -> dict:
    extra = {f"input_{k}": v for k, v in (row.get("input_stats") or {}).items()}
    return row | extra


# ----------------------------------------------------------------- models, layers, debug (issue 3)


# ----------------------------------------------------------------- gradcam (issue 4)


# ----------------------------------------------------------------- grads, features, ablate (issue 5)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
