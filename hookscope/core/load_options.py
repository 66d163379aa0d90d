"""How to load a model: :class:`LoadOptions`, the library's one declaration of the model
options. Torch-free at import, so the command line builds them before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hookscope.core.errors import HookscopeError, param

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model: the command line's model options, as the library takes them.

    Attributes:
        weights: ``auto``, ``none``, ``DEFAULT`` or a weights name, or a checkpoint path.
        seed: seed for random initialisation.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        size: scale the preprocessing so the crop is ``size``.
        trust_checkpoint: allow files that need arbitrary unpickling.
        num_classes: build the classifier head with this many classes.
        labels: a labels file (text, one per line; a JSON list; a JSON ``{index: label}``).
        model_args: ``key=value`` constructor arguments for models from code.
        mean, std, resize, crop, input_channels: preprocessing overrides.
        output_key: the entry of a dict or tuple output that holds the class logits.
        dtype: ``float32``, ``float16`` or ``bfloat16``: cast the model (and so its inputs).
        autocast: run under ``torch.autocast`` instead of casting, with ``dtype`` (default:
            the device's autocast dtype: float16 on CUDA, bfloat16 on the CPU).

    Raises:
        HookscopeError: ``seed`` is not a 64-bit seed.
    """

    weights: str = "auto"
    seed: int = 0
    device: str | torch.device = "auto"
    size: int | None = None
    trust_checkpoint: bool = False
    num_classes: int | None = None
    labels: str | None = None
    model_args: tuple[str, ...] = ()
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    resize: int | None = None
    crop: int | None = None
    input_channels: int | None = None
    output_key: str | None = None
    dtype: str | None = None
    autocast: bool = False

    def __post_init__(self) -> None:
        if not -(2**63) <= self.seed < 2**64:  # what torch.manual_seed takes
            raise HookscopeError(f"{param('seed')} {self.seed} is out of range; give a whole "
                                 f"number from 0 to {2**64 - 1} (seeds are 64-bit).")
