"""Model sources: what MODEL can name, and the one way every command loads it.

Each form of MODEL is a registered :class:`~hookscope.sources.base.Source`; :func:`load` lets
the source build the model, then applies what every source shares: preprocessing options,
labels, device, precision and eval mode.
"""

from __future__ import annotations

from contextlib import suppress
from importlib import import_module
from typing import Any

import torch
from torch import nn

from hookscope.core.errors import HookscopeError, clip, param, suggest
from hookscope.sources.base import (
    SOURCES,
    LoadedModel,
    LoadOptions,
    ModelSpec,
    Source,
    register,
    resolve_device,
)

__all__ = ["LoadOptions", "LoadedModel", "ModelSpec", "Source", "load", "register", "resolve",
           "set_precision"]


def _builtin() -> list[Source]:
    """The registered sources; the built-in ones join on first use. Code and pickles, whose
    forms are the broadest (``hf:model`` is also ``module:NAME``), are asked last."""
    for module in ("torchvision", "timm", "hf", "code"):
        import_module(f"hookscope.sources.{module}")
    return sorted(SOURCES, key=lambda source: source.name in ("code", "pickle"))


def resolve(spec: str) -> ModelSpec:
    """What ``spec`` names, without loading it; a HookscopeError, suggesting close names and
    the other forms, when no source claims it."""
    text = spec.strip()
    for source in _builtin():
        found = source.parse(text)
        if found is not None:
            return found
    from hookscope.sources.torchvision import model_tasks

    raise HookscopeError(
        f"Unknown model {spec!r}.{suggest(text, model_tasks())} MODEL is a torchvision name (`hookscope "
        "models`), timm:NAME, hf:FOLDER, file.py:NAME or package.module:NAME, or a pickled model's path.")


def load(spec: str | ModelSpec, options: LoadOptions | None = None) -> LoadedModel:
    """Load the model ``spec`` names, ready to run: on its device, in eval mode. Raises
    HookscopeError for anything the user gave that does not fit it."""
    from hookscope.inputs.preprocess import check_side, with_overrides

    options = options or LoadOptions()
    for side in ("size", "resize", "crop"):
        check_side(side, getattr(options, side))
    found = resolve(spec) if isinstance(spec, str) else spec
    if options.model_args and found.source != "code":
        raise HookscopeError(
            f"{param('model_args')} passes constructor arguments to a model from your code "
            f"(file.py:NAME, package.module:NAME); {found.name} is not one, and hookscope "
            f"passes it none (for its class count, use {param('num_classes')}).")
    if options.text and found.source != "hf":
        raise HookscopeError(f"{param('text')} gives the texts of an image-text hf: model (CLIP); "
                             f"{found.name} is not one.")
    device = options.device if isinstance(options.device, torch.device) \
        else resolve_device(options.device)
    loaded = next(s for s in _builtin() if s.name == found.source).load(found, options)
    loaded.preprocess = with_overrides(
        loaded.preprocess, resize=options.resize, crop=options.crop, mean=options.mean,
        std=options.std, input_channels=options.input_channels)
    loaded.output_key = options.output_key or loaded.output_key
    loaded.model = loaded.model.to(device).eval()
    loaded.device = device
    set_precision(loaded, options.dtype, autocast=options.autocast)
    if options.size is not None or options.crop is not None or options.resize is not None:
        _check_size(loaded)
    if options.labels is not None:
        from hookscope.sources.checkpoints import read_labels

        loaded.categories = read_labels(options.labels)
        loaded.labels_from = f"file:{options.labels}"
    if loaded.categories is not None:
        _check_label_count(loaded)
    return loaded


def _check_size(loaded: LoadedModel) -> None:
    """Refuse, in one line, an input size the model declares it cannot take. A declaration
    can be cautious (torchvision's Swin runs below its weights' min_size), so a size it rules
    out is first tried on one zero sample."""
    declared, size = loaded.declared_size, loaded.input_size
    if declared is None or declared.takes(size) or loaded.task in ("detection", "optical_flow"):
        return
    # Past twice the declared side no trial runs: a ViT's attention grows with the square
    # of the pixel count, so a huge trial could exhaust the memory.
    if max(size) <= 2 * max(declared.size):
        with suppress(HookscopeError):
            _trial(loaded)
            return
    h, w = declared.size
    fix = f"{h}" if declared.exact else f"{max(h, w)} or more"
    raise HookscopeError(
        f"{loaded.name} takes {declared.describe()} ({declared.origin}), not {size[0]}x"
        f"{size[1]}: choose {param('size')} {fix}, or leave it out.")


