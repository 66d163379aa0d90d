"""The ``hookscope`` command line: options in, then source, probe, drive, emit.

Each command only collects its options and wires the library together; errors, signals,
outputs and progress are :mod:`hookscope.session`'s, drawing and writing are
:mod:`hookscope.render`'s. Start-up stays fast: torch and Rich are imported inside the
commands, never at module level, so ``hookscope --help`` does not load them.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
    PlotOpt,
    Reshape,
    TargetOpt,
    TrainModeOpt,
    TypesOpt,
    command,
    runs_model,
)
from hookscope.options import value as _value

if TYPE_CHECKING:
    from hookscope.render.output import Output

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
    per_channel: Annotated[bool, typer.Option(
        "--per-channel", help="Also per-channel count, mean, std, min, max, zero fraction and "
        "non-finite count of each output (channels on dim 1; the last dim of 3-D token "
        "outputs and of Linear/LayerNorm outputs). CSV: one row per channel.")] = False,
    percentiles: Annotated[str | None, typer.Option(
        "--percentiles", help="Also these percentiles of each output (and channel), e.g. "
        "0.1,99.9,99.99; from a mergeable sketch, within 0.4% of the value range.",
        metavar="P,P,...", show_default=False)] = None,
    train_mode: TrainModeOpt = False, fmt: FormatOpt = "table", plot: PlotOpt = None, *,
    opts: Options,
) -> None:
    """Per-layer output statistics: shapes, mean, std, min, max, zeros, non-finite values.

    --plot FILE.svg|png draws the activation profile: mean ± std, min/max and the zero
    fraction per call, non-finite calls red, dead ones yellow.

    Example: hookscope stats resnet18 cat.jpg --format json | jq '.layers[] | select(.nonfinite > 0)'
    """
    from hookscope.sketch import parse_percentiles, percentile_key
    from hookscope.stats import StatsProbe

    s, fmt = opts.s, _value(fmt)
    wanted = parse_percentiles(percentiles)
    out = s.output(opts.output, force=opts.force)
    plot_out = _plot_output(plot, opts.force)
    resolved = s.inputs(inputs, opts.model)
    loaded = s.load(opts.model, "stats")
    probe = StatsProbe(loaded.model, layers=layers, types=types, all_modules=all_modules,
                       max_depth=max_depth, input_stats=input_stats,
                       categories=loaded.categories, output_key=loaded.output_key,
                       per_channel=per_channel, percentiles=wanted)
    with s.progress(len(resolved), "stats", enabled=fmt == "table" or not out.is_stdout) as bar:
        report = s.drive(loaded, s.batches(resolved, loaded, opts.model), probe,
                       train_mode=train_mode, progress=bar)
    doc = loaded.envelope("stats", resolved.names) | report.to_dict()
    figure = None
    if plot_out is not None:
        from hookscope.render.plots import profile_figure, render_plot

        figure = render_plot(profile_figure(
            doc["layers"], title=f"{opts.model.name}: activation profile"), plot_out)
    s.emit("stats", doc, fmt, out, input_stats=input_stats, per_channel=per_channel,
           percentiles=tuple(percentile_key(p) for p in wanted))
    _write_plot(figure, plot_out)


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
    layer: Annotated[list[str] | None, typer.Option(
        "--layer", help="Target layer (dotted name from `hookscope layers`), repeatable: the "
        "layers' maps are averaged. Default: the last module with a spatial output (layer4); "
        "for segmentation and detection models the backbone's last stage.",
        show_default=False)] = None,
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
        "--save-raw", help="Also write <stem>.<method>.npy (one <stem>.<method>.<layer>.npy "
        "per layer with several): the float32 map at the layer's resolution, after ReLU, "
        "before normalisation.")] = False,
    score_batch: Annotated[int, typer.Option(
        "--score-batch", help="Masked, ablated or perturbed inputs per forward pass (scorecam, "
        "ablationcam, sscam, iscam, --metrics).", min=1)] = 32,
    aug_smooth: Annotated[bool, typer.Option(
        "--aug-smooth", help="Average the maps of the input flipped and scaled by 0.9, 1, "
        "1.1 (pytorch-grad-cam's).")] = False,
    eigen_smooth: Annotated[bool, typer.Option(
        "--eigen-smooth", help="The first principal component of the weighted activations "
        "instead of their sum over channels.")] = False,
    guided: Annotated[bool, typer.Option(
        "--guided", help="Also write <stem>.<method>.guided.png: guided backpropagation "
        "times the map (guided Grad-CAM).")] = False,
    mask: Annotated[Path | None, typer.Option(
        "--mask", help="Segmentation: the region explained, an image whose non-zero pixels "
        "are the region (the input image's size or the model input's); default: where the "
        "model predicts --target.", dir_okay=False, show_default=False)] = None,
    box_index: Annotated[list[int] | None, typer.Option(
        "--box-index", help="Detection: explain this detection (repeatable), counted among "
        "those above --min-score (of class --target, if given), best first.", min=0,
        show_default=False)] = None,
    iou: Annotated[float, typer.Option(
        "--iou", help="Detection: an output box matches an explained one above this IoU.",
        min=0.0, max=1.0)] = 0.5,
    min_score: Annotated[float, typer.Option(
        "--min-score", help="Detection: only detections scoring at least this.", min=0.0,
        max=1.0)] = 0.5,
    metrics: Annotated[str | None, typer.Option(
        "--metrics", help="Score each map: road, deletion, insertion, drop, increase "
        "(comma list) or all.", show_default=False)] = None,
    percentiles: Annotated[str | None, typer.Option(
        "--percentiles", help="ROAD's percentiles, a comma list. [default: 10,20,...,90]",
        show_default=False)] = None,
    fmt: FormatOpt = "table", *, opts: Options,
) -> None:
    """Grad-CAM and its family: which pixels made the model choose a class, segment a class
    or detect a box.

    Writes <stem>.<method>.png (overlay) and <stem>.<method>.heatmap.png into --out.

    Example: hookscope gradcam resnet18 sample_images/*.jpg -m gradcam -m gradcam++ --out out/
    """
    from hookscope.cam import explain
    from hookscope.cam_faithfulness import MetricPlan
    from hookscope.cam_targets import TASKS, infer_task, load_mask
    from hookscope.render.heatmap import CamWriter, check_colormap, output_paths
    from hookscope.render.output import Staging
    from hookscope.targets import parse_targets

    s, layers = opts.s, list(dict.fromkeys(layer or []))
    methods = list(dict.fromkeys(_value(m) for m in method or [])) or ["gradcam"]
    check_colormap(colormap)
    plan = MetricPlan.make(metrics, percentiles) if metrics else None
    region = load_mask(mask) if mask is not None else None
    out = s.output(opts.output, force=opts.force)
    resolved = s.inputs(inputs, opts.model)
    plans = output_paths(resolved.stems, methods, out_dir, save_raw=save_raw, layers=layers,
                         guided=guided)
    s.folder(out_dir, [p for plan_ in plans for f in plan_.values() for p in f.values() if p],
             force=opts.force)
    loaded = s.load(opts.model, "gradcam")
    task = loaded.task if loaded.task in TASKS else infer_task(loaded.model)
    targets = None if target is None and task == "detection" else \
        parse_targets(target, loaded.categories)
    if targets is not None:
        targets.check_count(len(resolved))
    with Staging(out_dir, force=opts.force) as staging, \
            s.progress(len(resolved), "gradcam", enabled=_value(fmt) == "table") as bar:
        writer = CamWriter(staging, plans, loaded, save_raw=save_raw, cmap=colormap, alpha=alpha)
        report = explain(
            loaded.model, s.batches(resolved, loaded, opts.model, keep_images=True),
            layer=layers or None, methods=methods, targets=targets, reshape=_value(reshape),
            score_batch=score_batch, transform=loaded.preprocess, sink=writer, progress=bar,
            output_key=loaded.output_key, autocast=loaded.autocast, task=task, mask=region,
            box_index=box_index or (), iou=iou, min_score=min_score, aug_smooth=aug_smooth,
            eigen_smooth=eigen_smooth, guided=guided, seed=opts.model.seed,
            metrics=plan.names if plan else (), percentiles=plan.percentiles if plan else None)
    writer.log_notes(report.notes)
    doc = loaded.envelope("gradcam", resolved.names) | {
        "layer": report.layer, "layer_default": not layers, "layer_shape": report.layer_shape,
        "methods": methods, "out": str(out_dir), "results": writer.rows,
        "layers": report.layers, "layer_shapes": report.layer_shapes, "task": report.task,
        "aug_smooth": aug_smooth, "eigen_smooth": eigen_smooth, "guided": guided,
        "metrics": writer.metric_means(), "skipped": writer.skipped}
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
    plot: PlotOpt = None, *, opts: Options,
) -> None:
    """Gradient flow: the gradient at each module call's output (backward order) and each
    parameter, with vanishing/exploding flags and the first non-finite module.

    --plot FILE.svg|png draws the gradient flow: log10 of each call's gradient norm in
    backward order, with the vanish and explode thresholds.

    Example: hookscope grads resnet18 cat.jpg --loss ce --label tabby --format json
    """
    from hookscope.grads import GradsProbe, nonfinite_failure

    s, fmt = opts.s, _value(fmt)
    out = s.output(opts.output, force=opts.force)
    plot_out = _plot_output(plot, opts.force)
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
    figure = None
    if plot_out is not None:
        from hookscope.render.plots import gradient_figure, render_plot

        figure = render_plot(gradient_figure(
            doc["layers"], median=report.median_norm, vanish=vanish, explode=explode,
            title=f"{opts.model.name}: gradient flow"), plot_out)
    s.emit("grads", doc, fmt, out, params=params)
    _write_plot(figure, plot_out)
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


# ----------------------------------------------------------------- check


def _check_formats() -> type[Enum]:
    return Enum("CheckFormat", {v: v for v in ("table", "json", "github")},  # type: ignore[return-value]
                type=str)


CheckFormat = _check_formats()
RulesOpt = Annotated[Path | None, typer.Option(
    "--rules", help="A TOML file of rules (keys at its top level: nonfinite, "
    "max_zero_fraction, ignore, baseline, max_mean_drift, max_std_drift, min_prob, [expect]); "
    "each flag below overrides its key.", show_default=False)]
NonfiniteOpt = Annotated[int | None, typer.Option(
    "--nonfinite", help="Most NaN/Inf values allowed in one call's output [default: 0].",
    show_default=False)]
ZeroFractionOpt = Annotated[float | None, typer.Option(
    "--max-zero-fraction", help="Fail a call whose output is more than this fraction zeros "
    "(a dead layer).", show_default=False)]
IgnoreOpt = Annotated[list[str] | None, typer.Option(
    "--ignore", help="Module-name glob left out of the per-call rules, with the modules under "
    "it (repeatable).", metavar="GLOB", show_default=False)]
BaselineOpt = Annotated[Path | None, typer.Option(
    "--baseline", help="A `hookscope stats --format json` document to compare with.",
    show_default=False)]
MeanDriftOpt = Annotated[float | None, typer.Option(
    "--max-mean-drift", help="Largest relative change of a call's mean from the baseline: "
    "|mean - base| / max(|base mean|, base std).", show_default=False)]
StdDriftOpt = Annotated[float | None, typer.Option(
    "--max-std-drift", help="Largest relative change of a call's std from the baseline.",
    show_default=False)]
ExpectOpt = Annotated[list[str] | None, typer.Option(
    "--expect", help="INPUT=LABEL or INPUT=INDEX: the expected top-1 class (repeatable).",
    metavar="INPUT=LABEL", show_default=False)]
MinProbOpt = Annotated[float | None, typer.Option(
    "--min-prob", help="Smallest top-1 probability allowed for any input.",
    show_default=False)]
JunitOpt = Annotated[Path | None, typer.Option(
    "--junit", help="Also write a JUnit XML report (one test case per rule) to this file.",
    metavar="FILE", show_default=False)]
CheckFormatOpt = Annotated[CheckFormat, typer.Option(  # type: ignore[valid-type]
    "--format", "-f", help="table, json (one document), or github (workflow-command "
    "annotations).")]


@app.command("check")
@runs_model
def check_command(
    model: ModelArg, inputs: InputsArg, rules: RulesOpt = None, nonfinite: NonfiniteOpt = None,
    max_zero_fraction: ZeroFractionOpt = None, ignore: IgnoreOpt = None,
    baseline: BaselineOpt = None, max_mean_drift: MeanDriftOpt = None,
    max_std_drift: StdDriftOpt = None, expect: ExpectOpt = None, min_prob: MinProbOpt = None,
    junit: JunitOpt = None, layers: LayersOpt = None, types: TypesOpt = None,
    all_modules: AllModulesOpt = False, max_depth: MaxDepthOpt = None,
    fmt: CheckFormatOpt = "table", *, opts: Options,
) -> None:
    """Assert rules about one run: non-finite values, dead layers, drift from a baseline,
    expected classes. Exit 0 when every rule passes, 1 when one fails, 2 for bad rules.

    Example: hookscope check resnet18 sample_images/ --rules hookscope.toml --junit check.xml
    """
    from hookscope.check import evaluate, expectations, load_baseline, load_rules, match_inputs
    from hookscope.errors import CheckFailed
    from hookscope.render.check import resolve_junit, write_github, write_junit
    from hookscope.stats import StatsProbe

    s, fmt = opts.s, _value(fmt)
    out = s.output(opts.output, force=opts.force)
    junit_out = resolve_junit(junit, opts.output, force=opts.force)
    checks = load_rules(rules, {
        "nonfinite": nonfinite, "max_zero_fraction": max_zero_fraction, "ignore": ignore,
        "baseline": baseline, "max_mean_drift": max_mean_drift, "max_std_drift": max_std_drift,
        "expect": expect, "min_prob": min_prob})
    base = load_baseline(checks)
    resolved = s.inputs(inputs, opts.model)
    matched = match_inputs(checks, resolved.names)
    loaded = s.load(opts.model, "check")
    expected = expectations(matched, loaded.categories, loaded.num_classes)
    probe = StatsProbe(loaded.model, layers=layers, types=types, all_modules=all_modules,
                       max_depth=max_depth, categories=loaded.categories,
                       output_key=loaded.output_key)
    with s.progress(len(resolved), "check", enabled=fmt == "table" or not out.is_stdout) as bar:
        stats_report = s.drive(loaded, s.batches(resolved, loaded, opts.model), probe,
                               progress=bar)
    report = evaluate(checks, stats_report, inputs=resolved.names, baseline=base,
                      expectations=expected)
    doc = loaded.envelope("check", resolved.names) | report.to_dict()
    if junit_out is not None:
        write_junit(junit_out, doc)
    if fmt == "github":
        write_github(out, doc)
    else:
        s.emit("check", doc, fmt, out)
    if not report.passed:
        raise CheckFailed(report.summary())


# ----------------------------------------------------------------- diff


@app.command("diff")
@runs_model
def diff_command(
    model: Annotated[str, typer.Argument(
        help="As in every command; or a saved `stats --format json` document for an offline "
        "diff (then INPUT is the other document).", metavar="MODEL", show_default=False)],
    inputs: InputsArg,
    against_weights: Annotated[str | None, typer.Option(
        "--against-weights", help="The second run's --weights (a checkpoint, none, DEFAULT...).",
        show_default=False)] = None,
    against_dtype: Annotated[str | None, typer.Option(
        "--against-dtype", help="The second run's --dtype: float32, float16 or bfloat16.",
        show_default=False)] = None,
    against_autocast: Annotated[bool | None, typer.Option(
        "--against-autocast/--against-no-autocast", help="The second run with (or without) "
        "torch.autocast.", show_default=False)] = None,
    against_device: Annotated[str | None, typer.Option(
        "--against-device", help="The second run's --device.", show_default=False)] = None,
    against_model: Annotated[str | None, typer.Option(
        "--against-model", help="Another model whose module names match; calls are paired by "
        "name and call index.", metavar="NAME", show_default=False)] = None,
    tolerance: Annotated[float, typer.Option(
        "--tolerance", help="Relative L2 error ||a-b||/||a|| above which a call differs; the "
        "first such call is where the runs part.", min=0.0)] = 1e-3,
    fail: Annotated[bool, typer.Option(
        "--fail", help="Exit with code 1 when a call exceeds --tolerance (or its shape or "
        "non-finite count differs) or a top-1 prediction differs.")] = False,
    layers: LayersOpt = None, types: TypesOpt = None, all_modules: AllModulesOpt = False,
    max_depth: MaxDepthOpt = None, fmt: FormatOpt = "table", *, opts: Options,
) -> None:
    """Two runs of the same inputs compared call by call: max |a-b|, relative L2 error, cosine;
    the first call where they part; top-1 agreement and KL of the outputs.

    The second run is MODEL with each --against-* option replaced. `diff a.json b.json`
    compares two saved `stats` documents instead.

    Example: hookscope diff resnet18 cat.jpg --weights a.pt --against-weights b.pt --fail
    """
    from hookscope.diff import (
        DiffProbe,
        DiffReport,
        StatsDiffReport,
        against_options,
        describe_against,
        diff_stats,
        offline_files,
        read_stats,
    )

    s, fmt = opts.s, _value(fmt)
    against = {"against_model": against_model, "against_weights": against_weights,
               "against_dtype": against_dtype, "against_autocast": against_autocast,
               "against_device": against_device}
    out = s.output(opts.output, force=opts.force)
    files = offline_files(model, inputs, against)
    report: DiffReport | StatsDiffReport
    if files is not None:
        report = diff_stats(read_stats(files[0]), read_stats(files[1]), tolerance=tolerance,
                            files=files)
        doc = report.to_dict()
    else:
        other_options = against_options(opts.model, against)
        resolved = s.inputs(inputs, opts.model)
        loaded = s.load(opts.model, "diff")
        other = s.load(other_options, "diff")
        probe = DiffProbe(loaded.model, other.model, layers=layers, types=types,
                          all_modules=all_modules, max_depth=max_depth, tolerance=tolerance,
                          output_key=loaded.output_key, other_output_key=other.output_key,
                          other_autocast=other.autocast)
        with s.progress(len(resolved), "diff", enabled=fmt == "table" or not out.is_stdout) as bar:
            report = s.drive(loaded, s.batches(resolved, loaded, opts.model), probe,
                             progress=bar)
        doc = loaded.envelope("diff", resolved.names) | {"against": describe_against(other)} \
            | report.to_dict()
    s.emit("diff", doc, fmt, out)
    if fail and report.failed:
        raise report.failure()


# ----------------------------------------------------------------- report, --plot


@app.command("report")
@runs_model
def report_command(
    model: ModelArg, inputs: InputsArg,
    layers: LayersOpt = None, types: TypesOpt = None, all_modules: AllModulesOpt = False,
    max_depth: MaxDepthOpt = None, target: TargetOpt = None,
    loss: Annotated[GradLoss, typer.Option(  # type: ignore[valid-type]
        "--loss", help="Gradient flow of: logit (the target logit summed over inputs) or ce "
        "(cross-entropy against --label).")] = "logit",
    label: Annotated[str | None, typer.Option(
        "--label", help="With --loss ce: the true class (index or label), one for all inputs "
        "or a comma list, one per input.", show_default=False)] = None,
    vanish: Annotated[float, typer.Option(
        help="Flag calls whose gradient norm is below this factor times the median call's.",
        min=0.0)] = 1e-3,
    explode: Annotated[float, typer.Option(
        help="Flag calls whose gradient norm is above this factor times the median call's.",
        min=0.0)] = 1e3,
    layer: Annotated[str | None, typer.Option(
        "--layer", help="Grad-CAM's layer (dotted name); default: the last module with a "
        "spatial output.", show_default=False)] = None,
    method: Annotated[list[CamMethod] | None, typer.Option(  # type: ignore[valid-type]
        "--method", "-m", help="CAM method (repeatable); gradcam is always shown first.",
        show_default=False)] = None,
    reshape: Annotated[Reshape, typer.Option(  # type: ignore[valid-type]
        help="Token outputs to a grid for Grad-CAM: auto, none, vit or swin.")] = "auto",
    colormap: Annotated[str, typer.Option(help="A matplotlib colormap name.")] = "jet",
    alpha: Annotated[float, typer.Option(help="Heatmap weight in the overlay.", min=0.0,
                                         max=1.0)] = 0.5,
    score_batch: Annotated[int, typer.Option(
        "--score-batch", help="Masked inputs per forward pass (scorecam).", min=1)] = 32,
    train_mode: TrainModeOpt = False, *, opts: Options,
) -> None:
    """One self-contained HTML page: the run's header, activation profile, gradient flow,
    statistics table, Grad-CAM per input and findings. It loads nothing when opened.

    Runs stats and grads (with --layers, --type, --target, --loss...) and Grad-CAM (the
    default method plus each --method, at --layer) over the inputs; -o names the page.

    Example: hookscope report resnet18 sample_images/ -o report.html
    """
    from hookscope.render.heatmap import check_colormap
    from hookscope.render.report import write_report
    from hookscope.report import ReportOptions, build_report

    s = opts.s
    methods = list(dict.fromkeys(["gradcam", *(_value(m) for m in method or [])]))
    check_colormap(colormap)
    out = s.output(opts.output, force=opts.force)
    resolved = s.inputs(inputs, opts.model)
    loaded = s.load(opts.model, "gradcam")  # Grad-CAM and grads need an image classifier
    options = ReportOptions(
        layers=layers, types=types, all_modules=all_modules, max_depth=max_depth,
        target=target, loss=_value(loss), label=label, vanish=vanish, explode=explode,
        layer=layer, methods=methods, reshape=_value(reshape), score_batch=score_batch,
        train_mode=train_mode)
    with s.progress(3 * len(resolved), "report", enabled=True) as bar:
        report = build_report(
            loaded, lambda: s.batches(resolved, loaded, opts.model, keep_images=True),
            resolved.names, options, progress=bar)
    write_report(report, out, cmap=colormap, alpha=alpha)


def _plot_output(plot: Path | None, force: bool) -> Output | None:
    """Where ``--plot`` goes, checked before the model loads (its suffix too)."""
    from hookscope.render.plots import plot_output

    return plot_output(plot, force=force) if plot is not None else None


def _write_plot(figure: bytes | None, where: Output | None) -> None:
    """Write a rendered ``--plot`` figure (after the data: all of it or nothing)."""
    if figure is not None and where is not None:
        from hookscope.render.plots import write_plot

        write_plot(figure, where)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
