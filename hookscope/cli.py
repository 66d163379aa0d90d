"""The ``hookscope`` command line: options in, then source, probe, drive, emit.

Each command only wires the library together (errors, outputs and progress are
:mod:`hookscope.session`'s). torch and Rich are imported inside the commands, so
``hookscope --help`` does not load them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hookscope import __version__, cli_watch
from hookscope import options as o
from hookscope.core.select import LEAVES
from hookscope.options import command, runs_model
from hookscope.session import Session

if TYPE_CHECKING:
    from hookscope.probes.diff import DiffReport

app = o.App(
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


@app.command()
@runs_model
def stats(
    model: o.ModelArg, inputs: o.InputsArg, select: o.Select = LEAVES,
    input_stats: o.StatsInputStatsOpt = False, per_channel: o.StatsPerChannelOpt = False,
    percentiles: o.StatsPercentilesOpt = None, train_mode: o.TrainModeOpt = False,
    fmt: o.FormatOpt = "table", plot: o.PlotOpt = None, *, s: Session,
) -> None:
    """Per-layer output statistics: shapes, mean, std, min, max, zeros, non-finite values.

    --plot FILE.svg|png draws the activation profile: mean ± std, min/max and the zero
    fraction per call, non-finite calls red, dead ones yellow.

    Example: hookscope stats resnet18 cat.jpg --format json | jq '.layers[] | select(.nonfinite > 0)'
    """
    from hookscope.core.logits import warn_nonfinite_logits
    from hookscope.numerics.sketch import parse_percentiles, percentile_key
    from hookscope.probes.stats import StatsProbe
    from hookscope.render.views import emit_plot

    wanted = parse_percentiles(percentiles)
    plot_out = s.plot_output(plot)
    resolved = s.inputs(inputs)
    loaded = s.load("stats")
    probe = StatsProbe(loaded.model, select=select, input_stats=input_stats,
                       categories=loaded.categories, output_key=loaded.output_key,
                       per_channel=per_channel, percentiles=wanted)
    report = s.run(loaded, resolved, probe, "stats", shown=s.shown(fmt), train_mode=train_mode)
    warn_nonfinite_logits(report.predictions, "prediction")
    doc = loaded.envelope("stats", resolved.names) | report.to_dict()
    s.emit("stats", doc, fmt, input_stats=input_stats, per_channel=per_channel,
           percentiles=tuple(percentile_key(p) for p in wanted))
    emit_plot("stats", doc, plot_out)


@app.command("models")
@command
def models_command(
    pattern: o.ModelsPatternOpt = None, task: o.ModelsTaskOpt = None,
    source: o.ModelsSourceOpt = "torchvision", fmt: o.FormatOpt = "table", *, s: Session,
) -> None:
    """List the models hookscope can load by name, with their task and weights.

    Example: hookscope models 'resnet*' --format json | jq -r '.models[].name'
    (hookscope models --source hf ./checkpoints lists the Hugging Face folders there)
    """
    from hookscope.catalog import find_hf_models, find_models, find_timm_models
    from hookscope.core.files import envelope

    found = {"timm": find_timm_models, "hf": find_hf_models}.get(source, find_models)(pattern, task)
    doc = envelope("models", pattern=pattern, task=task, source=source,
                   models=[m.to_dict() for m in found])
    s.emit("models", doc, fmt)


@app.command("layers")
@runs_model
def layers_command(
    model: o.ModelArg, input_: o.LayersInputOpt = None, max_depth: o.MaxDepthOpt = None,
    no_forward: o.LayersNoForwardOpt = False, train_mode: o.TrainModeOpt = False,
    fmt: o.FormatOpt = "table", *, s: Session,
) -> None:
    """The module tree: names, types, own and total parameters, trainable, output shape per call.

    Every name shown works in --layers and --layer of the other commands.

    Example: hookscope layers resnet18 --max-depth 2 --weights none
    (hookscope layers model.py:Net --no-forward lists parameters without running the model)
    """
    import logging

    from hookscope.core.arguments import take
    from hookscope.core.errors import HookscopeError, param
    from hookscope.core.run import peek
    from hookscope.probes.structure import model_structure

    given = [input_] if input_ is not None else []
    reads = bool(given) or s.model.data is not None  # INPUT, or --data's first item
    if no_forward and (reads or train_mode):
        what = "takes no INPUT" if reads else f"has no use for {param('train_mode')}"
        raise HookscopeError(f"{param('no_forward')} runs no forward pass, so it {what}.")
    resolved = s.inputs(given) if reads else None
    loaded = s.load("layers")
    # Train mode runs two samples: BatchNorm needs more than one value per channel.
    batch = 2 if train_mode else 1
    example = None if no_forward else loaded.dummy_input(batch)
    if resolved is not None:
        first = peek(s.batches(resolved, loaded))[0]  # a file read --as-is is one item
        example = first.tensor if len(first) <= batch else take(first.tensor, slice(0, batch))
    if no_forward:
        logging.getLogger("hookscope").info("no forward pass (--no-forward): shapes and MACs "
                                            "are not measured")
    found = model_structure(loaded.model, example, max_depth=max_depth, autocast=loaded.autocast,
                            train_mode=train_mode)
    named = given or (resolved.names[:1] if resolved is not None else [])
    doc = loaded.envelope("layers", named) | found.to_dict()
    s.emit("layers", doc, fmt)


@app.command("debug")
@runs_model
def debug_command(
    model: o.ModelArg, inputs: o.InputsArg, select: o.Select = LEAVES,
    fail_on_nonfinite: o.FailOpt = False, train_mode: o.TrainModeOpt = False,
    fmt: o.DebugFmtOpt = "text", *, s: Session,
) -> None:
    """Trace the forward pass; report the first non-finite output and the module that crashed.

    Each selected module call prints an enter line (input shapes) and an exit line (output
    shape, mean and std). Exit code 1: the forward pass raised, or, with
    --fail-on-nonfinite, NaN or Inf appeared.

    Example: hookscope debug resnet18 cat.jpg --weights ckpt.pt --format ndjson --fail-on-nonfinite
    """
    from hookscope.probes.debug import DebugProbe, nonfinite_failure
    from hookscope.render.tree import TraceWriter

    resolved = s.inputs(inputs)
    loaded = s.load("debug")
    envelope = loaded.envelope("debug", resolved.names)
    writer = TraceWriter(fmt, s.out, envelope)
    streams = s.out.is_stdout and fmt != "json"  # the one exception to emit: see TraceWriter
    live = streams and s.group.size == 1  # under torchrun: written once the ranks' are merged
    probe = DebugProbe(loaded.model, select=select, record=not live,
                       on_event=(lambda event: writer.event(event.to_dict())) if live else None)
    report = s.run(loaded, resolved, probe, "debug", shown=False, train_mode=train_mode)
    doc = report.document(envelope)
    if streams:
        for event in doc["events"]:  # recorded only under torchrun
            writer.event(event)
        writer.summary(doc["summary"])
    elif s.out.is_stdout or report.failure is None:  # a failed run leaves no file
        s.emit("debug", doc, fmt)
    if report.failure is not None:
        raise report.failure
    if fail_on_nonfinite and report.origin is not None:
        raise nonfinite_failure(report.origin)


@app.command()
@runs_model
def gradcam(
    model: o.ModelArg, inputs: o.InputsArg, layer: o.CamLayerOpt = None,
    method: o.CamMethodOpt = None, target: o.TargetOpt = None,
    out_dir: o.OutDirOpt = Path("hookscope-out"), colormap: o.CamColormapOpt = "jet",
    alpha: o.CamAlphaOpt = 0.5, save_raw: o.CamSaveRawOpt = False,
    cam: o.CamOptionsOpt = o.BUNDLED, fmt: o.FormatOpt = "table", *, s: Session,
) -> None:
    """Grad-CAM and its family: which pixels made the model choose a class, segment a class
    or detect a box.

    Writes <stem>.<method>.png (overlay) and <stem>.<method>.heatmap.png into --out.

    Example: hookscope gradcam resnet18 sample_images/*.jpg -m gradcam -m gradcam++ --out out/
    """
    from dataclasses import replace

    from hookscope.cam.faithfulness import MetricPlan
    from hookscope.cam.probe import CamOptions, explain
    from hookscope.cam.targets import load_mask, task_targets
    from hookscope.core.files import Staging
    from hookscope.render.heatmap import CamWriter, check_colormap, output_paths

    layers = list(dict.fromkeys(layer or []))
    check_colormap(colormap)
    if cam["metrics"]:  # refused before the model loads
        MetricPlan.make(cam["metrics"], cam["percentiles"])
    mask, boxes = cam.pop("mask"), cam.pop("box_index")
    options = CamOptions(methods=list(dict.fromkeys(method or [])) or ["gradcam"],
                         mask=load_mask(mask) if mask is not None else None,
                         box_index=boxes or (), seed=s.model.load.seed, **cam)
    resolved = s.inputs(inputs)
    plans = output_paths(resolved.stems, options.methods, out_dir, save_raw=save_raw,
                         layers=layers, guided=options.guided)
    s.folder(out_dir, [p for plan in plans for f in plan.values() for p in f.values() if p])
    loaded = s.load("gradcam")
    task, targets = task_targets(loaded, target, len(resolved))
    with Staging(out_dir, force=s.force) as staging, \
            s.progress(len(resolved), "gradcam", enabled=fmt == "table") as bar:
        writer = CamWriter(staging, plans, loaded, save_raw=save_raw, cmap=colormap, alpha=alpha)
        report = explain(
            loaded.model, s.batches(resolved, loaded, keep_images=True),
            replace(options, targets=targets, task=task, output_key=loaded.output_key),
            layer=layers or None, transform=loaded.preprocess, sink=writer, progress=bar,
            autocast=loaded.autocast)
    writer.log_notes(report.notes)
    doc = loaded.envelope("gradcam", resolved.names) | writer.document(
        report, out=out_dir, layer_default=not layers)
    s.emit("gradcam", doc, fmt)


@app.command()
@runs_model
def attribute(
    model: o.ModelArg, inputs: o.InputsArg, method: o.AttrMethodOpt = None,
    target: o.TargetOpt = None, out_dir: o.OutDirOpt = Path("hookscope-out"),
    attr: o.AttrOptionsOpt = o.BUNDLED, colormap: o.CamColormapOpt = "jet", alpha: o.CamAlphaOpt = 0.5,
    save_raw: o.AttrSaveRawOpt = False, metrics: o.CamMetricsOpt = None,
    percentiles: o.CamPercentilesOpt = None, box_index: o.CamBoxIndexOpt = None,
    iou: o.CamIouOpt = 0.5, min_score: o.CamMinScoreOpt = 0.5, fmt: o.FormatOpt = "table", *,
    s: Session,
) -> None:
    """Pixel attributions: saliency, input x gradient, integrated gradients, SmoothGrad,
    occlusion, guided backpropagation and DeepLift (captum's definitions).

    Writes <stem>.<method>.png (overlay) and <stem>.<method>.heatmap.png into --out;
    --metrics scores each overlay's map as gradcam --metrics scores a CAM.

    Example: hookscope attribute resnet18 cat.jpg -m integrated-gradients -m occlusion --out out/
    """
    from dataclasses import replace

    from hookscope.cam.attribution import AttributionProbe, attr_options
    from hookscope.cam.targets import task_targets
    from hookscope.core.files import Staging
    from hookscope.render.attrview import AttrWriter
    from hookscope.render.heatmap import check_colormap, output_paths

    methods = list(dict.fromkeys(method or [])) or ["saliency"]
    check_colormap(colormap)
    options = attr_options(methods, seed=s.model.load.seed, metrics=metrics,
                           percentiles=percentiles, box_index=box_index or (), iou=iou,
                           min_score=min_score, **attr)
    s.reading([options.baseline], "the baseline file")
    resolved = s.inputs(inputs)
    plans = output_paths(resolved.stems, methods, out_dir, save_raw=save_raw)
    s.folder(out_dir, [p for plan in plans for f in plan.values() for p in f.values() if p])
    loaded = s.load("gradcam")  # an image model with logits, as Grad-CAM
    task, targets = task_targets(loaded, target, len(resolved))
    with Staging(out_dir, force=s.force) as staging, \
            s.progress(None, "attribute", enabled=s.shown(fmt)) as bar:
        writer = AttrWriter(staging, plans, loaded, save_raw=save_raw, cmap=colormap,
                            alpha=alpha)
        probe = AttributionProbe(loaded.model, replace(options, targets=targets, task=task,
                                 output_key=loaded.output_key), transform=loaded.preprocess,
                                 sink=writer, n_inputs=len(resolved))
        s.drive(loaded, s.batches(resolved, loaded, keep_images=True), probe, progress=bar)
    doc = loaded.envelope("attribute", resolved.names) | writer.document(methods, options,
                                                                          out_dir)
    s.emit("attribute", doc, fmt)


@app.command()
@runs_model
def grads(
    model: o.ModelArg, inputs: o.InputsArg, target: o.TargetOpt = None,
    loss: o.GradsLossOpt = "logit", label: o.GradsLabelOpt = None, vanish: o.GradsVanishOpt = 1e-3,
    explode: o.GradsExplodeOpt = 1e3, fail_on_nonfinite: o.FailOpt = False,
    params: o.GradsParamsOpt = True, select: o.Select = LEAVES,
    train_mode: o.TrainModeOpt = False, fmt: o.FormatOpt = "table", plot: o.PlotOpt = None, *,
    s: Session,
) -> None:
    """Gradient flow: the gradient at each module call's output (backward order) and each
    parameter, with vanishing/exploding flags and the first non-finite module.

    --plot FILE.svg|png draws the gradient flow: log10 of each call's gradient norm in
    backward order, with the vanish and explode thresholds.

    Example: hookscope grads resnet18 cat.jpg --loss ce --label tabby --format json
    """
    from hookscope.core.classes import true_classes
    from hookscope.probes.grads import GradsProbe, nonfinite_failure
    from hookscope.render.views import emit_plot

    plot_out = s.plot_output(plot)
    resolved = s.inputs(inputs)
    loaded = s.load("grads")
    folders = resolved.labels if loss == "ce" and label is None else None  # --data reads items
    truth = label if folders is None else true_classes(None, folders, loaded.categories)
    probe = GradsProbe(loaded.model, target=target, loss=loss, label=truth, select=select,
                       vanish=vanish, explode=explode, categories=loaded.categories,
                       n_inputs=len(resolved), output_key=loaded.output_key)
    report = s.run(loaded, resolved, probe, "grads", shown=s.shown(fmt), train_mode=train_mode)
    doc = loaded.envelope("grads", resolved.names) | report.to_dict()
    s.emit("grads", doc, fmt, params=params)
    emit_plot("grads", doc, plot_out, vanish=vanish, explode=explode)
    if fail_on_nonfinite and report.nonfinite:
        raise nonfinite_failure(report)


@app.command()
@runs_model
def features(
    model: o.ModelArg, inputs: o.InputsArg, layers: o.FeaturesLayersOpt = None,
    types: o.TypesOpt = None, out_dir: o.FeaturesOutDirOpt = Path("hookscope-out"),
    tensorboard: o.FeaturesTensorboardOpt = None, max_channels: o.FeaturesMaxChannelsOpt = 64,
    order: o.FeaturesOrderOpt = "index", upsample: o.FeaturesUpsampleOpt = False,
    fmt: o.FormatOpt = "table", *, s: Session,
) -> None:
    """Feature maps as image grids: one PNG per selected layer and input, optionally to
    TensorBoard too.

    Example: hookscope features resnet18 cat.jpg --type Conv2d --out maps/ --tensorboard runs/
    """
    from hookscope.core.files import Staging
    from hookscope.probes.features import FeaturesProbe, feature_sites, output_name
    from hookscope.render.features import GridWriter, require_tensorboard

    if tensorboard is not None:
        require_tensorboard()
    resolved = s.inputs(inputs)
    loaded = s.load("features")
    sites = feature_sites(loaded.model, layers, types)
    stems = resolved.stems
    s.folder(out_dir, [out_dir / output_name(stem, site.name) for stem in stems for site in sites])
    with Staging(out_dir, force=s.force) as staging, \
            GridWriter(staging, out_dir, tensorboard) as writer, \
            s.progress(len(resolved) * len(sites), "features", enabled=fmt == "table") as bar:
        probe = FeaturesProbe(sites, sink=writer.add, max_channels=max_channels, order=order,
                              upsample=upsample, stems=stems)
        report = s.drive(loaded, s.batches(resolved, loaded), probe,
                         progress=lambda n: bar(n * len(sites)))
    doc = loaded.envelope("features", resolved.names) | report.document(out_dir, tensorboard)
    s.emit("features", doc, fmt)


@app.command()
@runs_model(input_channels=o.InputChannelsOnly)
def ablate(
    model: o.ModelArg, inputs: o.InputsArg, layer: o.AblateLayerOpt,
    channels: o.AblateChannelsOpt = None, sweep: o.AblateSweepOpt = False,
    mode: o.AblateModeOpt = "zero", target: o.TargetOpt = None,
    sweep_batch: o.AblateSweepBatchOpt = 32, call: o.AblateCallOpt = None,
    channel_dim: o.AblateChannelDimOpt = 1, top: o.AblateTopOpt = 10, fmt: o.FormatOpt = "table", *,
    s: Session,
) -> None:
    """Feature modification: change channels of a layer's output and compare the top-5
    predictions, the target's logit and probability, and the KL divergence.

    Example: hookscope ablate resnet18 cat.jpg --layer layer4 --sweep --format json
    """
    from hookscope.core.logits import warn_nonfinite_logits
    from hookscope.probes.ablate import AblateProbe, one_layer, parse_mode

    parsed = parse_mode(mode, processes=s.group.size)
    resolved = s.inputs(inputs)
    loaded = s.load("ablate")
    probe = AblateProbe(loaded.model, one_layer(layer), channels=channels, mode=parsed, target=target,
                        seed=s.model.load.seed, channel_dim=channel_dim, call=call, sweep=sweep,
                        categories=loaded.categories, sweep_batch=sweep_batch,
                        n_inputs=len(resolved), output_key=loaded.output_key)
    report = s.run(loaded, resolved, probe, "sweep" if sweep else "ablate", shown=s.shown(fmt))
    warn_nonfinite_logits([None if r.before is None or r.after is None else r.before
                           for r in report.results], "top-5 (before or after)")
    doc = loaded.envelope("ablate", resolved.names) | report.to_dict()
    s.emit("ablate", doc, fmt, top=top, sweep=sweep)


@app.command("check")
@runs_model
def check_command(
    model: o.ModelArg, inputs: o.LogInputsArg = None, rules: o.RulesOpt = None,
    overrides: o.RuleFlags = o.BUNDLED, junit: o.JunitOpt = None, select: o.Select = LEAVES,
    fmt: o.CheckFormatOpt = "table", *, s: Session,
) -> None:
    """Assert rules about one run: non-finite values, dead layers, drift from a baseline,
    expected classes. Exit 0 when every rule passes, 1 when one fails, 2 for bad rules.

    A training log (a directory holding watch.jsonl) in place of MODEL INPUT checks the
    run it logged: its non-finite stop, dead layers, gradient norms and update ratios.

    Example: hookscope check resnet18 sample_images/ --rules hookscope.toml --junit check.xml
    """
    from hookscope.checks.rulefile import load_rules
    from hookscope.core.errors import CheckFailed
    from hookscope.render.check import resolve_junit

    log_run = cli_watch.is_log_run(s, model, inputs)
    junit_out = resolve_junit(junit, s.path, force=s.force)
    checks = load_rules(rules, overrides, "log" if log_run else "run")
    if log_run:
        from hookscope.checks.log import evaluate_log, log_doc
        from hookscope.training.log_reader import read_log

        log = read_log(model)
        report = evaluate_log(checks, log)
        doc = log_doc(log, report)
    else:  # the rules over a stats run
        from hookscope.checks import engine as check
        from hookscope.checks.baseline import drift_percentiles, load_baseline
        from hookscope.probes.stats import StatsProbe

        checks = checks.only("run")
        base = load_baseline(checks)
        resolved = s.inputs(inputs or [])
        matched = check.match_inputs(checks, resolved.names)
        loaded = s.load("check")  # before the labels: --data's label rule reads its forward
        if not checks.expect and resolved.labels is not None:  # an ImageFolder: its classes
            checks, matched = check.folder_expectations(checks, resolved.names, resolved.labels)
        expected = check.expectations(matched, loaded.categories, loaded.num_classes)
        probe = StatsProbe(loaded.model, select=select, categories=loaded.categories,
                           output_key=loaded.output_key, percentiles=drift_percentiles(checks, base))
        stats_report = s.run(loaded, resolved, probe, "check", shown=s.shown(fmt))
        report = check.evaluate(checks, stats_report, inputs=resolved.names, baseline=base,
                                expectations=expected)
        doc = loaded.envelope("check", resolved.names) | report.to_dict()
    if junit_out is not None:
        s.emit("check", doc, "junit", junit_out)
    s.emit("check", doc, fmt)
    if not report.passed:
        raise CheckFailed(report.summary())


@app.command("diff")
@runs_model
def diff_command(
    model: o.DiffModelOpt, inputs: o.InputsArg, against: o.Against,
    tolerance: o.DiffToleranceOpt = 1e-3, fail: o.DiffFailOpt = False, select: o.Select = LEAVES,
    fmt: o.FormatOpt = "table", *, s: Session,
) -> None:
    """Two runs of the same inputs compared call by call: max |a-b|, relative L2 error, cosine;
    the first call where they part; top-1 agreement and KL of the outputs.

    The second run is MODEL with each --against-* option replaced. `diff a.json b.json`
    compares two saved `stats` documents instead.

    Example: hookscope diff resnet18 cat.jpg --weights a.pt --against-weights b.pt --fail
    """
    from hookscope.checks.baseline import read_stats
    from hookscope.probes.statsdiff import StatsDiffReport, diff_stats
    from hookscope.session import AGAINST, against_options, offline_files

    files = offline_files(model, inputs, against)
    s.reading(files or ())
    report: StatsDiffReport | DiffReport
    if files is not None:  # two saved documents: torch is never imported
        report = diff_stats(read_stats(files[0]).doc, read_stats(files[1]).doc,
                            tolerance=tolerance, files=files)
        doc = report.to_dict()
    else:
        from hookscope.probes.diff import DiffProbe, on_side

        other_options = against_options(s.model, against)
        resolved = s.inputs(inputs)
        with on_side("A"):
            loaded = s.load("diff")
        with on_side("B", AGAINST):
            other = s.load("diff", other_options)
        probe = DiffProbe(loaded.model, other.model, select=select, tolerance=tolerance,
                          output_key=loaded.output_key, other_output_key=other.output_key,
                          other_autocast=other.autocast)
        report = s.run(loaded, resolved, probe, "diff", shown=s.shown(fmt))
        side_b = other.envelope("diff", [])  # what side B ran
        against_doc = {k: side_b[k] for k in ("model", "weights", "device", "source", "precision")}
        doc = loaded.envelope("diff", resolved.names) | {"against": against_doc} | report.to_dict()
    s.emit("diff", doc, fmt)
    if fail and report.failed:
        raise report.failure()


@app.command("report")
@runs_model
def report_command(
    model: o.ModelArg, inputs: o.LogInputsArg = None, select: o.Select = LEAVES,
    target: o.TargetOpt = None, loss: o.ReportLossOpt = "logit", label: o.GradsLabelOpt = None,
    vanish: o.GradsVanishOpt = 1e-3, explode: o.GradsExplodeOpt = 1e3,
    layer: o.ReportLayerOpt = None, method: o.ReportMethodOpt = None,
    reshape: o.ReportReshapeOpt = "auto", colormap: o.CamColormapOpt = "jet",
    alpha: o.CamAlphaOpt = 0.5, score_batch: o.ReportScoreBatchOpt = 32,
    attribution: o.ReportAttributionOpt = "saliency", train_mode: o.TrainModeOpt = False, *,
    s: Session,
) -> None:
    """One self-contained HTML page: the run's header, activation profile, gradient flow,
    statistics table, Grad-CAM per input and findings. It loads nothing when opened.

    Runs stats and grads (with --layers, --type, --target, --loss...) and Grad-CAM (the
    default method plus each --method, at --layer) over the inputs, and draws the
    --attribution beside the CAMs; -o names the page.
    A segmentation model's or detector's page leaves the gradients out (no class logits).
    A training log (a directory holding watch.jsonl) in place of MODEL INPUT draws the
    training page: statistics and gradient norms over the steps, update ratios, findings.

    Example: hookscope report resnet18 sample_images/ -o report.html
    """
    if cli_watch.is_log_run(s, model, inputs):
        from hookscope.training.log_reader import read_log

        return s.emit("training", read_log(model), "html")
    from hookscope.render.heatmap import check_colormap
    from hookscope.report import ReportOptions, build_report, left_out

    methods = list(dict.fromkeys(["gradcam", *(method or [])]))
    check_colormap(colormap)
    resolved = s.inputs(inputs or [])
    loaded = s.load("gradcam")  # Grad-CAM and grads need an image classifier
    options = ReportOptions(
        select=select, target=target, loss=loss, label=label, vanish=vanish, explode=explode,
        layer=layer, methods=methods, reshape=reshape, score_batch=score_batch,
        train_mode=train_mode, attribution=attribution)
    sections = 4 - len(left_out(loaded.task))
    with s.progress(sections * len(resolved), "report", enabled=True) as bar:
        report = build_report(
            loaded, lambda: s.batches(resolved, loaded, keep_images=True),
            resolved.names, options, progress=bar)
    s.emit("report", report, "html", cmap=colormap, alpha=alpha)


app.command("watch")(cli_watch.watch_command)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
