"""The command line's shared options, declared once, and the decorators that add them.

:func:`runs_model` and :func:`command` add them and hand the command a
:class:`~hookscope.session.Session` that holds them. Torch-free, so ``--help`` stays fast.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

from hookscope.cam.attrmethods import attribution_names  # torch-free: only the registry
from hookscope.cam.methods import method_names  # torch-free: only the registry
from hookscope.checks.rulefile import KEYS, key_names
from hookscope.core.load_options import InputOptions, LoadOptions
from hookscope.core.select import Selection
from hookscope.session import session

# ----------------------------------------------------------------- help in the CLI's words

#: Typer shows Python's types (``<list[str]>``, ``<int range>``); help shows these instead.
_WORDS = {"str": "TEXT", "int": "N", "int range": "N", "float": "NUMBER",
          "float range": "NUMBER", "file": "FILE", "directory": "DIR", "path": "PATH"}


def _word(shown: str) -> str:
    """Typer's ``<list[str]>`` as ``TEXT``, ``<table|json>`` as ``[table|json]``."""
    inner = shown.strip("<>").removeprefix("list[").removesuffix("]")
    return _WORDS.get(inner, f"[{inner}]" if "|" in inner else inner.upper())


# Both rewrite what click's public Parameter API returns, so a typer that renders otherwise
# still gets its own help (test_help_speaks_the_command_line_not_python notices).
class _PlainOption(typer.core.TyperOption):
    def get_help_record(self, ctx: Any) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        names, typed, shown = record[0].partition(" <") if record else ("", "", "")
        if record is None or not typed or self.metavar is not None:
            return record
        return f"{names} {_word('<' + shown)}", record[1]  # "-l, --layers <list[str]>"


class _PlainArgument(typer.core.TyperArgument):
    def get_help_record(self, ctx: Any) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)  # "MODEL <str>": its metavar alone says it
        return None if record is None else (self._shown(), record[1])

    def get_usage_pieces(self, ctx: Any) -> list[str]:
        name = self._shown()
        name = name if self.nargs == 1 or name.endswith("...") else f"{name}..."
        return [name if self.required else f"[{name}]"]

    def _shown(self) -> str:
        return self.metavar or str(self.name)


class PlainHelpCommand(typer.core.TyperCommand):
    """A command whose help says ``--layers TEXT`` and ``MODEL INPUT...``, not Python's
    ``<list[str]>`` and ``{MODEL} {INPUT...}...``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if type(p) is typer.core.TyperOption:
                p.__class__ = _PlainOption
            elif type(p) is typer.core.TyperArgument:
                p.__class__ = _PlainArgument


class App(typer.Typer):
    """The app: every command's help in the CLI's words (:class:`PlainHelpCommand`)."""

    def command(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs.setdefault("cls", PlainHelpCommand)
        return super().command(*args, **kwargs)


def _choices(name: str, values: list[str]) -> type[Enum]:
    return Enum(name, {v: v for v in values}, type=str)  # type: ignore[return-value]


Format = _choices("Format", ["table", "json", "csv"])
DebugFormat = _choices("DebugFormat", ["text", "ndjson", "json"])
Reshape = _choices("Reshape", ["auto", "none", "vit", "swin"])
GradLoss = _choices("GradLoss", ["logit", "ce"])
FeatureOrder = _choices("FeatureOrder", ["index", "mean", "max"])
ModelSource = _choices("ModelSource", ["torchvision", "timm", "hf"])
HeadFusion = _choices("HeadFusion", ["mean", "max", "min"])
CheckFormat = _choices("CheckFormat", ["table", "json", "github"])
CamMethod = _choices("CamMethod", method_names())
AttrMethod = _choices("AttrMethod", attribution_names())

# ----------------------------------------------------------------- options, declared once

#: ablate's input channels: its ``--channels`` are the channels it changes.
InputChannelsOnly = Annotated[int | None, typer.Option(
    "--input-channels", help=next(f for f in fields(LoadOptions)
                                  if f.name == "input_channels").metadata["help"])]

ModelArg = Annotated[str, typer.Argument(
    help="A torchvision name (resnet18, see `hookscope models`), timm:NAME, file.py:NAME or "
    "package.module:NAME (your code), or a pickled model's path (with --trust-checkpoint).",
    metavar="MODEL")]
_INPUTS = typer.Argument(
    help="Image files, directories of images, '-' for stdin, or .pt/.safetensors/.npy tensor "
    "files (a tensor, a tuple or a dict of tensors, samples first; one (C,H,W) image too); "
    "none with --data.", metavar="INPUT...")
InputsArg = Annotated[list[str], _INPUTS]
#: What a command taking InputsArg declares: none may be given (with --data).
_SomeInputs = Annotated[list[str] | None, _INPUTS]
LogInputsArg = Annotated[list[str] | None, typer.Argument(
    help="Image files, directories of images, '-' for stdin, or .pt/.npy tensors; none "
    "when MODEL is a training log (a directory holding watch.jsonl).", metavar="[INPUT]...")]
LayersOpt = Annotated[list[str] | None, typer.Option(
    "--layers", "-l", help="fnmatch pattern on dotted module names (repeatable), e.g. "
    "'layer4.*' (the leaves under layer4); an exact name selects that module.")]
TypesOpt = Annotated[list[str] | None, typer.Option(
    "--type", "-t", help="Module class name, e.g. Conv2d (repeatable).")]
AllModulesOpt = Annotated[bool, typer.Option(
    "--all-modules", help="Hook containers too, not only leaf modules.")]
MaxDepthOpt = Annotated[int | None, typer.Option(
    help="Cut the module tree at this depth (1 = top-level children).", min=1)]


@dataclass(frozen=True, eq=False)
class Bundle:
    """Options a command takes as one parameter (annotated ``Annotated[T, Bundle(...)]``):
    in its help they stand in that parameter's place, and ``build`` makes its value."""

    options: dict[str, tuple[Any, Any]]
    build: Callable[..., Any]