def _check_label_count(loaded: LoadedModel) -> None:
    """Labels must match the model's classes; count them with one forward pass if needed."""
    from hookscope.core.logits import select_logits

    classes = loaded.num_classes
    # Detectors, segmenters and flow models give no (N, classes) logits: none is run to count.
    if classes is None and loaded.task not in ("detection", "segmentation", "optical_flow"):
        logits = select_logits(_trial(loaded), loaded.output_key, required=False)
        classes = int(logits.shape[1]) if logits is not None and logits.dim() == 2 else None
        loaded.num_classes = classes
    count = len(loaded.categories or [])
    if classes is not None and classes != count:
        where = loaded.labels_from or "the labels"
        raise HookscopeError(
            f"{where} has {count} labels, but {loaded.name} has {classes} output classes; "
            f"give {param('labels')} with one label per class.")


def _trial(loaded: LoadedModel) -> Any:
    """The model's output on one zero sample, run by the one driver."""
    from hookscope.core.run import Probe, Step, drive

    class Output(Probe[Any]):
        def observe(self, step: Step, output: Any) -> None:
            self.output = output

        def finish(self) -> Any:
            return self.output

    return drive(loaded.model, loaded.dummy_input(), Output())


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.strip().lower()]
    except KeyError:
        raise HookscopeError(f"{param('dtype')} {name!r}: choose one of {', '.join(DTYPES)}.") from None


def _probe(loaded: LoadedModel, dtype: torch.dtype, autocast: bool) -> None:
    """Run a convolution and a matrix product in ``dtype`` (``autocast``: under autocast to
    it) on the model's device, and a cast detector's ``nms`` and ``roi_align``; or say why not."""
    device, kind = loaded.device, str(dtype).removeprefix("torch.")
    where: dict[str, Any] = {"device": device} if autocast else {"device": device, "dtype": dtype}
    try:
        with torch.autocast(device.type, dtype=dtype, enabled=autocast):
            torch.nn.functional.conv2d(torch.ones(1, 2, 4, 4, **where), torch.ones(2, 2, 3, 3, **where)) \
                @ torch.ones(2, 2, **where)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        how = "autocast to " if autocast else ""
        raise HookscopeError(
            f"{how}{kind} is not supported on {device} ({clip(str(exc), 100)}); choose another "
            f"{param('dtype')} or {param('device')}.") from None
    if loaded.task != "detection" or autocast:
        return
    from torchvision.ops import nms, roi_align

    boxes = [[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]]
    trials = {"nms": lambda: nms(torch.tensor(boxes, **where), torch.tensor([0.9, 0.8], **where),
                                 0.5),
              "roi_align": lambda: roi_align(torch.ones(1, 2, 4, 4, **where),
                                             torch.tensor([[0.0, 0, 0, 2, 2]], **where), 2)}
    for name, run in trials.items():
        try:
            run()
        except (RuntimeError, NotImplementedError):
            raise HookscopeError(
                f"{loaded.name} cannot run in {kind} on {device}: torchvision's {name}, which "
                f"detection models run, has no {kind} kernel there. Choose {param('dtype')} float32, or "
                f"{param('autocast')} (which keeps {name} in float32).") from None


def set_precision(loaded: LoadedModel, dtype: str | None, *, autocast: bool = False) -> None:
    """Cast the model to ``dtype``, or (``autocast``) run it under ``torch.autocast``; refuse
    an unknown dtype, or one the device cannot run."""
    if autocast:
        chosen = _dtype(dtype) if dtype else torch.get_autocast_dtype(loaded.device.type)
        _probe(loaded, chosen, autocast=True)
        loaded.autocast = chosen
        return
    if dtype is None:
        from hookscope.core.hooks import model_dtype

        loaded.dtype = model_dtype(loaded.model) or torch.float32
        return
    chosen = _dtype(dtype)
    if chosen != torch.float32:
        _probe(loaded, chosen, autocast=False)
    loaded.model = loaded.model.to(chosen)
    loaded.dtype = chosen


