"""Model sources: what MODEL can name, and the one way every command loads it.

MODEL is a torchvision name (``resnet18``), ``timm:NAME``, ``path/to/file.py:NAME`` or
``package.module:NAME`` (your own code), or the path of a whole pickled module. Each form is
a registered :class:`~hookscope.sources.base.Source`; :func:`load` resolves the form, lets
the source build the model, then applies what every source shares: preprocessing options,
labels, the label count check, the device and eval mode.
"""

from __future__ import annotations

import logging
from importlib import import_module
from typing import Any

import torch

from hookscope.errors import HookscopeError, clip, param, suggest
from hookscope.sources.base import SOURCES, LoadedModel, LoadOptions, ModelSpec, Source, register

__all__ = ["LoadOptions", "LoadedModel", "ModelSpec", "Source", "load", "register", "resolve",
           "set_precision"]

log = logging.getLogger("hookscope")


#: The built-in sources, asked in this order: a torchvision name, ``timm:``, code, a path.
BUILTIN = ("torchvision", "timm", "code", "pickled")


def _builtin() -> list[Source]:
    """The registered sources; the built-in ones join on first use (importing is cheap)."""
    for module in BUILTIN:
        import_module(f"hookscope.sources.{module}")
    return SOURCES


def resolve(spec: str) -> ModelSpec:
    """What ``spec`` names, without loading it.

    Raises:
        HookscopeError: no source claims it; the message suggests close torchvision names
            and the other forms.
    """
    text = spec.strip()
    for source in _builtin():
        found = source.parse(text)
        if found is not None:
            return found
    from hookscope.models import model_tasks

    raise HookscopeError(
        f"Unknown model {spec!r}.{suggest(text, model_tasks())} MODEL is a torchvision name "
        "(`hookscope models`), timm:NAME, file.py:NAME or package.module:NAME, or a pickled "
        "model's path."
    )


def _source(name: str) -> Source:
    return next(s for s in _builtin() if s.name == name)


def load(spec: str | ModelSpec, options: LoadOptions | None = None) -> LoadedModel:
    """Load the model ``spec`` names, ready to run: on its device, in eval mode.

    Raises:
        HookscopeError: see the sources; also labels whose count does not match the model's
            classes, and an unavailable device.
    """
    from hookscope.models import resolve_device
    from hookscope.preprocess import with_overrides

    options = options or LoadOptions()
    found = resolve(spec) if isinstance(spec, str) else spec
    device = resolve_device(options.device) if not isinstance(options.device, torch.device) \
        else options.device
    loaded = _source(found.source).load(found, options)
    loaded.preprocess = with_overrides(
        loaded.preprocess, resize=options.resize, crop=options.crop, mean=options.mean,
        std=options.std, input_channels=options.input_channels)
    loaded.output_key = options.output_key
    loaded.model = loaded.model.to(device).eval()
    loaded.device = device
    set_precision(loaded, options.dtype, autocast=options.autocast)
    if options.size is not None or options.crop is not None or options.resize is not None:
        _check_size(loaded)
    if options.labels is not None:
        from hookscope.checkpoints import read_labels

        loaded.categories = read_labels(options.labels)
        loaded.labels_from = f"file:{options.labels}"
    if loaded.categories is not None:
        _check_label_count(loaded)
    return loaded


def _check_size(loaded: LoadedModel) -> None:
    """Refuse, in one line, an input size the model declares it cannot take.

    A declaration can be cautious (torchvision's Swin runs below its weights' min_size,
    timm's XCiT at any multiple of its patch), so a size it rules out is first tried on one
    zero sample; only when that fails is the size refused, naming the sizes it takes.
    """
    declared, size = loaded.declared_size, loaded.input_size
    if declared is None or declared.takes(size) or loaded.task in ("detection", "optical_flow"):
        return
    from hookscope.run import Probe, drive

    class Trial(Probe[None]):
        def finish(self) -> None:
            return None

    try:
        # Past twice the declared side no trial runs: a ViT's attention grows with the
        # square of the pixel count, so a huge trial could exhaust the memory.
        if max(size) > 2 * max(declared.size):
            raise HookscopeError("no trial")
        drive(loaded.model, loaded.dummy_input(), Trial())
    except HookscopeError:
        h, w = declared.size
        fix = f"{h}" if declared.exact else f"{max(h, w)} or more"
        raise HookscopeError(
            f"{loaded.name} takes {declared.describe()} ({declared.origin}), not {size[0]}x"
            f"{size[1]}: choose {param('size')} {fix}, or leave it out.") from None