#: A bundle parameter's default, for Python's sake: the command always gets the bundle's value.
BUNDLED: Any = None

#: The modules a probe hooks, as one :class:`~hookscope.core.select.Selection`.
Select = Annotated[Selection, Bundle({
    "layers": (LayersOpt, None), "types": (TypesOpt, None),
    "all_modules": (AllModulesOpt, False), "max_depth": (MaxDepthOpt, None)}, Selection)]
FormatOpt = Annotated[Format, typer.Option(  # type: ignore[valid-type]
    "--format", "-f", help="Output format.")]
TargetOpt = Annotated[str | None, typer.Option(
    help="The class: top1 (default), topK, a class index or label; one for all inputs or a comma "
    "list, one per input.")]
TrainModeOpt = Annotated[bool, typer.Option(
    "--train-mode", help="Run in train mode (BatchNorm batch statistics, dropout on); the "
    "default is eval mode. The model's flags and buffers are restored afterwards.")]
FailOpt = Annotated[bool, typer.Option(
    "--fail-on-nonfinite", help="Exit with code 1 when NaN or Inf appears.")]
OutDirOpt = Annotated[Path, typer.Option(
    "--out", help="Folder for the image files.", file_okay=False)]
PlotOpt = Annotated[Path | None, typer.Option(
    help="Also draw the run as a figure in this file: FILE.svg or FILE.png.", metavar="FILE",
    dir_okay=False)]


def _declared(cls: type) -> dict[str, tuple[Any, Any]]:
    """The command-line options of a dataclass's fields, as
    :func:`~hookscope.core.load_options.option` declares them."""
    found = {}
    for f in fields(cls):
        meta = f.metadata
        declared = typer.Option(*meta["flags"], help=meta["help"], **meta["click"])
        default = None if f.default == () else f.default  # a repeatable option: none given
        parsed = meta["cli"] or f.type
        found[f.name] = (Annotated[parsed, declared], default)
    return found


_LOAD, INPUT_OPTIONS = list(_declared(LoadOptions).items()), _declared(InputOptions)
_AFTER_SIZE = [name for name, _ in _LOAD].index("size") + 1
#: Options every command that runs a model takes, added by :func:`runs_model` (with
#: ``--batch-size`` after ``--size``); then which inputs, and how they are read.
MODEL_OPTIONS = dict([*_LOAD[:_AFTER_SIZE], ("batch_size", INPUT_OPTIONS.pop("batch_size")),
                      *_LOAD[_AFTER_SIZE:]])
