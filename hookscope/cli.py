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
from typing import TYPE_CHECKING, Annotated

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
    rich_markup_mode=None,  # plain help: Rich's help renderer alone costs ~0.12 s of start-up
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
    int | None,
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
    list[str] | None,
    typer.Option("--layers", "-l", help="fnmatch pattern on dotted module names (repeatable), "
                 "e.g. 'layer4.*'.", show_default=False),
]
TypeOpt = Annotated[
    list[str] | None,
    typer.Option("--type", "-t", help="Module class name, e.g. Conv2d (repeatable).",
                 show_default=False),
]
AllModulesOpt = Annotated[
    bool, typer.Option("--all-modules", help="Hook containers too, not only leaf modules.")
]
MaxDepthOpt = Annotated[
    int | None,
    typer.Option("--max-depth", help="Cut the module tree at this depth (1 = top-level children).",
                 min=1, show_default=False),
]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format.")]
OutputOpt = Annotated[
    Path | None,
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
        bool | None,
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


class ModelsFormat(str, Enum):
    """Output formats of ``models``."""

    table = "table"
    json = "json"


class DebugFormat(str, Enum):
    """Output formats of ``debug``: a live text trace, one JSON event per line, or one document."""

    text = "text"
    ndjson = "ndjson"
    json = "json"


LAYERS_COLUMNS = ("name", "type", "depth", "params", "params_total", "trainable", "call",
                  "input_shapes", "output_shape", "output_shapes")


@app.command("models")
def models_command(
    pattern: Annotated[
        str | None,
        typer.Argument(help="fnmatch pattern on model names, e.g. 'resnet*'; without wildcards "
                       "it matches names containing it.", metavar="PATTERN",
                       show_default=False),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option("--task", help="Only this task: classification, segmentation, detection, "
                     "video, optical_flow, quantization.", show_default=False),
    ] = None,
    fmt: Annotated[ModelsFormat, typer.Option("--format", "-f", help="Output format.")] = (
        ModelsFormat.table),
    traceback: TracebackOpt = False,
) -> None:
    """List the torchvision models hookscope can load, with their task and weights.

    Example: hookscope models 'resnet*' --format json | jq -r '.models[].name'
    """
    from hookscope.render import console

    console.setup_logging()
    with failures(traceback):
        from hookscope.catalog import find_models
        from hookscope.render import output as out

        found = find_models(pattern, task)
        doc = {"hookscope": __version__, "command": "models", "model": None, "weights": None,
               "device": None, "inputs": [], "pattern": pattern, "task": task,
               "models": [m.to_dict() for m in found]}
        if fmt is ModelsFormat.json:
            out.emit(out.dumps_json(doc), None)
        else:
            from hookscope.render import tree

            console.stdout().print(tree.models_table(doc))


@app.command("layers")
def layers_command(
    model: ModelArg,
    input_: Annotated[
        str | None,
        typer.Argument(help="One image or .pt/.npy tensor for the forward pass that records "
                       "shapes (its first sample); default: zeros of the weights' input size.",
                       metavar="INPUT", show_default=False),
    ] = None,
    weights: WeightsOpt = "auto",
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    size: SizeOpt = None,
    trust_checkpoint: TrustOpt = False,
    max_depth: MaxDepthOpt = None,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = None,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """The module tree: names, types, own and total parameters, trainable, output shape per call.

    Every name shown works in --layers and --layer of the other commands.

    Example: hookscope layers resnet18 --max-depth 2 --weights none
    """
    from hookscope.render import console

    console.setup_logging(quiet=quiet)
    with failures(traceback):
        from hookscope.render import output as out
        from hookscope.structure import model_structure

        if output is not None:
            out.check_writable(output, force=force)
        resolved = _inputs([input_], model) if input_ is not None else None
        loaded = _load(model, weights, seed, device, size, trust_checkpoint)
        if resolved is not None:
            from hookscope.inputs import iter_batches

            batch = next(iter(iter_batches(resolved, loaded.preprocess, batch_size=1,
                                           ndim=loaded.input_ndim, prefetch=False)))
            example = batch.tensor
        else:
            example = loaded.dummy_input()
        found = model_structure(loaded.model, example, max_depth=max_depth)
        doc = loaded.envelope("layers", [input_] if input_ is not None else []) | found.to_dict()
        if fmt is Format.json:
            out.emit(out.dumps_json(doc), output, force=force)
        elif fmt is Format.csv:
            # One row per call, as in `stats`; a module that never ran gets one row, no call.
            rows = [row | call | {"call": i} for row in doc["layers"]
                    for i, call in enumerate(row["calls"])]
            rows += [row | {"call": None} for row in doc["layers"] if not row["calls"]]
            order = {row["name"]: i for i, row in enumerate(doc["layers"])}
            rows.sort(key=lambda r: order[r["name"]])
            out.emit(out.dumps_csv(rows, LAYERS_COLUMNS), output, force=force)
        else:
            from hookscope.render import tree

            view = tree.layers_view(doc)
            if output is None:
                console.stdout().print(view)
            else:
                out.emit(console.render_text(view), output, force=force)


@app.command("debug")
def debug_command(
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
    fail_on_nonfinite: Annotated[
        bool, typer.Option("--fail-on-nonfinite", help="Exit with code 1 when any module "
                           "output holds NaN or Inf.")
    ] = False,
    fmt: Annotated[DebugFormat, typer.Option("--format", "-f", help="text: a live trace; "
                                             "ndjson: one JSON event per line; json: one "
                                             "document.")] = DebugFormat.text,
    quiet: QuietOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Trace the forward pass; report the first non-finite output and the module that crashed.

    Each selected module call prints an enter line (input shapes) and an exit line.

    Exit lines show the output shape, mean and std. Exit code 1: the forward pass raised.

    With --fail-on-nonfinite, exit code 1 also when NaN or Inf appears.

    Example: hookscope debug resnet18 cat.jpg --weights ckpt.pt --format ndjson --fail-on-nonfinite
    """
    from hookscope.render import console

    console.setup_logging(quiet=quiet)
    with failures(traceback):
        from hookscope.debug import run_debug
        from hookscope.errors import CheckFailed
        from hookscope.inputs import iter_batches
        from hookscope.render import output as out

        resolved = _inputs(inputs, model)
        loaded = _load(model, weights, seed, device, size, trust_checkpoint)
        envelope = loaded.envelope("debug", [item.name for item in resolved.items])
        events: list[dict] = []
        if fmt is DebugFormat.text:
            from hookscope.render import tree

            printer = tree.TracePrinter(console.stdout())
            printer.header(envelope)

            def on_event(event: object) -> None:
                printer(event.to_dict())  # type: ignore[attr-defined]
        elif fmt is DebugFormat.ndjson:
            def on_event(event: object) -> None:
                out.emit(out.dumps_ndjson(event), None)
        else:
            def on_event(event: object) -> None:
                events.append(event.to_dict())  # type: ignore[attr-defined]

        batches = iter_batches(resolved, loaded.preprocess, batch_size=batch_size,
                               ndim=loaded.input_ndim)
        report = run_debug(loaded.model, (b.tensor for b in batches), layers=layers,
                           types=type_, all_modules=all_modules, max_depth=max_depth,
                           on_event=on_event)
        summary = {"event": "summary"} | envelope | report.to_dict()
        if fmt is DebugFormat.text:
            printer.summary(summary)
        elif fmt is DebugFormat.ndjson:
            out.emit(out.dumps_ndjson(summary), None)
        else:
            summary.pop("event")
            out.emit(out.dumps_json(envelope | {"events": events, "summary": summary}), None)
        if report.error is not None:
            e = report.error
            where = "the model's own code" if e.name == "" else e.name
            raise CheckFailed(
                f"the forward pass failed in {where} ({e.type}, input shapes {e.input_shapes}): "
                f"{e.exception}: {e.message}"
            ) from report.cause
        if fail_on_nonfinite and report.origin is not None:
            o = report.origin
            what = ("the input holds non-finite values (first module: "
                    if o.source == "input" else "non-finite values first appear in ")
            raise CheckFailed(f"{what}{o.name} ({o.type}, call {o.call}, batch {o.batch})"
                              f"{')' if o.source == 'input' else ''}.")


# ----------------------------------------------------------------- gradcam (issue 4)


def _cam_method_enum() -> type[Enum]:
    from hookscope.cam_methods import method_names  # torch-free: only the registry

    return Enum("CamMethod", {n: n for n in method_names()}, type=str)  # type: ignore[return-value]


CamMethod = _cam_method_enum()


class CamFormat(str, Enum):
    """Output formats of ``gradcam``."""

    table = "table"
    json = "json"


class Reshape(str, Enum):
    """How a layer's output becomes a spatial map."""

    auto = "auto"
    none = "none"
    vit = "vit"
    swin = "swin"


@app.command()
def gradcam(
    model: ModelArg,
    inputs: InputsArg,
    layer: Annotated[
        str | None,
        typer.Option("--layer", help="Target layer (dotted name from `hookscope layers`); "
                     "default: the last module with a spatial output, e.g. layer4.",
                     show_default=False),
    ] = None,
    method: Annotated[
        list[CamMethod] | None,  # type: ignore[valid-type]
        typer.Option("--method", "-m", help="CAM method (repeatable). [default: gradcam]",
                     show_default=False),
    ] = None,
    target: Annotated[
        str, typer.Option("--target", help="Class to explain: top1, topK, a class index or "
                          "label, or a comma list with one per input.")
    ] = "top1",
    out: Annotated[
        Path, typer.Option("--out", help="Folder for <stem>.<method>.png, "
                           "<stem>.<method>.heatmap.png (and .npy with --save-raw).",
                           file_okay=False)
    ] = Path("hookscope-out"),
    reshape: Annotated[
        Reshape, typer.Option(help="Token outputs to a grid: auto (ViT-style CLS + square "
                              "grid), none, vit, or swin (N, H, W, C).")
    ] = Reshape.auto,
    colormap: Annotated[str, typer.Option(help="A matplotlib colormap name.")] = "jet",
    alpha: Annotated[
        float, typer.Option(help="Heatmap weight in the overlay.", min=0.0, max=1.0)
    ] = 0.5,
    save_raw: Annotated[
        bool, typer.Option("--save-raw", help="Also write <stem>.<method>.npy: the float32 map "
                           "at the layer's resolution, after ReLU, before normalisation.")
    ] = False,
    score_batch: Annotated[
        int, typer.Option("--score-batch", help="Masked inputs per forward pass (scorecam).",
                          min=1)
    ] = 32,
    weights: WeightsOpt = "auto",
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    size: SizeOpt = None,
    batch_size: BatchOpt = 8,
    trust_checkpoint: TrustOpt = False,
    fmt: Annotated[CamFormat, typer.Option("--format", "-f", help="Output format.")] = (
        CamFormat.table),
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Grad-CAM and its family: which pixels made the model choose a class.

    Example: hookscope gradcam resnet18 sample_images/*.jpg -m gradcam -m gradcam++ --out out/
    """
    from hookscope.render import console

    console.setup_logging(quiet=quiet)
    with failures(traceback):
        from hookscope.render import heatmap

        chosen = [str(getattr(m, "value", m)) for m in method or []]
        methods = list(dict.fromkeys(chosen)) or ["gradcam"]
        heatmap.check_colormap(colormap)
        resolved = _inputs(inputs, model)
        items = resolved.items
        plans = heatmap.output_paths([i.stem for i in items], methods, out, save_raw=save_raw)
        heatmap.check_outputs(out, plans, force=force)
        loaded = _load(model, weights, seed, device, size, trust_checkpoint)
        doc = _gradcam_run(loaded, resolved, plans, layer=layer, methods=methods, target=target,
                           out=out, reshape=reshape.value, colormap=colormap, alpha=alpha,
                           save_raw=save_raw, score_batch=score_batch, batch_size=batch_size,
                           force=force, progress=fmt is CamFormat.table)
        if fmt is CamFormat.json:
            from hookscope.render import output as outmod

            outmod.emit(outmod.dumps_json(doc), None)
        else:
            from hookscope.render import camview, tables

            tables.print_view(camview.cam_view(doc), console.stdout())


def _gradcam_run(loaded: LoadedModel, resolved: InputSet, plans: list, *, layer: str | None,
                 methods: list[str], target: str, out: Path, reshape: str, colormap: str,
                 alpha: float, save_raw: bool, score_batch: int, batch_size: int, force: bool,
                 progress: bool) -> dict:
    """Explain every batch and stage its PNGs; return the JSON document."""
    import logging

    from hookscope.cam import CamBatch, explain_batches
    from hookscope.inputs import iter_batches
    from hookscope.render import console, heatmap
    from hookscope.targets import parse_targets

    if loaded.input_ndim != 4:
        raise HookscopeError(f"{loaded.name} is a video model; gradcam explains image "
                             "classifiers.")
    targets = parse_targets(target, loaded.categories)
    targets.check_count(len(resolved))
    rows: list[dict] = []
    notes: dict[str, None] = {}
    last: CamBatch | None = None
    with heatmap.output_folder(out), heatmap.Staging(force=force) as staging, \
            console.progress(len(resolved), "gradcam", enabled=progress) as step:
        batches = iter_batches(resolved, loaded.preprocess, batch_size=batch_size,
                               keep_images=True, ndim=loaded.input_ndim)
        for last in explain_batches(loaded.model, batches, layer=layer, methods=methods,
                                    targets=targets, reshape=reshape, score_batch=score_batch,
                                    transform=loaded.preprocess):
            rows += heatmap.stage_cam_batch(staging, last, plans, label=loaded.label,
                                            mean=loaded.mean, std=loaded.std,
                                            save_raw=save_raw, cmap=colormap, alpha=alpha)
            notes.update(dict.fromkeys(last.notes))
            step(len(last))
    for note in notes:
        logging.getLogger("hookscope").warning(note)
    assert last is not None  # resolve_inputs never returns an empty set
    return loaded.envelope("gradcam", [i.name for i in resolved.items]) | {
        "layer": last.layer,
        "layer_default": layer is None,
        "layer_shape": last.layer_shape,
        "methods": methods,
        "out": str(out),
        "results": rows,
    }


# ----------------------------------------------------------------- grads, features, ablate (issue 5)


class GradLoss(str, Enum):
    """What ``grads`` differentiates."""

    logit = "logit"
    ce = "ce"


class FeatureOrder(str, Enum):
    """Which channels ``features`` shows first."""

    index_ = "index"  # not ``index``: that would shadow str.index
    mean = "mean"
    max = "max"


@app.command()
def grads(
    model: ModelArg,
    inputs: InputsArg,
    target: Annotated[
        str | None,
        typer.Option("--target", help="With --loss logit: the class whose logit is "
                     "differentiated: top1 (default), topK, an index or a label; one for all "
                     "inputs or a comma list, one per input.", show_default=False),
    ] = None,
    loss: Annotated[
        GradLoss, typer.Option("--loss", help="logit: the target logit summed over inputs; ce: "
                               "cross-entropy against --label, summed over inputs.")
    ] = GradLoss.logit,
    label: Annotated[
        str | None,
        typer.Option("--label", help="With --loss ce: the true class (index or label), one for "
                     "all inputs or a comma list, one per input.", show_default=False),
    ] = None,
    vanish: Annotated[
        float, typer.Option(help="Flag calls whose gradient norm is below this factor times "
                            "the median call's.", min=0.0)
    ] = 1e-3,
    explode: Annotated[
        float, typer.Option(help="Flag calls whose gradient norm is above this factor times "
                            "the median call's.", min=0.0)
    ] = 1e3,
    fail_on_nonfinite: Annotated[
        bool, typer.Option("--fail-on-nonfinite", help="Exit with code 1 when any gradient "
                           "holds NaN or Inf.")
    ] = False,
    params: Annotated[
        bool, typer.Option("--params/--no-params", help="Show the parameter table (table "
                           "format; JSON and CSV always hold the parameters).")
    ] = True,
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
    fmt: FormatOpt = Format.table,
    output: OutputOpt = None,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Gradient flow: the gradient at each module call's output (backward order) and each
    parameter, with vanishing/exploding flags and the first non-finite module.

    Example: hookscope grads resnet18 cat.jpg --loss ce --label tabby --format json
    """
    from hookscope.render import console

    console.setup_logging(quiet=quiet)
    with failures(traceback):
        from hookscope.errors import CheckFailed
        from hookscope.grads import collect_grads
        from hookscope.inputs import iter_batches
        from hookscope.render import grads as grads_render
        from hookscope.render import output as out
        from hookscope.render import tables

        if output is not None:
            out.check_writable(output, force=force)
        resolved = _inputs(inputs, model)
        loaded = _load(model, weights, seed, device, size, trust_checkpoint)
        batches = iter_batches(resolved, loaded.preprocess, batch_size=batch_size,
                               ndim=loaded.input_ndim)
        with console.progress(len(resolved), "grads", enabled=_show_progress(fmt, output)) as step:
            report = collect_grads(
                loaded.model, (b.tensor for b in batches), target=target, loss=loss.value,
                label=label, layers=layers, types=type_, all_modules=all_modules,
                max_depth=max_depth, vanish=vanish, explode=explode,
                categories=loaded.categories, n_inputs=len(resolved), on_batch=step,
            )
        doc = loaded.envelope("grads", [item.name for item in resolved.items]) | report.to_dict()
        if fmt is Format.json:
            out.emit(out.dumps_json(doc), output, force=force)
        elif fmt is Format.csv:
            out.emit(out.dumps_csv(grads_render.csv_rows(doc), grads_render.CSV_COLUMNS), output,
                     force=force)
        else:
            view = grads_render.grads_view(doc, params=params)
            if output is None:
                tables.print_view(view, console.stdout())
            else:
                out.emit(console.render_text(view), output, force=force)
        if fail_on_nonfinite and report.nonfinite:
            where = report.first_nonfinite or "a parameter gradient"
            raise CheckFailed(f"non-finite gradient; first in backward order: {where}.")


FEATURE_COLUMNS = ("input", "layer", "type", "call", "shape", "channels", "nonfinite", "path")


@app.command()
def features(
    model: ModelArg,
    inputs: InputsArg,
    layer: Annotated[
        list[str] | None,
        typer.Option("--layer", help="A module's dotted name or an fnmatch pattern "
                     "(repeatable).", show_default=False),
    ] = None,
    type_: TypeOpt = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Directory for the grid PNGs "
                           "(<stem>.<layer>.png).", file_okay=False)
    ] = Path("hookscope-out"),
    tensorboard: Annotated[
        Path | None,
        typer.Option("--tensorboard", help="Also log the grids and activation histograms to "
                     "this TensorBoard log directory (needs hookscope[tensorboard]).",
                     file_okay=False, show_default=False),
    ] = None,
    max_channels: Annotated[
        int, typer.Option("--max-channels", help="At most this many channels per grid.", min=1)
    ] = 64,
    order: Annotated[
        FeatureOrder, typer.Option("--order", help="Channels shown: index (the first), mean or "
                                   "max (the most active first).")
    ] = FeatureOrder.index_,
    upsample: Annotated[
        bool, typer.Option("--upsample", help="Resize each tile to the input size.")
    ] = False,
    weights: WeightsOpt = "auto",
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    size: SizeOpt = None,
    batch_size: BatchOpt = 8,
    trust_checkpoint: TrustOpt = False,
    fmt: FormatOpt = Format.table,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Feature maps as image grids: one PNG per selected layer and input, optionally to
    TensorBoard too.

    Example: hookscope features resnet18 cat.jpg --type Conv2d --out maps/ --tensorboard runs/
    """
    from hookscope.render import console

    console.setup_logging(quiet=quiet)
    with failures(traceback):
        from contextlib import ExitStack

        from hookscope.features import feature_sites, iter_feature_grids, output_name, unique_stems
        from hookscope.inputs import iter_batches
        from hookscope.render import grid as grid_render
        from hookscope.render import output as out
        from hookscope.render import tables

        if tensorboard is not None:
            grid_render.require_tensorboard()
        resolved = _inputs(inputs, model)
        loaded = _load(model, weights, seed, device, size, trust_checkpoint)
        sites = feature_sites(loaded.model, layer, type_)
        stems = unique_stems([item.stem for item in resolved.items])
        grid_render.check_outputs(
            out_dir, [output_name(s, site.name) for s in stems for site in sites], force=force)
        batches = iter_batches(resolved, loaded.preprocess, batch_size=batch_size,
                               ndim=loaded.input_ndim)
        rows: list[dict] = []
        with ExitStack() as stack:
            step = stack.enter_context(console.progress(
                len(resolved) * len(sites), "features", enabled=fmt is Format.table))
            board = None
            for grid in iter_feature_grids(loaded.model, batches, sites,
                                           max_channels=max_channels, order=order.value,
                                           upsample=upsample, stems=stems):
                if not rows:  # created only once a grid exists: a failed run leaves nothing
                    out_dir.mkdir(parents=True, exist_ok=True)
                    if tensorboard is not None:
                        board = stack.enter_context(grid_render.Board(tensorboard))
                path = grid_render.save_png(grid.image, out_dir / grid.filename, force=force)
                if board is not None:
                    board.add(grid)
                rows.append(grid.to_dict() | {"path": str(path)})
                step(1)
        doc = loaded.envelope("features", [item.name for item in resolved.items]) | {
            "out": str(out_dir),
            "tensorboard": str(tensorboard) if tensorboard is not None else None,
            "files": [row["path"] for row in rows],
            "grids": rows,
        }
        if fmt is Format.json:
            out.emit(out.dumps_json(doc), None)
        elif fmt is Format.csv:
            flat = [r | {"channels": ",".join(map(str, r["channels"]))} for r in rows]
            out.emit(out.dumps_csv(flat, FEATURE_COLUMNS), None)
        else:
            tables.print_view(grid_render.features_view(doc), console.stdout())


ABLATE_COLUMNS = ("input", "layer", "mode", "channels", "target", "target_label", "delta_logit",
                  "delta_prob", "kl")
SWEEP_COLUMNS = ("input", "layer", "mode", "target", "target_label", "rank", "channel", "drop",
                 "delta_prob", "kl")


@app.command()
def ablate(
    model: ModelArg,
    inputs: InputsArg,
    layer: Annotated[
        str, typer.Option("--layer", help="The module whose output is changed (dotted name, "
                          "see `hookscope layers`).", show_default=False)
    ],
    channels: Annotated[
        str | None,
        typer.Option("--channels", help="Channels to change: 0,5,7, ranges such as 0-15, or "
                     "all (the default; with --sweep, the channels swept).", show_default=False),
    ] = None,
    sweep: Annotated[
        bool, typer.Option("--sweep", help="Ablate each channel alone, batched, and rank the "
                           "channels by how much the target logit drops.")
    ] = False,
    mode: Annotated[
        str, typer.Option("--mode", help="zero, mean (the channel's spatial mean), noise:SIGMA "
                          "(Gaussian noise added, seeded by --seed) or scale:F.")
    ] = "zero",
    target: Annotated[
        str | None,
        typer.Option("--target", help="The class compared: top1 before the ablation (default), "
                     "topK, an index or a label; one for all inputs or a comma list, one per "
                     "input.", show_default=False),
    ] = None,
    sweep_batch: Annotated[
        int, typer.Option("--sweep-batch", help="Channels ablated per forward pass in a sweep.",
                          min=1)
    ] = 32,
    call: Annotated[
        int | None,
        typer.Option("--call", help="Only change this call of a module run several times "
                     "(default: every call).", min=0, show_default=False),
    ] = None,
    channel_dim: Annotated[
        int, typer.Option("--channel-dim", help="The output dimension holding channels "
                          "(1 for (N, C, H, W); -1 for token outputs (N, T, C)).")
    ] = 1,
    top: Annotated[
        int, typer.Option("--top", help="Sweep ranking rows shown in the table.", min=1)
    ] = 10,
    weights: WeightsOpt = "auto",
    seed: SeedOpt = 0,
    device: DeviceOpt = "auto",
    size: SizeOpt = None,
    batch_size: BatchOpt = 8,
    trust_checkpoint: TrustOpt = False,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = None,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    traceback: TracebackOpt = False,
) -> None:
    """Feature modification: change channels of a layer's output and compare the top-5
    predictions, the target's logit and probability, and the KL divergence.

    Example: hookscope ablate resnet18 cat.jpg --layer layer4 --sweep --format json
    """
    from hookscope.render import console

    console.setup_logging(quiet=quiet)
    with failures(traceback):
        from contextlib import ExitStack

        from hookscope import ablate as lib
        from hookscope.inputs import iter_batches
        from hookscope.render import ablate as ablate_render
        from hookscope.render import output as out
        from hookscope.render import tables
        from hookscope.targets import parse_targets

        if output is not None:
            out.check_writable(output, force=force)
        parsed_mode = lib.parse_mode(mode)
        resolved = _inputs(inputs, model)
        loaded = _load(model, weights, seed, device, size, trust_checkpoint)
        targets = parse_targets(target, loaded.categories)
        targets.check_count(len(resolved))
        batches = iter_batches(resolved, loaded.preprocess, batch_size=batch_size,
                               ndim=loaded.input_ndim)
        results: list = []
        with ExitStack() as stack:
            step = None
            for batch in batches:
                names = [item.name for item in batch.items]
                if not sweep:
                    results += lib.ablate(loaded.model, batch.tensor, layer, names=names,
                                          start=batch.start, channels=channels,
                                          mode=parsed_mode, target=targets, seed=seed,
                                          channel_dim=channel_dim, call=call,
                                          categories=loaded.categories)
                    continue
                if step is None:
                    count = lib.channel_count(loaded.model, batch.tensor, layer, channel_dim)
                    swept = len(lib.parse_channels(channels, count))
                    step = stack.enter_context(console.progress(
                        len(resolved) * swept, "sweep", enabled=_show_progress(fmt, output)))
                results += lib.sweep(loaded.model, batch.tensor, layer, batch=sweep_batch,
                                     names=names, start=batch.start, on_step=step,
                                     channels=channels, mode=parsed_mode, target=targets,
                                     seed=seed, channel_dim=channel_dim, call=call,
                                     categories=loaded.categories)
        doc = loaded.envelope("ablate", [item.name for item in resolved.items]) | {
            "results": [r.to_dict() for r in results],
        }
        if fmt is Format.json:
            out.emit(out.dumps_json(doc), output, force=force)
        elif fmt is Format.csv:
            if sweep:
                rows = [r | {"rank": i} | ranked for r in doc["results"]
                        for i, ranked in enumerate(r["ranking"], 1)]
                out.emit(out.dumps_csv(rows, SWEEP_COLUMNS), output, force=force)
            else:
                rows = [r | {"channels": ",".join(map(str, r["channels"]))}
                        for r in doc["results"]]
                out.emit(out.dumps_csv(rows, ABLATE_COLUMNS), output, force=force)
        else:
            view = ablate_render.ablate_view(doc, top=top)
            if output is None:
                tables.print_view(view, console.stdout())
            else:
                out.emit(console.render_text(view), output, force=force)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