def _check_label_count(loaded: LoadedModel) -> None:
    """Labels must match the model's classes; count them with one forward pass if needed."""
    classes = loaded.num_classes
    # Detectors, segmenters and flow models give no (N, classes) logits: none is run to count.
    if classes is None and loaded.task not in ("detection", "segmentation", "optical_flow"):
        classes = _output_classes(loaded)
        loaded.num_classes = classes
    count = len(loaded.categories or [])
    if classes is not None and classes != count:
        where = loaded.labels_from or "the labels"
        raise HookscopeError(
            f"{where} has {count} labels, but {loaded.name} has {classes} output classes; "
            f"give {param('labels')} with one label per class."
        )


def _output_classes(loaded: LoadedModel) -> int | None:
    """The class count of a model's logits, from one forward pass on a zero input."""
    from hookscope.outputs import select_logits
    from hookscope.run import Probe, Step, drive

    class Output(Probe[Any]):
        def observe(self, step: Step, output: Any) -> None:
            self.output = select_logits(output, loaded.output_key, required=False)

        def finish(self) -> Any:
            return self.output

    logits = drive(loaded.model, loaded.dummy_input(), Output())
    return int(logits.shape[1]) if logits is not None and logits.dim() == 2 else None


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.strip().lower()]
    except KeyError:
        raise HookscopeError(f"{param('dtype')} {name!r}: choose one of "
                             f"{', '.join(DTYPES)}.") from None


def _probe_precision(device: torch.device, dtype: torch.dtype, autocast: bool) -> None:
    """Run a convolution and a matrix product in ``dtype`` on ``device``, or say why not."""
    x = torch.ones(1, 2, 4, 4, device=device)
    w = torch.ones(2, 2, 3, 3, device=device)
    try:
        if autocast:
            with torch.autocast(device.type, dtype=dtype):
                torch.nn.functional.conv2d(x, w) @ torch.ones(2, 2, device=device)
        else:
            torch.nn.functional.conv2d(x.to(dtype), w.to(dtype)) @ torch.ones(
                2, 2, device=device, dtype=dtype)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        how = "autocast to " if autocast else ""
        raise HookscopeError(
            f"{how}{str(dtype).removeprefix('torch.')} is not supported on {device} "
            f"({clip(str(exc), 100)}); choose another {param('dtype')} or {param('device')}."
        ) from None


def _detection_ops(device: torch.device) -> dict[str, Any]:
    """The torchvision operators a detection model runs after its network, each as a call
    on a tiny input in a given dtype."""
    from torchvision.ops import nms, roi_align

    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]], device=device)
    scores = torch.tensor([0.9, 0.8], device=device)
    x, rois = torch.ones(1, 2, 4, 4, device=device), torch.tensor([[0.0, 0, 0, 2, 2]],
                                                                    device=device)
    return {"nms": lambda d: nms(boxes.to(d), scores.to(d), 0.5),
            "roi_align": lambda d: roi_align(x.to(d), rois.to(d), 2)}


def _probe_operators(loaded: LoadedModel, dtype: torch.dtype) -> None:
    """Refuse, before the model runs, a cast to ``dtype`` that a detection model's
    post-processing operators (torchvision's ``nms``, ``roi_align``) cannot run."""
    if loaded.task != "detection":
        return
    for name, run in _detection_ops(loaded.device).items():
        try:
            run(dtype)
        except (RuntimeError, NotImplementedError):
            kind = str(dtype).removeprefix("torch.")
            raise HookscopeError(
                f"{loaded.name} cannot run in {kind} on {loaded.device}: torchvision's {name}, "
                f"which detection models run, has no {kind} kernel there. Choose "
                f"{param('dtype')} float32, or {param('autocast')} (which keeps {name} in "
                "float32).") from None


def set_precision(loaded: LoadedModel, dtype: str | None, *, autocast: bool = False) -> None:
    """Cast the model to ``dtype``, or (``autocast``) run it under ``torch.autocast``.

    Raises:
        HookscopeError: an unknown dtype, or a dtype the device cannot run.
    """
    device = loaded.device
    if autocast:
        chosen = _dtype(dtype) if dtype else torch.get_autocast_dtype(device.type)
        _probe_precision(device, chosen, autocast=True)
        loaded.autocast = chosen
        return
    if dtype is None:
        from hookscope.hooks import model_dtype

        loaded.dtype = model_dtype(loaded.model) or torch.float32
        return
    chosen = _dtype(dtype)
    if chosen != torch.float32:
        _probe_precision(device, chosen, autocast=False)
        _probe_operators(loaded, chosen)
    loaded.model = loaded.model.to(chosen)
    loaded.dtype = chosen