#: Options every command takes, added by :func:`runs_model` and :func:`command`.
RUN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "output": (Annotated[Path | None, typer.Option(
        "--output", "-o", help="Write the output to this file (atomically; '-' for stdout; "
        "links and devices are written through) instead of stdout.", dir_okay=False)], None),
    "force": (Annotated[bool, typer.Option("--force", help="Overwrite existing output files.")], False),
    "quiet": (Annotated[bool, typer.Option(
        "--quiet", "-q", help="Only warnings and errors on stderr.")], False),
    "traceback": (Annotated[bool, typer.Option(
        "--traceback", help="Show the Python traceback of errors.")], False),
}


def _with_options(options: dict[str, tuple[Any, Any]],
                  replace: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Add ``options`` to a command; its :class:`~hookscope.session.Session` ``s`` holds them.

    ``replace`` gives some of them another declaration (ablate's own ``--channels``). A
    parameter annotated with a :class:`Bundle` becomes the bundle's options. Typer reads
    the signature that ``__signature__`` declares.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        own: list[inspect.Parameter] = []
        bundles: dict[str, Bundle] = {}
        for p in inspect.signature(fn, eval_str=True).parameters.values():
            bundle = next((m for m in getattr(p.annotation, "__metadata__", ())
                           if isinstance(m, Bundle)), None)
            if bundle is not None:
                bundles[p.name] = bundle
                own += _keywords(bundle.options)
            elif p.name != "s":
                if p.annotation == InputsArg and p.default is p.empty:  # none with --data
                    p = p.replace(default=(), annotation=_SomeInputs)
                own.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        added = _keywords({name: ((replace or {}).get(name, annotation), default)
                           for name, (annotation, default) in options.items()})
        names = [p.name for p in added]

        @functools.wraps(fn)
        def run(ctx: typer.Context, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names}
            kwargs = {name: _plain(v) for name, v in kwargs.items()}
            for name, bundle in bundles.items():
                kwargs[name] = bundle.build(**{k: kwargs.pop(k) for k in bundle.options})
            with session(_flags(ctx), ctx.command.name, model=kwargs.get("model", ""),
                         inputs=_input_paths(kwargs),
                         folders=[kwargs["out_dir"]] if kwargs.get("out_dir") else [],
                         **values) as s:
                return fn(**kwargs, s=s)

        context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY,
                                    annotation=typer.Context)
        params = [context, *own, *added]
        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return wrap


def _input_paths(kwargs: dict[str, Any]) -> list[str]:
    """A command's INPUT paths (``inputs``, or layers' one ``input_``), checked early."""
    one = kwargs.get("input_")
    return [*(kwargs.get("inputs") or []), *([one] if isinstance(one, str) else [])]


def _keywords(options: dict[str, tuple[Any, Any]]) -> list[inspect.Parameter]:
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                              annotation=annotation)
            for name, (annotation, default) in options.items()]


def _plain(value: Any) -> Any:
    """A choice (an Enum member, or a list of them) as its string."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.value if isinstance(value, Enum) else value


def _flags(ctx: typer.Context) -> dict[str, str]:
    """Each parameter's longest flag (``--batch-size``) or, for arguments, its name."""
    return {p.name: max(p.opts, key=len) if p.param_type_name == "option" else
            (p.metavar or p.name.upper()) for p in ctx.command.params if p.name}


def runs_model(fn: Callable[..., Any] | None = None, /, **replace: Any) -> Any:
    """A command that loads a model: the model, input and run options (``replace``: another
    declaration for some of them, by name)."""
    wrap = _with_options(MODEL_OPTIONS | INPUT_OPTIONS | RUN_OPTIONS, replace)
    return wrap if fn is None else wrap(fn)


#: A command that runs no model: the run options only.
command = _with_options(RUN_OPTIONS)


# ----------------------------------------------------------------- each command's own options

