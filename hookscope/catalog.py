"""The models hookscope can list: torchvision names, tasks and weight enums, and timm's
architectures with their pretrained tags."""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass
from typing import Any

from hookscope.errors import HookscopeError, suggest

__all__ = ["ModelInfo", "find_hf_models", "find_models", "find_timm_models", "name_matcher"]

_WILDCARDS = set("*?[")


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
    return low if _WILDCARDS & set(low) else f"*{low}*"


def find_models(pattern: str | None = None, task: str | None = None) -> list[ModelInfo]:
    """Models whose name matches ``pattern`` (case-insensitive fnmatch), sorted by name.

    A pattern without ``*``, ``?`` or ``[`` matches any name containing it, so
    ``resnet`` finds ``resnet18`` and ``wide_resnet50_2``.

    Raises:
        HookscopeError: unknown task, or nothing matches (with close names suggested).
    """
    from torchvision.models import get_model_weights

    from hookscope.sources.torchvision import model_tasks

    tasks = model_tasks()
    if task is not None and task not in set(tasks.values()):
        known = sorted(set(tasks.values()))
        raise HookscopeError(
            f"Unknown task {task!r}.{suggest(task, known)} Tasks: {', '.join(known)}."
        )
    glob = name_matcher(pattern)
    found: list[ModelInfo] = []
    for name in sorted(tasks):
        if not fnmatch.fnmatchcase(name.lower(), glob):
            continue
        if task is not None and tasks[name] != task:
            continue
        try:
            enum = get_model_weights(name)
        except (ValueError, KeyError):
            enum = None
        members = [m.name for m in enum] if enum is not None else []
        default = getattr(enum, "DEFAULT", None) if enum is not None else None
        found.append(ModelInfo(name, tasks[name], members,
                               default.name if default is not None else None))
    if not found:
        where = f" with task {task}" if task else ""
        hint = suggest(pattern.strip("*?[]"), tasks) if pattern else ""
        raise HookscopeError(
            f"No model{where} matches {pattern!r}.{hint} Run `hookscope models` to list them all."
        )
    return found


def find_timm_models(pattern: str | None = None, task: str | None = None) -> list[ModelInfo]:
    """timm models whose name matches ``pattern`` (as :func:`find_models`), in timm's order.

    Each name is the MODEL string that loads it (``timm:resnet18``); ``weights`` lists its
    pretrained tags with timm's default first (``--weights TAG``), empty when it has none.

    Raises:
        HookscopeError: timm is not installed, a task other than classification, or
            nothing matches (with close names suggested).
    """
    from hookscope.sources.timm import PREFIX, import_timm, pretrained_tags

    timm = import_timm()
    if task is not None and task != "classification":
        raise HookscopeError(f"Unknown task {task!r} for timm models: they are all "
                             "classification models.")
    glob = name_matcher(pattern.removeprefix(PREFIX) if pattern else pattern)
    names = [n for n in timm.list_models() if fnmatch.fnmatchcase(n.lower(), glob)]
    if not names:
        hint = suggest(pattern.strip("*?[]"), timm.list_models()) if pattern else ""
        raise HookscopeError(f"No timm model matches {pattern!r}.{hint} Run `hookscope models "
                             "--source timm` to list them all.")
    with_weights = set(timm.list_pretrained())
    found = []
    for name in names:  # timm's natural order: resnet18 before resnet101
        tags = pretrained_tags(name, with_weights)
        found.append(ModelInfo(f"{PREFIX}{name}", "classification", tags,
                               tags[0] if tags else None))
    return found


def find_hf_models(path: str | None = None, task: str | None = None) -> list[ModelInfo]:
    """The Hugging Face model folders at ``path`` (itself, or its sub-folders): each as
    ``hf:FOLDER``, its task, its files as ``weights`` and its architecture as ``default``.

    Raises:
        HookscopeError: no path, not a folder, or no model folder there.
    """
    from hookscope.sources.hf import describe

    if not path:
        raise HookscopeError("`hookscope models --source hf PATH` needs the PATH of a folder "
                             "(a save_pretrained folder, or one that holds several).")
    found = [ModelInfo(d["name"], d["task"], d["weights"], d["default"])
             for d in describe(path) if task is None or d["task"] == task]
    if not found:
        raise HookscopeError(f"No model folder with task {task} under {path}.")
    return found
