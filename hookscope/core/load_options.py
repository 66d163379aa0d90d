"""How to load a model: :class:`LoadOptions`, the library's one declaration of the model
options. Torch-free at import, so the command line builds them before torch loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hookscope.core.errors import HookscopeError, param

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model: the command line's model options, as the library takes them (a
    ``seed`` beyond 64 bits is a :class:`HookscopeError`)."""

    weights: str = "auto"  # auto, none, DEFAULT, a weights name, or a checkpoint path
    seed: int = 0  # for random initialisation
    device: str | torch.device = "auto"  # auto, cpu, cuda, cuda:N or mps
    size: int | None = None  # scale the preprocessing so the crop is this size
    trust_checkpoint: bool = False  # allow files that need arbitrary unpickling
    num_classes: int | None = None  # build the classifier head with this many classes
    labels: str | None = None  # a file: text, one label a line; a JSON list or {index: label}
    model_args: tuple[str, ...] = ()  # key=value constructor arguments for models from code
    mean: tuple[float, ...] | None = None  # mean to input_channels: preprocessing overrides
    std: tuple[float, ...] | None = None
    resize: int | None = None
    crop: int | None = None
    input_channels: int | None = None
    output_key: str | None = None  # the entry of a dict or tuple output holding the logits
    dtype: str | None = None  # float32, float16 or bfloat16: cast the model (and its inputs)
    #: Run under torch.autocast with ``dtype`` instead of casting (default: the device's
    #: autocast dtype, float16 on CUDA, bfloat16 on the CPU).
    autocast: bool = False

    def __post_init__(self) -> None:
        if not -(2**63) <= self.seed < 2**64:  # what torch.manual_seed takes
            raise HookscopeError(f"{param('seed')} {self.seed} is out of range; give a whole "
                                 f"number from 0 to {2**64 - 1} (seeds are 64-bit).")