RulesOpt = Annotated[Path | None, typer.Option(
    help=f"A TOML file of rules (keys at its top level: {key_names('run')}); each flag below "
    "overrides its key.")]

#: check's flags over the rules file's keys (those :class:`~hookscope.checks.rulefile.Key`
#: gives a flag), as one ``{key: value}`` (None: not given).
RuleFlags = Annotated[dict[str, Any], Bundle({
    name: (Annotated[key.flag | None, typer.Option(help=key.help, metavar=key.metavar)], None)
    for name, key in KEYS.items() if key.flag is not None}, dict)]

JunitOpt = Annotated[Path | None, typer.Option(
    help="Also write a JUnit XML report (one test case per rule) to this file.", metavar="FILE")]

CheckFormatOpt = Annotated[CheckFormat, typer.Option(  # type: ignore[valid-type]
    "--format", "-f", help="table, json (one document), or github (workflow-command annotations).")]

StatsInputStatsOpt = Annotated[bool, typer.Option(
    "--input-stats", help="Also summarise each module's first input.")]
StatsPerChannelOpt = Annotated[bool, typer.Option(
    "--per-channel", help="Also per-channel count, mean, std, min, max, zero fraction and "
    "non-finite count of each output (channels on dim 1; the last dim of 3-D token "
    "outputs and of Linear/LayerNorm outputs). CSV: one row per channel.")]
StatsPercentilesOpt = Annotated[str | None, typer.Option(
    help="Also these percentiles of each output (and channel), e.g. 0.1,99.9,99.99; from a "
    "mergeable sketch, within 0.4% of the value range.", metavar="P,P,...")]
ModelsPatternOpt = Annotated[str | None, typer.Argument(
    help="fnmatch pattern on model names, e.g. 'resnet*'; without wildcards it matches "
    "names containing it.", metavar="PATTERN")]
ModelsTaskOpt = Annotated[str | None, typer.Option(
    help="Only this task: classification, segmentation, detection, video, optical_flow, "
    "quantization.")]
ModelsSourceOpt = Annotated[ModelSource, typer.Option(  # type: ignore[valid-type]
    help="torchvision's models, timm's (names to use as timm:NAME; needs hookscope[timm]), or hf: "
    "the model folders under PATTERN, a local path (needs hookscope[hf]).")]
LayersInputOpt = Annotated[str | None, typer.Argument(
    help="One image or .pt/.npy tensor for the forward pass that records shapes (its "
    "first sample); default: zeros of the weights' input size.", metavar="INPUT")]
LayersNoForwardOpt = Annotated[bool, typer.Option(
    "--no-forward", help="List the modules with their parameters and buffers without running "
    "the model (no INPUT): shapes and MACs are absent, lazy parameters uninitialised.")]
DebugFmtOpt = Annotated[DebugFormat, typer.Option(  # type: ignore[valid-type]
    "--format", "-f", help="text: a live trace; ndjson: one JSON event per line; json: one document.")]
CamLayerOpt = Annotated[list[str] | None, typer.Option(
    help="Target layer (dotted name from `hookscope layers`), repeatable: the layers' maps are "
    "averaged. Default: the last module with an image-grid output (layer4); for a token "
    "transformer its last block's first norm (blocks.11.norm1); for segmentation and detection "
    "models the backbone's last stage.")]
CamMethodOpt = Annotated[list[CamMethod] | None, typer.Option(  # type: ignore[valid-type]
    "--method", "-m", help="CAM method (repeatable). [default: gradcam]")]
CamColormapOpt = Annotated[str, typer.Option(help="A matplotlib colormap name.")]
CamAlphaOpt = Annotated[float, typer.Option(help="Heatmap weight in the overlay.", min=0.0,
    max=1.0)]
CamSaveRawOpt = Annotated[bool, typer.Option(
    "--save-raw", help="Also write <stem>.<method>.npy (one <stem>.<method>.<layer>.npy "
    "per layer with several): the float32 map at the layer's resolution, after ReLU, before normalisation.")]
CamBoxIndexOpt = Annotated[list[int] | None, typer.Option(
    help="Detection: explain this detection (repeatable), counted among those above --min-score "
    "(of class --target, if given), best first.", min=0)]
