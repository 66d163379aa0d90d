"""How to load a model and read its inputs: :class:`LoadOptions` and :class:`InputOptions`,
the one declaration of the model options. The library takes them; the command line's flags
and help derive from their fields (:func:`option`). Torch-free at import, so the command
line builds them before torch loads.

Field types are real objects here (no ``from __future__ import annotations``): the command
line reads them.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookscope.core.errors import HookscopeError, param

if TYPE_CHECKING:
    import torch


def option(default: Any, help: str, *flags: str, cli: Any = None, **click: Any) -> Any:
    """A field with its command-line option: ``help``, its ``flags`` (default ``--name``), the
    type the command line parses where it is not the field's (``cli``), typer's ``click``
    keywords (``min``, ``metavar``...)."""
    return field(default=default, metadata={"help": help, "flags": flags, "cli": cli,
                                            "click": click})


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model: the command line's model options, as the library takes them.
    ``mean`` and ``std`` may be given as text (``0.485,0.456,0.406``); a bad one, or a
    ``seed`` beyond 64 bits, is a :class:`HookscopeError`."""

    weights: str = option(
        "auto", "auto (pretrained when cached or downloadable, else random with a warning), "
        "DEFAULT, an enum name such as IMAGENET1K_V1, none (random, --seed), or a checkpoint "
        "path (.pt/.pth/.safetensors).", "--weights", "-w")
    seed: int = option(0, "Seed for random initialisation, noise and --shuffle.")
    device: "str | torch.device" = option("auto", "auto, cpu, cuda, cuda:N or mps.", cli=str)
    size: int | None = option(
        None, "Resize/crop inputs to this size (8 to 8192) instead of the weights' default.")
    trust_checkpoint: bool = option(
        False, "Allow checkpoints that need arbitrary unpickling, and whole pickled models as "
        "MODEL (only for files you trust).", "--trust-checkpoint")
    num_classes: int | None = option(
        None, "Build the classifier head with this many classes (default: the checkpoint's "
        "head, or the weights').", min=1)
    labels: str | None = option(
        None, "Class labels: a text file with one per line, a JSON list, or a JSON object "
        "{index: label}.", cli=Path | None, dir_okay=False)
    model_args: tuple[str, ...] = option(
        (), "key=value for the constructor of a model from code, parsed as a Python literal "
        "(repeatable).", "--model-arg", cli=list[str] | None)
    mean: tuple[float, ...] | None = option(
        None, "Normalisation mean: one value or one per channel (0.485,0.456,0.406); default: "
        "the model's own, else ImageNet's.", cli=str | None)
    std: tuple[float, ...] | None = option(None, "Normalisation std, like --mean.",
                                           cli=str | None)
    resize: int | None = option(
        None, "Resize the shorter side to this many pixels before the crop.")
    crop: int | None = option(None, "Centre-crop to this many pixels.")
    input_channels: int | None = option(
        None, "Input channels: 3 (RGB) or 1 (grayscale); --input-channels in ablate, whose "
        "--channels are the channels it changes.", "--channels", "--input-channels")
    dtype: str | None = option(
        None, "Run in float32, float16 or bfloat16: the model and inputs are cast (statistics "
        "are still accumulated in float64).")
    autocast: bool = option(
        False, "Run under torch.autocast instead of casting (with --dtype, or the device's "
        "default: float16 on CUDA, bfloat16 on the CPU).", "--autocast")
    output_key: str | None = option(
        None, "The entry of a dict or tuple output that holds the class logits (default: "
        "logits, out, or the only tensor).")
    text: tuple[str, ...] = option(
        (), "For an image-text hf: model (CLIP): a text each image is compared with, by the "
        "folder's tokenizer; the texts are its classes (repeatable).", cli=list[str] | None)

    def __post_init__(self) -> None:
        if not -(2**63) <= self.seed < 2**64:  # what torch.manual_seed takes
            raise HookscopeError(f"{param('seed')} {self.seed} is out of range; give a whole "
                                 f"number from 0 to {2**64 - 1} (seeds are 64-bit).")
        for key in ("mean", "std"):
            object.__setattr__(self, key, _floats(getattr(self, key), key))
        object.__setattr__(self, "model_args", tuple(self.model_args or ()))
        if self.labels is not None:
            object.__setattr__(self, "labels", str(self.labels))


def _floats(value: str | tuple[float, ...] | None, name: str) -> tuple[float, ...] | None:
    """``0.5`` or ``0.485,0.456,0.406`` as floats; a tuple as it is."""
    if not isinstance(value, str):
        return value
    try:
        return tuple(float(v) for v in value.split(","))
    except ValueError:
        raise HookscopeError(f"{param(name)} {value!r}: give one number, or one per channel "
                             "separated by commas (0.485,0.456,0.406).") from None


@dataclass(frozen=True)
class InputOptions:
    """How the inputs are read: batches, DataLoader workers, which inputs and in what order."""

    batch_size: int = option(8, "Inputs per forward pass (1 to 4096).", "--batch-size", "-b")
    workers: int | None = option(
        None, "Decode and preprocess images in this many DataLoader worker processes (0: in "
        "this process, one batch ahead in a thread). Default: one less than the CPUs (at most "
        "4; 0 when under 2), or 0 for stdin, tensor files and fewer than two batches of "
        "images. The output is the same either way.")
    limit: int | None = option(None, "Use only the first N inputs (after --shuffle).",
                               metavar="N")
    shuffle: bool = option(False, "Take the inputs in a random order drawn from --seed (with "
                           "--limit: a reproducible sample).", "--shuffle")
    recursive: bool = option(False, "Walk directories' subdirectories too (sorted by path).",
                             "--recursive", "-r")
    as_is: bool = option(False, "Pass each tensor file to the forward as it is, one call: not "
                         "sliced into samples (1-D inputs with no sample dimension, tensors "
                         "whose samples are not first).", "--as-is")
    data: str | None = option(
        None, "Your own data instead of INPUT files: FILE.py:NAME or module:NAME, a Dataset, a "
        "DataLoader or an iterable (or a callable returning one); items are a tensor, a tuple "
        "or a dict, or (input, label) pairs. See docs/inputs.md.", metavar="FILE.py:NAME")
