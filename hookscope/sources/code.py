"""Models from your own code: ``path/to/file.py:NAME`` or ``package.module:NAME``; and
whole pickled models (a ``torch.save(model)`` file).

NAME (maybe dotted: ``Outer.build``) is an ``nn.Module`` subclass or a function that returns
one, called with the ``model_args``. Importing it runs the user's code, named explicitly.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import os
import pickle
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from hookscope.core.errors import HookscopeError, clip, param, suggest
from hookscope.inputs.preprocess import Preprocess, with_overrides
from hookscope.sources.base import LoadedModel, LoadOptions, ModelSpec, Source, is_path, register
from hookscope.sources.checkpoints import (
    Checkpoint,
    fit,
    head_classes,
    is_pickle,
    open_checkpoint,
)

__all__ = ["build", "check_eager", "check_weights", "load_code", "load_data", "load_pickled",
           "parse_model_args"]

#: ``file.py:Name`` or ``package.module:Name`` (NAME may be dotted: ``module:Outer.factory``).
_SPEC = re.compile(r"^(?P<where>[^:]+\.py|[A-Za-z_][\w.]*):(?P<name>[A-Za-z_][\w.]*)$")
#: A ``--model-arg`` value kept as a string when it is not a Python literal: a word or a path.
_PLAIN = re.compile(r"^[\w./\\~:@-]+$")
#: What every "what is NAME" error ends with.
_WANT = "NAME must be an nn.Module subclass or a function that returns an nn.Module."


def parse_model_args(args: Sequence[str]) -> dict[str, Any]:
    """``key=value`` strings as keyword arguments: Python literals, or plain words and paths
    (``act=relu``, ``path=a/b.pt``) kept as strings."""
    parsed: dict[str, Any] = {}
    for arg in args:
        key, sep, text = arg.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key.isidentifier():
            raise HookscopeError(f"{param('model_args')} {arg!r} is not key=value with a Python "
                                 "name as the key, e.g. width=32.")
        if key in parsed:
            raise HookscopeError(f"{param('model_args')} {key} is given twice; give each argument once.")
        try:
            parsed[key] = ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            if not _PLAIN.match(text):
                raise HookscopeError(
                    f"{param('model_args')} {arg!r}: {text!r} is not a Python literal (a number, string, "
                    f"list, tuple, dict, True, False or None); quote text: {key}='...'.") from None
            parsed[key] = text
    return parsed


@contextmanager
def first_on_path(folder: str) -> Iterator[None]:
    """``folder`` first on ``sys.path`` while the user's code is imported, as Python does."""
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        if folder in sys.path:
            sys.path.remove(folder)


def _failed(what: str, exc: BaseException, folder: Path | None = None,
            hint: str = "") -> HookscopeError:
    """One line for the user's code raising: the exception, its message and where (`` (at
    net.py:12)``: the last line of the user's code in ``folder`` in the traceback)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if folder is not None and not f.filename.startswith("<")  # <frozen ...>, <string>
              and Path(f.filename).resolve().is_relative_to(folder)]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return HookscopeError(f"{what} raised {type(exc).__name__}: {clip(str(exc), 200)}{where}.{hint}")


def _import_file(path: Path) -> ModuleType:
    """Import a ``.py`` file under a unique module name, registered in ``sys.modules`` (so
    pickle and dataclasses find it), with its folder first on ``sys.path``."""
    if not path.is_file():
        raise HookscopeError(f"Model file not found: {path}. MODEL file.py:NAME names a Python "
                             "file that defines NAME.")
    path = path.resolve()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_hookscope_{stem}_{digest}"
    spec: Any = importlib.util.spec_from_file_location(name, path)  # a .py file: never None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with first_on_path(str(path.parent)):
            spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise _failed(f"Importing {path}", exc, path.parent) from None
    return module


def _import_module(name: str) -> ModuleType:
    """Import ``package.module`` with the current directory first on ``sys.path``."""
    cwd = os.getcwd()
    try:
        with first_on_path(cwd):
            return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(f"{exc.name}.")):
            raise _failed(f"Importing {name}", exc, Path(cwd)) from None
        raise HookscopeError(
            f"No module named {exc.name!r} in the current directory ({cwd}) or the installed "
            f"packages. Run hookscope from the folder that holds it, or name the file: "
            f"MODEL path/to/{name.replace('.', '/')}.py:NAME.") from None
    except (Exception, SystemExit) as exc:
        raise _failed(f"Importing {name}", exc, Path(cwd)) from None


def _module_classes(module: ModuleType) -> list[str]:
    """The nn.Module subclasses ``module`` defines itself."""
    return [n for n, v in vars(module).items() if isinstance(v, type) and
            issubclass(v, nn.Module) and v.__module__ == module.__name__ and n[:1] != "_"]


def _attribute(module: ModuleType, dotted: str, where: str) -> Any:
    """``module.<dotted>``, or one line with close names when a part is missing."""
    obj: Any = module
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            owner = where if i == 0 else f"{where}:{'.'.join(parts[:i])}"
            hint = suggest(part, [n for n in dir(obj) if not n.startswith("_")])
            if not hint and i == 0 and _module_classes(module):
                hint = f" It defines the nn.Module classes: {', '.join(_module_classes(module))}."
            raise HookscopeError(f"{owner} has no attribute {part!r}.{hint} {_WANT}") from None
    return obj


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C extensions have none
        return None


def _accepts(sig: inspect.Signature | None) -> str:
    """`` It accepts: width=8, classes=3.``: the callable's parameters, for error messages."""
    if sig is None:
        return ""
    shown = []
    for p in sig.parameters.values():
        star = "*" if p.kind == p.VAR_POSITIONAL else "**" if p.kind == p.VAR_KEYWORD else ""
        default = "" if p.default is p.empty else f"={clip(repr(p.default), 30)}"
        shown.append(f"{star}{p.name}{default}")
    return f" It accepts: {', '.join(shown)}." if shown else " It takes no arguments."