CamIouOpt = Annotated[float, typer.Option(
    help="Detection: an output box matches an explained one above this IoU.", min=0.0, max=1.0)]
CamMinScoreOpt = Annotated[float, typer.Option(
    help="Detection: only detections scoring at least this.", min=0.0, max=1.0)]
CamMetricsOpt = Annotated[str | None, typer.Option(
    help="Score each map: road, deletion, insertion, drop, increase (comma list) or all.")]
CamPercentilesOpt = Annotated[str | None, typer.Option(
    help="ROAD's percentiles, a comma list. [default: 10,20,...,90]")]
AttrMethodOpt = Annotated[list[AttrMethod] | None, typer.Option(  # type: ignore[valid-type]
    "--method", "-m", help="Attribution method (repeatable). [default: saliency]")]
AttrSaveRawOpt = Annotated[bool, typer.Option(
    "--save-raw", help="Also write <stem>.<method>.npy: the float32 attribution of the model "
    "input's shape (C, H, W), before any channel reduction.")]
#: gradcam's options that :class:`~hookscope.cam.probe.CamOptions` holds, as one ``{name: value}``.
CamOptionsOpt = Annotated[dict[str, Any], Bundle({
    "reshape": (Annotated[Reshape, typer.Option(  # type: ignore[valid-type]
        help="Outputs to a grid: auto ((N, C, H, W), channels-last (N, H, W, C), or patch "
        "tokens after CLS/distillation/register tokens), or only none (N, C, H, W), vit "
        "(tokens) or swin (N, H, W, C).")], "auto"),
    "score_batch": (Annotated[int, typer.Option(
        help="Masked, ablated or perturbed inputs per forward pass (scorecam, ablationcam, sscam, "
        "iscam, --metrics).", min=1)], 32),
    "aug_smooth": (Annotated[bool, typer.Option(
        "--aug-smooth", help="Average the maps of the input flipped and scaled by 0.9, 1, "
        "1.1 (pytorch-grad-cam's).")], False),
    "eigen_smooth": (Annotated[bool, typer.Option(
        "--eigen-smooth", help="The first principal component of the weighted activations "
        "instead of their sum over channels.")], False),
    "guided": (Annotated[bool, typer.Option(
        "--guided", help="Also write <stem>.<method>.guided.png: guided backpropagation "
        "times the map (guided Grad-CAM).")], False),
    "mask": (Annotated[Path | None, typer.Option(
        help="Segmentation: the region explained, an image whose non-zero pixels are the region (the "
        "input image's size or the model input's); default: where the model predicts --target.",
        dir_okay=False)], None),
    "box_index": (CamBoxIndexOpt, None), "iou": (CamIouOpt, 0.5), "min_score": (CamMinScoreOpt, 0.5),
    "metrics": (CamMetricsOpt, None), "percentiles": (CamPercentilesOpt, None),
    "head_fusion": (Annotated[HeadFusion, typer.Option(  # type: ignore[valid-type]
        help="rollout: fuse the attention heads by their mean, max or min.")], "mean"),
    "discard_ratio": (Annotated[float, typer.Option(
        help="rollout: zero this fraction of the lowest fused attentions.", min=0.0, max=0.99)], 0.0),
    "overlay_input": (Annotated[str | None, typer.Option(
        help="For a forward of several inputs: the one the maps are drawn on, by position (0, "
        "1...) or keyword name (default: the first image, signal or volume batch).")], None),
}, dict)]
#: attribute's options that :class:`~hookscope.cam.attribution.AttrOptions` holds, as one
#: ``{name: value}``.
AttrOptionsOpt = Annotated[dict[str, Any], Bundle({
    "steps": (Annotated[int, typer.Option(
        help="integrated-gradients: Gauss-Legendre steps from the baseline to the input.", min=1)], 50),
    "baseline": (Annotated[str, typer.Option(
        help="integrated-gradients and deeplift: zero, blur (a Gaussian blur of the input), noise "
        "(uniform over the input's range, --seed) or a .npy/.pt file of the model input's shape "
        "(C, H, W), preprocessed.", metavar="zero|blur|noise|FILE")], "zero"),
    "samples": (Annotated[int, typer.Option(
        help="smoothgrad, smoothgrad-sq, vargrad: noisy copies per input.", min=1)], 50),
    "noise": (Annotated[float, typer.Option(
        help="smoothgrad, smoothgrad-sq, vargrad: the noise's standard deviation as a fraction of "
        "each input's range (max - min), seeded with --seed.", min=0.0)], 0.15),
    "window": (Annotated[str, typer.Option(
        help="occlusion: the window, H,W or one size for both, in model-input pixels (all "
        "channels).", metavar="H,W")], "16"),
    "stride": (Annotated[str, typer.Option(
        help="occlusion: the window's step, H,W or one size for both (at most the window).",
        metavar="H,W")], "8"),
    "value": (Annotated[float, typer.Option(
        help="occlusion: the value the window is set to (in the model input's preprocessed "
        "space).")], 0.0),
    "batch_cap": (Annotated[int, typer.Option(
        help="The most rows one pass evaluates: the steps, noisy copies and occluded copies are "
        "batched under it (the same numbers for any value).", min=1)], 32),
}, dict)]
GradsLossOpt = Annotated[GradLoss, typer.Option(  # type: ignore[valid-type]
    help="logit: the target logit summed over inputs; ce: cross-entropy against --label, summed "
    "over inputs.")]
