"""Whole pickled models: the path of a ``torch.save(model)`` file.

Unpickling a module runs code the file names, so it needs ``trust_checkpoint``. TorchScript
archives and ``torch.export`` programs are refused: they have no eager modules to hook.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from hookscope.core.errors import HookscopeError, param
from hookscope.sources.base import LoadedModel, LoadOptions, ModelSpec, Source, register
from hookscope.sources.checkpoints import Checkpoint, _is_pickle, _refuse_compiled, open_checkpoint
from hookscope.sources.code import check_eager, check_weights, custom_model, first_on_path, load_weights

SUFFIXES = {".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".pt2", ".ts"}


def _unpickle(path: Path, trust: bool) -> Checkpoint:
    """Open ``path`` (its classes importable from the current directory too, as with ``python
    -m``), or say in one line why it does not load."""
    try:
        with first_on_path(os.getcwd()):
            return open_checkpoint(path, trust=trust)
    except HookscopeError as exc:
        cause = exc.__context__  # open_checkpoint raises "from None": the cause is kept here
        if not trust and isinstance(cause, pickle.UnpicklingError) and _is_pickle(path):
            raise HookscopeError(
                f"{path} holds a whole pickled model, and loading it runs code the file "
                f"names. If you trust the file, set {param('trust_checkpoint')}.") from None
        if trust and isinstance(cause, (ImportError, AttributeError)):
            raise HookscopeError(
                f"{path}: the pickled model's code cannot be imported ({type(cause).__name__}: {cause}). "
                "Unpickling needs the module that defined its class: run hookscope from that module's "
                "folder, or add it to PYTHONPATH. A class defined in a script's __main__ cannot be found; "
                "save a state_dict and use MODEL file.py:NAME instead.") from None
        raise


def _parse(spec: str) -> ModelSpec | None:
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".py":  # code, not a pickle: the form is file.py:NAME
        raise HookscopeError(
            f"{spec} is Python code, not a pickled model: name the model in it as "
            f"{spec}:NAME (an nn.Module subclass, or a function that returns one).")
    if path.suffix.lower() not in SUFFIXES and not path.is_file():
        return None
    return ModelSpec("pickle", spec, str(path), "custom")


def load_pickled(spec: ModelSpec, options: LoadOptions) -> LoadedModel:
    """Load a file holding a whole nn.Module (needs ``trust_checkpoint``)."""
    path = Path(spec.target)
    if not path.is_file():
        raise HookscopeError(f"Model file not found: {path}. MODEL is a torchvision name (`hookscope "
                             "models`), timm:NAME, file.py:NAME, package.module:NAME, or a pickled "
                             "model's path.")
    _refuse_compiled(path, path)
    check_weights(options, "a pickled model (it carries its own weights)")
    found = _unpickle(path, options.trust_checkpoint)
    if found.module is None:
        raise HookscopeError(
            f"{path} holds a state_dict (weights without their architecture), not a whole model. "
            f"A state_dict needs its architecture: use MODEL file.py:NAME (or a torchvision "
            f"name) with {param('weights')} {path}.")
    check_eager(found.module, str(path))
    weights = load_weights(found.module, spec.name, options)
    loaded = f"file:{(weights or found).path}"
    labelled = weights if weights is not None and weights.labels else found
    return custom_model(spec, found.module, options, loaded, labelled)


register(Source("pickle", _parse, load_pickled))