def _check_arguments(fn: Any, kwargs: dict[str, Any], label: str) -> None:
    """Refuse arguments the callable cannot take before running it, naming those it can."""
    sig = _signature(fn)
    if sig is None:
        return
    params = sig.parameters.values()
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in kwargs if k not in names]
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in params):
        problem = f"got an unexpected argument {unknown[0]!r}.{suggest(unknown[0], names)}"
    else:
        try:
            sig.bind(**kwargs)
            return
        except TypeError as exc:
            problem = f"{exc}."
    raise HookscopeError(f"{label}() {problem}{_accepts(sig)} Give arguments with "
                         f"{param('model_args')} key=value.")


def _describe(value: Any) -> str:
    if value is None:
        return "None (does it forget to return the model?)"
    return f"a {type(value).__module__}.{type(value).__qualname__}".replace("a builtins.", "a ")


def check_eager(model: nn.Module, what: str) -> None:
    """Refuse a TorchScript module: hooks need an eager ``nn.Module``."""
    if isinstance(model, torch.jit.ScriptModule):
        raise HookscopeError(f"{what} is a TorchScript module; hooks need an eager nn.Module. "
                             "Return the Python module itself (before torch.jit.script).")


def _construct(obj: Any, kwargs: dict[str, Any], label: str, folder: Path | None) -> nn.Module:
    """The model NAME stands for: a class or a factory, called with ``kwargs``; a module
    instance, as is."""
    if isinstance(obj, nn.Module):
        if kwargs:
            raise HookscopeError(f"{label} is a model instance, built when its code was "
                                 f"imported, so {param('model_args')} cannot reach it; name "
                                 "its class or a function that builds it instead.")
        check_eager(obj, label)
        return obj
    if isinstance(obj, type) and not issubclass(obj, nn.Module):
        raise HookscopeError(f"{label} is the class {obj.__qualname__}, which is not an "
                             f"nn.Module subclass. {_WANT}")
    if not callable(obj):
        raise HookscopeError(f"{label} is {_describe(obj)}, not a class or function. {_WANT}")
    call = clip(f"{label}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})", 160)
    _check_arguments(obj, kwargs, label)
    try:
        result = obj(**kwargs)
    except (Exception, SystemExit) as exc:
        # Arguments passed on through **kwargs fail inside: say what the callable takes.
        hint = _accepts(_signature(obj)) if isinstance(exc, TypeError) and \
            "argument" in str(exc) else ""
        raise _failed(call, exc, folder, hint) from None
    if not isinstance(result, nn.Module):
        raise HookscopeError(f"{call} returned {_describe(result)}, not an nn.Module. {_WANT}")
    check_eager(result, f"What {call} returned")
    return result


def _import_target(spec: str, prefix: str = "") -> tuple[Any, Path | None]:
    """NAME of ``file.py:NAME`` or ``package.module:NAME``, imported, and its folder."""
    found = _SPEC.match(spec.strip())
    if found is None:
        raise HookscopeError(f"{prefix}{spec!r} is not file.py:NAME or package.module:NAME.")
    where, dotted = found["where"], found["name"]
    py = where.endswith(".py")
    module = _import_file(Path(where).expanduser()) if py else _import_module(where)
    file = getattr(module, "__file__", None)  # a namespace package has none
    folder = Path(file).resolve().parent if file else None
    return _attribute(module, dotted, where), folder


def build(spec: str, model_args: Sequence[str] = (), seed: int = 0) -> nn.Module:
    """Import ``file.py:NAME`` or ``package.module:NAME`` and build the model, seeded in a
    forked RNG (the caller's global RNG is left untouched)."""
    kwargs = parse_model_args(model_args)  # before the user's code runs: fail fast
    with torch.random.fork_rng(devices=[]):  # the user's code may draw or seed at import
        obj, folder = _import_target(spec)
        torch.manual_seed(seed)  # just before building: as `manual_seed(seed); Net(...)` would
        return _construct(obj, kwargs, spec.strip(), folder)