GradsLabelOpt = Annotated[str | None, typer.Option(
    help="With --loss ce: the true class (index or label), one for all inputs or a comma list, one "
    "per input.")]
GradsVanishOpt = Annotated[float, typer.Option(
    help="Flag calls whose gradient norm is below this factor times the median call's.",
    min=0.0)]
GradsExplodeOpt = Annotated[float, typer.Option(
    help="Flag calls whose gradient norm is above this factor times the median call's.",
    min=0.0)]
GradsParamsOpt = Annotated[bool, typer.Option(
    "--params/--no-params", help="Show the parameter table (table format; JSON and CSV "
    "always hold the parameters).")]
FeaturesLayersOpt = Annotated[list[str] | None, typer.Option(
    "--layer", "-l", help="A module's dotted name or an fnmatch pattern (repeatable).")]
FeaturesOutDirOpt = Annotated[Path, typer.Option(
    "--out", help="Folder for the grid PNGs (<stem>.<layer>.png).", file_okay=False)]
FeaturesTensorboardOpt = Annotated[Path | None, typer.Option(
    help="Also log the grids and activation histograms to this TensorBoard log directory (needs "
    "hookscope[tensorboard]).", file_okay=False)]
FeaturesMaxChannelsOpt = Annotated[int, typer.Option(
    help="At most this many channels per grid.", min=1)]
FeaturesOrderOpt = Annotated[FeatureOrder, typer.Option(  # type: ignore[valid-type]
    help="Channels shown: index (the first), mean or max (the most active first).")]
FeaturesUpsampleOpt = Annotated[bool, typer.Option(
    "--upsample", help="Resize each tile to the input size.")]
AblateLayerOpt = Annotated[list[str], typer.Option(  # a list only to refuse a second one
    "--layer", help="The module whose output is changed (dotted name, see `hookscope layers`); one per run.")]
AblateChannelsOpt = Annotated[str | None, typer.Option(
    help="Channels to change: 0,5,7, ranges such as 0-15, or all (the default; with --sweep, the "
    "channels swept).")]
AblateSweepOpt = Annotated[bool, typer.Option(
    "--sweep", help="Ablate each channel alone, batched, and rank the channels by how much "
    "the target logit drops.")]
AblateModeOpt = Annotated[str, typer.Option(
    help="zero, mean (the channel's spatial mean), noise:SIGMA (Gaussian noise added, seeded by "
    "--seed) or scale:F.")]
AblateSweepBatchOpt = Annotated[int, typer.Option(
    help="Channels ablated per forward pass in a sweep.", min=1)]
AblateCallOpt = Annotated[int | None, typer.Option(
    help="Only change this call of a module run several times (default: every call).", min=0)]
