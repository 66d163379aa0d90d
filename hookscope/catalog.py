"""The models hookscope can list: torchvision's (its registry and weights enums), timm's and
Hugging Face folders."""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hookscope.core.errors import HookscopeError, suggest

__all__ = ["ModelInfo", "find_hf_models", "find_models", "find_timm_models", "name_matcher"]


@dataclass(frozen=True)
class ModelInfo:
    """One model: its task and the member names of its weights enum (empty when none)."""

    name: str
    task: str
    weights: list[str]
    default: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def name_matcher(pattern: str | None) -> str:
    """The fnmatch pattern used for ``pattern``: without wildcards it matches substrings."""
    if not pattern:
        return "*"
    low = pattern.lower()
    return low if any(c in low for c in "*?[") else f"*{low}*"


def _none_match(what: str, pattern: str | None, names: list[str], source: str) -> HookscopeError:
    hint = suggest(pattern.strip("*?[]"), names) if pattern else ""
    return HookscopeError(f"No {what} matches {pattern!r}.{hint} Run `hookscope models{source}` "
                          "to list them all.")


def find_models(pattern: str | None = None, task: str | None = None) -> list[ModelInfo]:
    """torchvision models whose name matches ``pattern`` (see :func:`name_matcher`), sorted
    (HookscopeError: an unknown task, or nothing matches, with close names suggested)."""
    from hookscope.sources.torchvision import model_tasks, weights_enum

    catalog = []
    for name, model_task in sorted(model_tasks().items()):
        enum = weights_enum(name)
        default = getattr(enum, "DEFAULT", None)
        catalog.append(ModelInfo(name, model_task, [m.name for m in enum or ()],
                                 default.name if default is not None else None))
    known = sorted({m.task for m in catalog})
    if task is not None and task not in known:
        raise HookscopeError(f"Unknown task {task!r}.{suggest(task, known)} Tasks: "
                             f"{', '.join(known)}.")
    glob = name_matcher(pattern)
    found = [m for m in catalog
             if fnmatch.fnmatchcase(m.name.lower(), glob) and task in (None, m.task)]
    if not found:
        where = f" with task {task}" if task else ""
        raise _none_match(f"model{where}", pattern, [m.name for m in catalog], "")
    return found


def find_timm_models(pattern: str | None = None, task: str | None = None) -> list[ModelInfo]:
    """timm models whose name matches ``pattern``, in timm's order, named as MODEL
    (``timm:resnet18``), their pretrained tags as ``weights`` (timm's default first).
    HookscopeError: timm is not installed, a task other than classification, or no match."""
    from hookscope.sources.base import import_optional
    from hookscope.sources.timm import PREFIX, pretrained_tags

    timm = import_optional("timm", "timm")
    if task is not None and task != "classification":
        raise HookscopeError(f"Unknown task {task!r} for timm models: they are all "
                             "classification models.")
    glob = name_matcher(pattern.removeprefix(PREFIX) if pattern else pattern)
    names = [n for n in timm.list_models() if fnmatch.fnmatchcase(n.lower(), glob)]
    if not names:
        raise _none_match("timm model", pattern, timm.list_models(), " --source timm")
    with_weights = set(timm.list_pretrained())
    tags = {name: pretrained_tags(name, with_weights) for name in names}  # timm's natural order
    return [ModelInfo(f"{PREFIX}{name}", "classification", weights, weights[0] if weights else None)
            for name, weights in tags.items()]


def find_hf_models(path: str | None = None, task: str | None = None) -> list[ModelInfo]:
    """The Hugging Face model folders at ``path`` (itself, or its sub-folders), as
    ``hf:FOLDER`` with their task, files (``weights``) and architecture (``default``), from
    the JSON files only (HookscopeError: no path, not a folder, or no model folder there)."""
    from hookscope.sources.hf import PREFIX, WEIGHT_FILES, config_json

    if not path:
        raise HookscopeError("`hookscope models --source hf PATH` needs the PATH of a folder "
                             "(a save_pretrained folder, or one that holds several).")
    root = Path(path.removeprefix(PREFIX)).expanduser()
    if not root.is_dir():
        raise HookscopeError(f"{path}: not a folder; `hookscope models --source hf PATH` "
                             "lists the model folders under PATH.")
    folders = [root] if (root / "config.json").is_file() else sorted(
        p for p in root.iterdir() if (p / "config.json").is_file())
    if not folders:
        raise HookscopeError(f"{path}: no config.json in it or its sub-folders; it holds no "
                             "save_pretrained model.")
    found = []
    for folder in folders:
        raw = config_json(folder)
        arch = " ".join(raw.get("architectures") or [])
        kind = "segmentation" if "Segmentation" in arch else "classification" \
            if "Classification" in arch else "custom"
        files = [n for n in (*WEIGHT_FILES, "preprocessor_config.json") if (folder / n).is_file()]
        if task in (None, kind):
            found.append(ModelInfo(f"{PREFIX}{folder}", kind, files, arch or raw.get("model_type")))
    if not found:
        raise HookscopeError(f"No model folder with task {task} under {path}.")
    return found