def load_data(spec: str, seed: int = 0) -> Any:
    """The data set ``file.py:NAME`` or ``package.module:NAME`` names (``data``), with the
    trust a model's code has: NAME itself when it is a data set or an iterable, else what
    calling it with no arguments returns, seeded as :func:`build` seeds a model."""
    with torch.random.fork_rng(devices=[]):
        obj, folder = _import_target(spec, f"{param('data')} ")
        data_like = hasattr(obj, "__iter__") or hasattr(obj, "__getitem__")
        if isinstance(obj, type) or (callable(obj) and not data_like):
            torch.manual_seed(seed)
            try:
                obj = obj()
            except (Exception, SystemExit) as exc:
                raise _failed(f"{param('data')} {spec.strip()}()", exc, folder) from None
    return obj


def check_weights(options: LoadOptions, what: str) -> None:
    """Refuse a weights name (such as DEFAULT) and ``num_classes`` for a model that is not
    torchvision's: its weights are auto, none or a file."""
    weights = options.weights.strip()
    if weights.lower() not in ("auto", "none") and not is_path(weights):
        raise HookscopeError(
            f"{param('weights')} {weights!r}: {what} has no named weights; use auto or none "
            "(the model as it comes) or a checkpoint file.")
    if options.num_classes is not None:
        raise HookscopeError(
            f"{param('num_classes')} sets torchvision builders' heads; {what} gets its class "
            f"count from its own code (for code: {param('model_args')} num_classes=N, or "
            "whatever its constructor calls it).")


def load_weights(model: nn.Module, name: str, options: LoadOptions) -> Checkpoint | None:
    """Load ``options.weights`` into ``model`` when it is a file (a fine-tuned one is refused,
    naming the model_args to pass); None for auto and none."""
    if options.weights.strip().lower() in ("auto", "none"):
        return None
    found = open_checkpoint(options.weights.strip(), trust=options.trust_checkpoint)
    path = found.path
    state = found.module.state_dict() if found.module is not None else found.state
    assert state is not None  # open_checkpoint returns one or the other
    classes = head_classes(model, state)
    if classes is not None:
        raise HookscopeError(
            f"{path} is fine-tuned: its classifier has {classes} classes, not {name}'s as "
            f"built. Pass {param('model_args')} num_classes={classes} (or whatever the "
            "constructor calls its class count).")
    fit(model, state, path=path, name=name)
    return found


def _parse(spec: str) -> ModelSpec | None:
    return ModelSpec("code", spec, spec, "custom") if _SPEC.match(spec) else None


def load_code(spec: ModelSpec, options: LoadOptions) -> LoadedModel:
    """Load the nn.Module subclass or factory function NAME from the user's code."""
    check_weights(options, "a model from code")
    model = build(spec.target, options.model_args, options.seed)
    found = load_weights(model, spec.name, options)
    loaded = f"file:{found.path}" if found is not None else f"as constructed (seed {options.seed})"
    return custom_model(spec, model, options, loaded, found)


def custom_model(spec: ModelSpec, model: nn.Module, options: LoadOptions, loaded: str,
                 labelled: Checkpoint | None) -> LoadedModel:
    """A model from code or a pickle: default preprocessing, and ``labelled``'s labels."""
    labels, labels_from = (labelled.labels, labelled.labels_from) if labelled else (None, None)
    return LoadedModel(
        name=spec.name, model=model, task="custom", weights_requested=options.weights,
        weights_loaded=loaded, preprocess=with_overrides(Preprocess(), size=options.size),
        categories=labels, source=spec.source, labels_from=labels_from)


register(Source("code", _parse, load_code))


# ----------------------------------------------------------------- whole pickled models
# The path of a ``torch.save(model)`` file. Unpickling a module runs code the file names, so it
# needs ``trust_checkpoint``. TorchScript archives and ``torch.export`` programs are refused:
# they have no eager modules to hook.

PICKLE_SUFFIXES = {".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".pt2", ".ts"}


def _unpickle(path: Path, trust: bool) -> Checkpoint:
    """Open ``path`` (its classes importable from the current directory too, as with ``python
    -m``), or say in one line why it does not load."""
    try:
        with first_on_path(os.getcwd()):
            return open_checkpoint(path, trust=trust)
    except HookscopeError as exc:
        cause = exc.__context__  # open_checkpoint raises "from None": the cause is kept here
        if not trust and isinstance(cause, pickle.UnpicklingError) and is_pickle(path):
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


def _parse_pickle(spec: str) -> ModelSpec | None:
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".py":  # code, not a pickle: the form is file.py:NAME
        raise HookscopeError(
            f"{spec} is Python code, not a pickled model: name the model in it as "
            f"{spec}:NAME (an nn.Module subclass, or a function that returns one).")
    if path.suffix.lower() not in PICKLE_SUFFIXES and not path.is_file():
        return None
    return ModelSpec("pickle", spec, str(path), "custom")


def load_pickled(spec: ModelSpec, options: LoadOptions) -> LoadedModel:
    """Load a file holding a whole nn.Module (needs ``trust_checkpoint``)."""
    path = Path(spec.target)
    if not path.is_file():
        raise HookscopeError(f"Model file not found: {path}. MODEL is a torchvision name (`hookscope "
                             "models`), timm:NAME, file.py:NAME, package.module:NAME, or a pickled "
                             "model's path.")
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


register(Source("pickle", _parse_pickle, load_pickled))
