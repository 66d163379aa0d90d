"""Checkpoint files and labels files, for every model source.

:func:`open_checkpoint` reads a state_dict (maybe in a dict, with labels beside it),
``.safetensors``, or, when trusted, a whole pickled module. Anything beyond tensors needs
explicit trust, since unpickling can run code.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hookscope.core.errors import HookscopeError, clip, param
from hookscope.core.load_options import LoadOptions
from hookscope.inputs.resolve import read_once

log = logging.getLogger("hookscope")

__all__ = ["Checkpoint", "build_to_fit", "fit", "head_classes", "open_checkpoint", "read_labels"]

#: Checkpoint entries that hold the weights, tried in order, and those that hold labels.
_STATE_KEYS = ("state_dict", "model_state_dict", "model", "net", "weights")
_LABEL_KEYS = ("classes", "class_names", "labels", "idx_to_class", "class_to_idx")


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint file holds: weights (or a whole module) and maybe labels."""

    path: Path
    state: Mapping[str, torch.Tensor] | None = None
    module: nn.Module | None = None
    labels: list[str] | None = None
    labels_from: str | None = None  # ``checkpoint:KEY``, the entry the labels came from


#: A checkpoint to read: a regular file, or the bytes of one that can be read only once.
Readable = Path | bytes


def _readable(src: Readable) -> Path | io.BytesIO:
    """Something to open ``src`` as: the path, or a fresh stream over its bytes."""
    return io.BytesIO(src) if isinstance(src, bytes) else src


def is_pickle(src: Readable) -> bool:
    """Whether ``src`` is a ``torch.save`` archive (zip) or a pickle (protocol 2 or later)."""
    try:
        with io.BytesIO(src) if isinstance(src, bytes) else src.open("rb") as fh:
            head = fh.read(2)
    except OSError:
        return False
    return zipfile.is_zipfile(_readable(src)) or (head[:1] == b"\x80" and head[1:] >= b"\x02")


def refuse_compiled(src: Readable, path: Path) -> None:
    """TorchScript archives and torch.export programs have no eager modules to hook."""
    if not zipfile.is_zipfile(_readable(src)):
        return
    with zipfile.ZipFile(_readable(src)) as archive:
        names = archive.namelist()
    kind = None
    if any(n.endswith("constants.pkl") or "/code/" in n for n in names):
        kind = "a TorchScript archive"
    elif any("serialized_exported_program" in n or n.endswith("archive_format") for n in names):
        kind = "a torch.export program"
    if kind:
        raise HookscopeError(
            f"{path} is {kind}; hooks need an eager nn.Module. Load the Python class with "
            f"MODEL file.py:NAME and a state_dict in {param('weights')} instead.")


def _torch_load(src: Readable, trust: bool, path: Path) -> Any:
    refuse_compiled(src, path)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr
            warnings.simplefilter("ignore")
            return torch.load(_readable(src), map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as exc:
        if not trust and is_pickle(src):
            raise HookscopeError(
                f"{path}: the file holds Python objects that need arbitrary unpickling, which can run code. "
                f"If it is a checkpoint from a source you trust, set {param('trust_checkpoint')}.") from None
        raise HookscopeError(f"{path}: not a PyTorch checkpoint ({clip(str(exc), 120)}).") from None
    except Exception as exc:  # torch.load raises many types on files that aren't checkpoints
        raise HookscopeError(f"{path}: not a PyTorch checkpoint ({exc.__class__.__name__}).") \
            from None


def _labels_in(obj: Mapping[str, Any]) -> tuple[list[str] | None, str | None]:
    """The checkpoint's labels, and ``checkpoint:KEY``, the entry they came from."""
    for key in _LABEL_KEYS:
        if key in obj:
            value = obj[key]
            if key == "class_to_idx" and isinstance(value, Mapping):
                value = {index: name for name, index in value.items()}
            try:
                return _label_list(value, f"the checkpoint's {key!r}"), f"checkpoint:{key}"
            except HookscopeError:
                continue
    return None, None


def _unwrap(obj: Any, path: Path) -> tuple[Mapping[str, torch.Tensor] | nn.Module,
                                           Mapping[str, Any] | None]:
    """The weights (or module) inside ``obj``, and the dict around them."""
    if isinstance(obj, nn.Module):
        return obj, None
    if isinstance(obj, Mapping):
        if obj and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                       for k, v in obj.items()):
            if all(k.startswith("module.") for k in obj):  # saved from DataParallel
                return {k.removeprefix("module."): v for k, v in obj.items()}, None
            return obj, None
        for key in _STATE_KEYS:
            inner = obj.get(key)
            if isinstance(inner, nn.Module) or (isinstance(inner, Mapping) and inner):
                found, _ = _unwrap(inner, path)
                return found, obj
    raise HookscopeError(
        f"{path}: not a checkpoint hookscope can use; expected a state_dict, or a dict with a "
        "'state_dict' or 'model' entry.")