def load_model(name: str, **options: Any) -> LoadedModel:
    """Load any model hookscope can name, in eval mode (see :func:`load`); ``options`` are
    :class:`hookscope.sources.LoadOptions`' fields, with ``device`` cpu unless given."""
    return load(name, LoadOptions(**{"device": "cpu", **options}))


def check_supported(spec: ModelSpec, *, needs_logits: bool = False,
                    needs_images: bool = False) -> None:
    """Refuse, before the model is built, a model kind an analysis cannot run: optical flow
    anywhere, detectors and segmenters where it ``needs_logits`` (N, classes), video where it
    ``needs_images`` (N, C, H, W): Grad-CAM, which explains detectors and segmenters too."""
    name, task = spec.name, spec.task
    if task == "optical_flow":
        raise HookscopeError(
            f"{name} is an optical-flow model: it takes two frames per input, and hookscope runs models on "
            "one batch of images (classification, segmentation, detection) or clips (video).")
    if needs_logits and not needs_images and task in ("detection", "segmentation"):
        raise HookscopeError(
            f"{name} is a {task} model; this analysis needs a classifier's (N, classes) "
            f"logits. {task.capitalize()} models work with stats, layers, debug, features, "
            "gradcam, report, check and diff.")
    if needs_images and spec.input_ndim != 4:
        raise HookscopeError(f"{name} is a video model; this analysis explains image models (N, C, H, W).")


def available_memory(device: torch.device) -> int | None:
    """Bytes free for tensors on ``device``, or None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    with suppress(OSError), open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _stride_area(module: nn.Module) -> int:
    stride = getattr(module, "stride", 1)
    stride = (stride, stride) if isinstance(stride, int) else tuple(stride or (1,))[-2:]
    return int(stride[0] * stride[-1])


def values_per_pixel(model: nn.Module) -> float:
    """Values per input pixel of the model's widest activation (at least 3, RGB): a
    convolution's channels (a Linear layer's features) over the grid's area by then, from the
    strides before it in definition order. A branch's stride counted twice only makes later
    layers look smaller, and the widest activation comes early (an inverted bottleneck)."""
    area, widest = 1, 3.0
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Conv3d)):
            widest = max(widest, module.out_channels / (area * _stride_area(module)))
        elif isinstance(module, nn.Linear):  # ConvNeXt's and ViT's MLPs, on every position
            widest = max(widest, module.out_features / area)
        if isinstance(module, (nn.Conv2d, nn.Conv3d, nn.MaxPool2d, nn.AvgPool2d)):
            area *= _stride_area(module)
    return widest


def batch_memory(loaded: LoadedModel, batch_size: int) -> int:
    """Bytes of activations a batch needs: 4 float32 tensors of the widest activation live at
    once (a module's input and output, a residual branch, a probe's temporary)."""
    h, w = loaded.input_size
    frames = 16 if loaded.input_ndim == 5 else 1
    return int(batch_size * h * w * frames * 4 * values_per_pixel(loaded.model) * 4)


def check_batch_memory(loaded: LoadedModel, batch_size: int) -> None:
    """Refuse a batch size out of range, or a batch whose activations (:func:`batch_memory`)
    cannot fit in the device's memory, before it is made, rather than meet the OOM killer."""
    if not 1 <= batch_size <= 4096:
        raise HookscopeError(f"{param('batch_size')} must be between 1 and 4096, not {batch_size}.")
    need = batch_memory(loaded, batch_size)
    h, w = loaded.input_size
    free = available_memory(loaded.device)
    if free is not None and need > free:
        raise HookscopeError(
            f"{batch_size} input(s) of {h}x{w} need about {need / 2**30:.1f} GiB for "
            f"activations, and {loaded.device} has {free / 2**30:.1f} GiB available; lower "
            f"{param('size')} or {param('batch_size')}.")
