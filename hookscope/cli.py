"""The ``hookscope`` command line: options in, then source, probe, drive, emit.

Each command only collects its options and wires the library together; errors, signals,
outputs and progress are :mod:`hookscope.session`'s, drawing and writing are
:mod:`hookscope.render`'s. Start-up stays fast: torch and Rich are imported inside the
commands, never at module level, so ``hookscope --help`` does not load them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hookscope import __version__
from hookscope.options import (
    AllModulesOpt,
    CamMethod,
    DebugFormat,
    FailOpt,
    FeatureOrder,
    FormatOpt,
    GradLoss,
    InputsArg,
    LayersOpt,
    MaxDepthOpt,
    ModelArg,
    ModelSource,
    Options,
    OutDirOpt,
    Reshape,
    TargetOpt,
    TrainModeOpt,
    TypesOpt,
    command,
    runs_model,
)
from hookscope.options import value as _value

app = typer.Typer(
    name="hookscope",
    help="Inspect PyTorch vision models through hooks that are always removed.\n\n"
    "Data goes to stdout, progress and notes to stderr; exit codes: 0 ok, 1 a requested "
    "check failed or the model's forward raised, 2 bad input.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: Rich's help renderer alone costs ~0.12 s of start-up
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"hookscope {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[bool | None, typer.Option(
        "--version", callback=version_callback, is_eager=True,
        help="Print the version and exit.")] = None,
) -> None:
    """Inspect PyTorch vision models through hooks that are always removed."""


# ----------------------------------------------------------------- stats, models, layers


@app.command()
@runs_model
def stats(
    model: ModelArg, inputs: InputsArg, layers: LayersOpt = None, types: TypesOpt = None,
    all_modules: AllModulesOpt = False, max_depth: MaxDepthOpt = None,
    input_stats: Annotated[bool, typer.Option(
        "--input-stats", help="Also summarise each module's first input.")] = False,
    train_mode: TrainModeOpt = False, fmt: FormatOpt = "table", *, opts: Options,
) -> None:
    """Per-layer output statistics: shapes, mean, std, min, max, zeros, non-finite values.

    Example: hookscope stats resnet18 cat.jpg --format json | jq '.layers[] | select(.nonfinite > 0)'
    """
    from hookscope.stats import StatsProbe

    s, fmt = opts.s, _value(fmt)
    out = s.output(opts.output, force=opts.force)
    resolved = s.inputs(inputs, opts.model)
    loaded = s.load(opts.model, "stats")
    probe = StatsProbe(loaded.model, layers=layers, types=types, all_modules=all_modules,
                       max_depth=max_depth, input_stats=input_stats,
                       categories=loaded.categories, output_key=loaded.output_key)
    with s.progress(len(resolved), "stats", enabled=fmt == "table" or not out.is_stdout) as bar:
        report = s.drive(loaded, s.batches(resolved, loaded, opts.model), probe,
                       train_mode=train_mode, progress=bar)
    doc = loaded.envelope("stats", resolved.names) | report.to_dict()
    s.emit("stats", doc, fmt, out, input_stats=input_stats)


@app.command("models")
@command
def models_command(
    pattern: Annotated[str | None, typer.Argument(
        help="fnmatch pattern on model names, e.g. 'resnet*'; without wildcards it matches "
        "names containing it.", metavar="PATTERN", show_default=False)] = None,
    task: Annotated[str | None, typer.Option(
        "--task", help="Only this task: classification, segmentation, detection, video, "
        "optical_flow, quantization.", show_default=False)] = None,
    source: Annotated[ModelSource, typer.Option(  # type: ignore[valid-type]
        "--source", help="torchvision's models, or timm's (names to use as timm:NAME; needs "
        "hookscope[timm]).")] = "torchvision",
    fmt: FormatOpt = "table", *, opts: Options,
) -> None:
    """List the models hookscope can load by name, with their task and weights.

    Example: hookscope models 'resnet*' --format json | jq -r '.models[].name'
    """
    from hookscope.catalog import find_models, find_timm_models

    s = opts.s
    out = s.output(opts.output, force=opts.force)
    found = find_timm_models(pattern, task) if _value(source) == "timm" else \
        find_models(pattern, task)
    doc = {"hookscope": __version__, "command": "models", "model": None, "weights": None,
           "device": None, "inputs": [], "pattern": pattern, "task": task,
           "source": _value(source), "models": [m.to_dict() for m in found]}
    s.emit("models", doc, _value(fmt), out)


@app.command("layers")
@runs_model
def layers_command(
    model: ModelArg,
    input_: Annotated[str | None, typer.Argument(
        help="One image or .pt/.npy tensor for the forward pass that records shapes (its "
        "first sample); default: zeros of the weights' input size.", metavar="INPUT",
        show_default=False)] = None,
    max_depth: MaxDepthOpt = None, fmt: FormatOpt = "table", *, opts: Options,
) -> None:
    """The module tree: names, types, own and total parameters, trainable, output shape per call.

    Every name shown works in --layers and --layer of the other commands.

    Example: hookscope layers resnet18 --max-depth 2 --weights none
    """
    from hookscope.run import peek
    from hookscope.structure import model_structure

    s = opts.s
    out = s.output(opts.output, force=opts.force)
    resolved = s.inputs([input_], opts.model) if input_ is not None else None
    loaded = s.load(opts.model, "layers")
    example = loaded.dummy_input()
    if resolved is not None:
        example = peek(s.batches(resolved, loaded, opts.model))[0].tensor[:1]
    found = model_structure(loaded.model, example, max_depth=max_depth, autocast=loaded.autocast)
    doc = loaded.envelope("layers", [input_] if input_ is not None else []) | found.to_dict()
    s.emit("layers", doc, _value(fmt), out)


# ----------------------------------------------------------------- debug


@app.command("debug")
@runs_model
def debug_command(
    model: ModelArg, inputs: InputsArg, layers: LayersOpt = None, types: TypesOpt = None,
    all_modules: AllModulesOpt = False, max_depth: MaxDepthOpt = None,
    fail_on_nonfinite: FailOpt = False, train_mode: TrainModeOpt = False,
    fmt: Annotated[DebugFormat, typer.Option(  # type: ignore[valid-type]
        "--format", "-f", help="text: a live trace; ndjson: one JSON event per line; json: "
        "one document.")] = "text",
    *, opts: Options,
) -> None:
    """Trace the forward pass; report the first non-finite output and the module that crashed.

    Each selected module call prints an enter line (input shapes) and an exit line (output
    shape, mean and std). Exit code 1: the forward pass raised, or, with
    --fail-on-nonfinite, NaN or Inf appeared.

    Example: hookscope debug resnet18 cat.jpg --weights ckpt.pt --format ndjson --fail-on-nonfinite
    """
    from hookscope.debug import DebugProbe, nonfinite_failure
    from hookscope.render.tree import TraceWriter

    s, fmt = opts.s, _value(fmt)
    out = s.output(opts.output, force=opts.force)
    resolved = s.inputs(inputs, opts.model)
    loaded = s.load(opts.model, "debug")
    envelope = loaded.envelope("debug", resolved.names)
    writer = TraceWriter(fmt, out, envelope)
    probe = DebugProbe(loaded.model, layers=layers, types=types, all_modules=all_modules,
                       max_depth=max_depth, on_event=writer.event)
    with writer:
        report = s.drive(loaded, s.batches(resolved, loaded, opts.model), probe,
                       train_mode=train_mode)
        writer.summary(report.to_dict())
    if report.failure is not None:
        raise report.failure
    if fail_on_nonfinite and report.origin is not None:
        raise nonfinite_failure(report.origin)


# ----------------------------------------------------------------- gradcam


@app.command()
@runs_model
def gradcam(
    model: ModelArg, inputs: InputsArg,
    layer: Annotated[str | None, typer.Option(
        "--layer", help="Target layer (dotted name from `hookscope layers`); default: the last "
        "module with a spatial output, e.g. layer4.", show_default=False)] = None,
    method: Annotated[list[CamMethod] | None, typer.Option(  # type: ignore[valid-type]
        "--method", "-m", help="CAM method (repeatable). [default: gradcam]",
        show_default=False)] = None,
    target: TargetOpt = None,
    out_dir: OutDirOpt = Path("hookscope-out"),
    reshape: Annotated[Reshape, typer.Option(  # type: ignore[valid-type]
        help="Token outputs to a grid: auto (ViT-style CLS + square grid), none, vit, or swin "
        "(N, H, W, C).")] = "auto",
    colormap: Annotated[str, typer.Option(help="A matplotlib colormap name.")] = "jet",
    alpha: Annotated[float, typer.Option(help="Heatmap weight in the overlay.", min=0.0,
                                         max=1.0)] = 0.5,
    save_raw: Annotated[bool, typer.Option(
        "--save-raw", help="Also write <stem>.<method>.npy: the float32 map at the layer's "
        "resolution, after ReLU, before normalisation.")] = False,
    score_batch: Annotated[int, typer.Option(
        "--score-batch", help="Masked inputs per forward pass (scorecam).", min=1)] = 32,
    fmt: FormatOpt = "table", *, opts: Options,
) -> None:
    """Grad-CAM and its family: which pixels made the model choose a class.

    Writes <stem>.<method>.png (overlay) and <stem>.<method>.heatmap.png into --out.

    Example: hookscope gradcam resnet18 sample_images/*.jpg -m gradcam -m gradcam++ --out out/
    """
    from hookscope.cam import explain
    from hookscope.render.heatmap import CamWriter, check_colormap, output_paths
    from hookscope.render.output import Staging
    from hookscope.targets import parse_targets

    s = opts.s
    methods = list(dict.fromkeys(_value(m) for m in method or [])) or ["gradcam"]
    check_colormap(colormap)
    out = s.output(opts.output, force=opts.force)
    resolved = s.inputs(inputs, opts.model)
    plans = output_paths(resolved.stems, methods, out_dir, save_raw=save_raw)
    s.folder(out_dir, [p for plan in plans for f in plan.values() for p in f.values() if p],
             force=opts.force)
    loaded = s.load(opts.model, "gradcam")
    targets = parse_targets(target, loaded.categories)
    targets.check_count(len(resolved))
    with Staging(out_dir, force=opts.force) as staging, \
            s.progress(len(resolved), "gradcam", enabled=_value(fmt) == "table") as bar:
        writer = CamWriter(staging, plans, loaded, save_raw=save_raw, cmap=colormap, alpha=alpha)
        report = explain(loaded.model, s.batches(resolved, loaded, opts.model, keep_images=True),
                         layer=layer, methods=methods, targets=targets, reshape=_value(reshape),
                         score_batch=score_batch, transform=loaded.preprocess, sink=writer,
                         progress=bar, output_key=loaded.output_key, autocast=loaded.autocast)
    writer.log_notes(report.notes)
    doc = loaded.envelope("gradcam", resolved.names) | {
        "layer": report.layer, "layer_default": layer is None, "layer_shape": report.layer_shape,
        "methods": methods, "out": str(out_dir), "results": writer.rows}
    s.emit("gradcam", doc, _value(fmt), out)


# ----------------------------------------------------------------- grads, features, ablate


@app.command()
@runs_model
def grads(
    model: ModelArg, inputs: InputsArg, target: TargetOpt = None,
    loss: Annotated[GradLoss, typer.Option(  # type: ignore[valid-type]
        "--loss", help="logit: the target logit summed over inputs; ce: cross-entropy against "
        "--label, summed over inputs.")] = "logit",
    label: Annotated[str | None, typer.Option(
        "--label", help="With --loss ce: the true class (index or label), one for all inputs "
        "or a comma list, one per input.", show_default=False)] = None,
    vanish: Annotated[float, typer.Option(
        help="Flag calls whose gradient norm is below this factor times the median call's.",
        min=0.0)] = 1e-3,
    explode: Annotated[float, typer.Option(
        help="Flag calls whose gradient norm is above this factor times the median call's.",
        min=0.0)] = 1e3,
    fail_on_nonfinite: FailOpt = False,
    params: Annotated[bool, typer.Option(
        "--params/--no-params", help="Show the parameter table (table format; JSON and CSV "
        "always hold the parameters).")] = True,
    layers: LayersOpt = None, types: TypesOpt = None, all_modules: AllModulesOpt = False,
    max_depth: MaxDepthOpt = None, train_mode: TrainModeOpt = False, fmt: FormatOpt = "table",
    *, opts: Options,
) -> None:
    """Gradient flow: the gradient at each module call's output (backward order) and each
    parameter, with vanishing/exploding flags and the first non-finite module.

    Example: hookscope grads resnet18 cat.jpg --loss ce --label tabby --format json
    """
    from hookscope.grads import GradsProbe, nonfinite_failure

    s, fmt = opts.s, _value(fmt)
    out = s.output(opts.output, force=opts.force)
    resolved = s.inputs(inputs, opts.model)
    loaded = s.load(opts.model, "grads")
    probe = GradsProbe(loaded.model, target=target, loss=_value(loss), label=label,
                       layers=layers, types=types, all_modules=all_modules,
                       max_depth=max_depth, vanish=vanish, explode=explode,
                       categories=loaded.categories, n_inputs=len(resolved),
                       output_key=loaded.output_key)
    with s.progress(len(resolved), "grads", enabled=fmt == "table" or not out.is_stdout) as bar:
        report = s.drive(loaded, s.batches(resolved, loaded, opts.model), probe,
                       train_mode=train_mode, progress=bar)
    doc = loaded.envelope("grads", resolved.names) | report.to_dict()
    s.emit("grads", doc, fmt, out, params=params)
    if fail_on_nonfinite and report.nonfinite:
        raise nonfinite_failure(report)


@app.command()
@runs_model
def features(
    model: ModelArg, inputs: InputsArg,
    layers: Annotated[list[str] | None, typer.Option(
        "--layer", "-l", help="A module's dotted name or an fnmatch pattern (repeatable).",
        show_default=False)] = None,
    types: TypesOpt = None,
    out_dir: Annotated[Path, typer.Option(
        "--out", help="Folder for the grid PNGs (<stem>.<layer>.png).", file_okay=False)] = (
        Path("hookscope-out")),
    tensorboard: Annotated[Path | None, typer.Option(
        "--tensorboard", help="Also log the grids and activation histograms to this "
        "TensorBoard log directory (needs hookscope[tensorboard]).", file_okay=False,
        show_default=False)] = None,
    max_channels: Annotated[int, typer.Option(
        "--max-channels", help="At most this many channels per grid.", min=1)] = 64,
    order: Annotated[FeatureOrder, typer.Option(  # type: ignore[valid-type]
        "--order", help="Channels shown: index (the first), mean or max (the most active "
        "first).")] = "index",
    upsample: Annotated[bool, typer.Option(
        "--upsample", help="Resize each tile to the input size.")] = False,
    fmt: FormatOpt = "table", *, opts: Options,
) -> None:
    """Feature maps as image grids: one PNG per selected layer and input, optionally to
    TensorBoard too.

    Example: hookscope features resnet18 cat.jpg --type Conv2d --out maps/ --tensorboard runs/
    """
    from hookscope.features import FeaturesProbe, feature_sites, output_name
    from hookscope.render.grid import GridWriter, require_tensorboard
    from hookscope.render.output import Staging

    s = opts.s
    if tensorboard is not None:
        require_tensorboard()
    out = s.output(opts.output, force=opts.force)
    resolved = s.inputs(inputs, opts.model)
    s.folder(out_dir, [], force=opts.force)  # the files are known once the model is
    loaded = s.load(opts.model, "features")
    sites = feature_sites(loaded.model, layers, types)
    stems = resolved.stems
    s.folder(out_dir, [out_dir / output_name(stem, site.name) for stem in stems
                       for site in sites], force=opts.force)
    with Staging(out_dir, force=opts.force) as staging, \
            GridWriter(staging, out_dir, tensorboard) as writer, \
            s.progress(len(resolved) * len(sites), "features",
                       enabled=_value(fmt) == "table") as bar:
        probe = FeaturesProbe(sites, sink=writer.add, max_channels=max_channels,
                              order=_value(order), upsample=upsample, stems=stems)
        report = s.drive(loaded, s.batches(resolved, loaded, opts.model), probe,
                       progress=lambda n: bar(n * len(sites)))
    doc = loaded.envelope("features", resolved.names) | {
        "out": str(out_dir), "tensorboard": str(tensorboard) if tensorboard else None,
        "files": [row["path"] for row in report.grids]} | report.to_dict()
    s.emit("features", doc, _value(fmt), out)


@app.command()
@runs_model
def ablate(
    model: ModelArg, inputs: InputsArg,
    layer: Annotated[str, typer.Option(
        "--layer", help="The module whose output is changed (dotted name, see `hookscope "
        "layers`).", show_default=False)],
    channels: Annotated[str | None, typer.Option(
        "--channels", help="Channels to change: 0,5,7, ranges such as 0-15, or all (the "
        "default; with --sweep, the channels swept).", show_default=False)] = None,
    sweep: Annotated[bool, typer.Option(
        "--sweep", help="Ablate each channel alone, batched, and rank the channels by how much "
        "the target logit drops.")] = False,
    mode: Annotated[str, typer.Option(
        "--mode", help="zero, mean (the channel's spatial mean), noise:SIGMA (Gaussian noise "
        "added, seeded by --seed) or scale:F.")] = "zero",
    target: TargetOpt = None,
    sweep_batch: Annotated[int, typer.Option(
        "--sweep-batch", help="Channels ablated per forward pass in a sweep.", min=1)] = 32,
    call: Annotated[int | None, typer.Option(
        "--call", help="Only change this call of a module run several times (default: every "
        "call).", min=0, show_default=False)] = None,
    channel_dim: Annotated[int, typer.Option(
        "--channel-dim", help="The output dimension holding channels (1 for (N, C, H, W); -1 "
        "for token outputs (N, T, C)).")] = 1,
    top: Annotated[int, typer.Option("--top", help="Sweep ranking rows shown in the table.",
                                     min=1)] = 10,
    fmt: FormatOpt = "table", *, opts: Options,
) -> None:
    """Feature modification: change channels of a layer's output and compare the top-5
    predictions, the target's logit and probability, and the KL divergence.

    Example: hookscope ablate resnet18 cat.jpg --layer layer4 --sweep --format json
    """
    from hookscope.ablate import AblateProbe, parse_mode

    s, fmt = opts.s, _value(fmt)
    out = s.output(opts.output, force=opts.force)
    parsed = parse_mode(mode)
    resolved = s.inputs(inputs, opts.model)
    loaded = s.load(opts.model, "ablate")
    probe = AblateProbe(loaded.model, layer, channels=channels, mode=parsed, target=target,
                        seed=opts.model.seed, channel_dim=channel_dim, call=call,
                        categories=loaded.categories, sweep=sweep, sweep_batch=sweep_batch,
                        n_inputs=len(resolved), output_key=loaded.output_key)
    label = "sweep" if sweep else "ablate"
    with s.progress(len(resolved), label, enabled=fmt == "table" or not out.is_stdout) as bar:
        report = s.drive(loaded, s.batches(resolved, loaded, opts.model), probe,
                       progress=bar)
    doc = loaded.envelope("ablate", resolved.names) | report.to_dict()
    s.emit("ablate", doc, fmt, out, top=top, sweep=sweep)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