def open_checkpoint(path: Path | str, *, trust: bool = False) -> Checkpoint:
    """Read a checkpoint: a state_dict, a dict holding one (and labels), ``.safetensors``,
    or (``trust``) a whole module."""
    path = Path(path).expanduser()
    if not path.exists():
        raise HookscopeError(f"Weights file not found: {path}.")
    if path.is_dir():
        raise HookscopeError(f"{path} is a directory; {param('weights')} takes a checkpoint file.")
    data = read_once(path, str(path))  # read each file once: a FIFO cannot be opened twice
    src: Readable = path if data is None else data
    if path.suffix.lower() == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load, load_file

        try:
            tensors = load(src) if isinstance(src, bytes) else load_file(str(path), device="cpu")
            found, _ = _unwrap(tensors, path)
        except (SafetensorError, OSError, ValueError) as exc:
            raise HookscopeError(f"{path}: not a readable .safetensors file ({exc}).") from None
        return Checkpoint(path, state=found)  # type: ignore[arg-type]
    found, around = _unwrap(_torch_load(src, trust, path), path)
    labels, where = _labels_in(around) if around is not None else (None, None)
    if isinstance(found, nn.Module):
        return Checkpoint(path, module=found, labels=labels, labels_from=where)
    return Checkpoint(path, state=found, labels=labels, labels_from=where)


def head_classes(model: nn.Module, state: Mapping[str, torch.Tensor]) -> int | None:
    """The class count of a fine-tuned checkpoint: every tensor whose shape differs from
    ``model``'s differs only in its first dimension, from one class count to one other (the
    classifier heads). None when it is not one."""
    own = model.state_dict()
    wrong = [(state[k].shape, own[k].shape) for k in state
             if k in own and state[k].shape != own[k].shape]
    if not wrong or any(len(a) != len(b) or a[1:] != b[1:] for a, b in wrong):
        return None
    new, old = {a[0] for a, _ in wrong}, {b[0] for _, b in wrong}
    return int(new.pop()) if len(new) == 1 and len(old) == 1 else None


def fit(model: nn.Module, state: Mapping[str, torch.Tensor], *, path: Path, name: str) -> None:
    """Load ``state`` into ``model`` exactly, or explain the mismatch by key: tensors of
    other shapes, missing or unexpected keys (with examples)."""
    own = model.state_dict()
    wrong = [(k, list(v.shape), list(own[k].shape)) for k, v in state.items()
             if k in own and isinstance(v, torch.Tensor) and v.shape != own[k].shape]
    if wrong:
        key, theirs, ours = wrong[0]
        raise HookscopeError(
            f"{path} does not fit {name}: {len(wrong)} tensor(s) have another shape, e.g. {key} is {theirs} "
            f"in the file and {ours} in the model. Is it a checkpoint for another architecture?")
    missing, unexpected = model.load_state_dict(state, strict=False)
    parts = [f"{len(keys)} {what} key(s), e.g. {', '.join(keys[:3])}"
             for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
    if parts:
        raise HookscopeError(
            f"{path} does not fit {name}: {'; '.join(parts)}. Is it a checkpoint for another architecture?")


Builder = Callable[[int | None, Mapping[str, torch.Tensor]], nn.Module]


def build_to_fit(options: LoadOptions, build: Builder, *, name: str
                 ) -> tuple[nn.Module, Checkpoint]:
    """Build a model to fit the checkpoint ``options.weights`` and load it exactly; a whole
    module is returned as is. ``build`` makes the architecture for a class count (None: its
    default) and the checkpoint's state (to match optional parts such as auxiliary heads);
    when only the heads differ (a fine-tuned model) it builds again with the checkpoint's
    class count, which ``num_classes`` must not contradict.
    """
    found = open_checkpoint(options.weights.strip(), trust=options.trust_checkpoint)
    path, num_classes = found.path, options.num_classes
    if found.module is not None:
        return found.module, found
    assert found.state is not None
    model = build(num_classes, found.state)
    classes = head_classes(model, found.state)
    if classes is not None:
        if num_classes is not None:
            raise HookscopeError(f"{path}'s classifier has {classes} classes, but "
                                 f"{param('num_classes')} is {num_classes}.")
        log.info("%s: a fine-tuned %s head with %d classes", path, name, classes)
        model = build(classes, found.state)
    fit(model, found.state, path=path, name=name)
    return model, found


def _label_list(value: Any, where: str) -> list[str]:
    """Labels from a list, or from a mapping of index to label covering 0..n-1."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(value, Mapping) and value:
        try:
            by_index = {int(k): str(v) for k, v in value.items()}
        except (TypeError, ValueError):
            raise HookscopeError(f"{where}: an object's keys must be class indices.") from None
        gaps = sorted(set(range(len(by_index))) - set(by_index))
        if gaps:
            raise HookscopeError(f"{where}: class index {gaps[0]} has no label; indices must "
                                 f"run from 0 to {len(by_index) - 1}.")
        return [by_index[i] for i in range(len(by_index))]
    raise HookscopeError(f"{where}: expected a list of labels or an object {{index: label}}.")


def read_labels(path: Path | str) -> list[str]:
    """Class labels from a file: one per line, a JSON list, or a JSON object ``{index: label}``."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HookscopeError(f"Labels file not found: {path}.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HookscopeError(f"{path}: cannot read labels ({exc}).") from None
    if path.suffix.lower() == ".json" or text.lstrip()[:1] in ("[", "{"):
        try:
            return _label_list(json.loads(text), str(path))
        except json.JSONDecodeError as exc:
            raise HookscopeError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno}).") \
                from None
    labels = [line.strip() for line in text.rstrip().splitlines()]
    if not labels or any(not label for label in labels):
        raise HookscopeError(f"{path}: expected one label per line, with no empty lines.")
    return labels
