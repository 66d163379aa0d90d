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
    if options.model_args and found.source != "code":
        raise HookscopeError(
            f"{param('model_args')} passes constructor arguments to a model from your code "
            f"(file.py:NAME, package.module:NAME); {found.name} is not one, and hookscope "
            f"passes it none (for its class count, use {param('num_classes')}).")
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
    if options.labels is not None:
        from hookscope.checkpoints import read_labels

        loaded.categories = read_labels(options.labels)
        loaded.labels_from = f"file:{options.labels}"
    if loaded.categories is not None:
        _check_label_count(loaded)
    return loaded


def _check_label_count(loaded: LoadedModel) -> None:
    """Labels must match the model's classes; count them with one forward pass if needed."""
    classes = loaded.num_classes
    if classes is None:
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
    loaded.model = loaded.model.to(chosen)
    loaded.dtype = chosen