AblateChannelDimOpt = Annotated[int, typer.Option(
    help="The output dimension holding channels (1 for (N, C, H, W); -1 for token outputs (N, T, "
    "C)).")]
AblateTopOpt = Annotated[int, typer.Option(help="Sweep ranking rows shown in the table.", min=1)]
DiffModelOpt = Annotated[str, typer.Argument(
    help="As in every command; or a saved `stats --format json` document for an offline "
    "diff (then INPUT is the other document).", metavar="MODEL")]
#: diff's ``--against-*`` options, as one ``{name: value}``.
Against = Annotated[dict[str, Any], Bundle({
    "against_weights": (Annotated[str | None, typer.Option(
        help="The second run's --weights (a checkpoint, none, DEFAULT...).")], None),
    "against_dtype": (Annotated[str | None, typer.Option(
        help="The second run's --dtype: float32, float16 or bfloat16.")], None),
    "against_autocast": (Annotated[bool | None, typer.Option(
        "--against-autocast/--against-no-autocast", help="The second run with (or without) "
        "torch.autocast.")], None),
    "against_device": (Annotated[str | None, typer.Option(help="The second run's --device.")], None),
    "against_model": (Annotated[str | None, typer.Option(
        help="Another model whose module names match; calls are paired by name and call index.",
        metavar="NAME")], None),
}, dict)]
DiffToleranceOpt = Annotated[float, typer.Option(
    help="Relative L2 error ||a-b||/||a|| above which a call differs; the first such call is where "
    "the runs part.", min=0.0)]
DiffFailOpt = Annotated[bool, typer.Option(
    "--fail", help="Exit with code 1 when a call exceeds --tolerance (or its shape or "
    "non-finite count differs) or a top-1 prediction differs.")]
ReportLossOpt = Annotated[GradLoss, typer.Option(  # type: ignore[valid-type]
    help="Gradient flow of: logit (the target logit summed over inputs) or ce (cross-entropy "
    "against --label).")]
ReportLayerOpt = Annotated[str | None, typer.Option(
    help="Grad-CAM's layer (dotted name); default: the last module with a spatial output.")]
ReportMethodOpt = Annotated[list[CamMethod] | None, typer.Option(  # type: ignore[valid-type]
    "--method", "-m", help="CAM method (repeatable); gradcam is always shown first.")]
ReportAttributionOpt = Annotated[AttrMethod | None, typer.Option(  # type: ignore[valid-type]
    help="The pixel attribution drawn beside the CAMs (hookscope attribute's method).")]
ReportReshapeOpt = Annotated[Reshape, typer.Option(  # type: ignore[valid-type]
    help="Token outputs to a grid for Grad-CAM: auto, none, vit or swin.")]
ReportScoreBatchOpt = Annotated[int, typer.Option(
    help="Masked inputs per forward pass (scorecam).", min=1)]
WatchStepsOpt = Annotated[int, typer.Option(help="Training steps (one batch each).", min=1)]
WatchLrOpt = Annotated[float, typer.Option(help="SGD learning rate.", min=0.0)]
WatchMomentumOpt = Annotated[float, typer.Option(help="SGD momentum.", min=0.0)]
WatchLabelOpt = Annotated[str | None, typer.Option(
    help="The true class (index or label), one for all inputs or a comma list, one per input; "
    "default: each input's ImageFolder class folder.")]
WatchOverfitOpt = Annotated[bool, typer.Option(
    "--overfit", help="Train on the first batch only, --steps times, and fail unless the "
    "loss falls (the classic sanity check).")]
WatchEveryOpt = Annotated[int, typer.Option(
    help="A logging step every N steps (statistics, gradients, update ratios); NaN and Inf are "
    "checked on every step.", min=1)]
WatchLogDirOpt = Annotated[Path | None, typer.Option(
    help="Keep the training log in this directory (watch.jsonl, and nonfinite.json on a NaN or "
    "Inf), for `hookscope report` and `hookscope check`.", file_okay=False)]
WatchRulesOpt = Annotated[Path | None, typer.Option(
    help=f"Also check the training log with these `hookscope check` rules (a TOML file: "
    f"{key_names('log')}); exit 1 when one fails.", dir_okay=False)]
