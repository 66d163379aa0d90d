"""The one hook engine: every hook hookscope registers goes through here and is removed.

:class:`Tracer` turns hook calls on selected sites into :class:`Call` objects, each site's
name bound with :func:`functools.partial`, never captured from a loop variable."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import chain, dropwhile
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hookscope.core.errors import ForwardError, clip
from hookscope.core.select import Site, all_sites, depth_of, is_scripted

__all__ = ["Call", "Hooks", "Tracer", "first_tensor", "hook_count", "raised_in_machinery",
           "model_device", "model_dtype", "tensor_shapes", "tensors"]


#: Where hook machinery lives: hookscope's own package, and the module hooks torch
#: installs for it (``FlopCounterMode``'s module tracker, the full-backward-hook wrapper).
_HOOKSCOPE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package
_TORCH_HOOKS = tuple(os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "utils", f)
                     for f in ("module_tracker.py", "hooks.py"))


def raised_in_machinery(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside hook machinery: a frame, after the driver's own
    leading ones, in hookscope or torch's module-hook helpers (a wrapper's ``forward`` aside)."""
    codes = (frame.f_code for frame, _ in traceback.walk_tb(exc.__traceback__))
    frames = ((os.path.abspath(code.co_filename), code.co_name) for code in codes)
    later = dropwhile(lambda frame: frame[0].startswith(_HOOKSCOPE), frames)
    return any((path.startswith(_HOOKSCOPE) or path in _TORCH_HOOKS) and name != "forward"
               for path, name in later)


@dataclass(frozen=True)
class Call:
    """One execution of a site's module; ``index`` counts calls within one forward pass."""

    site: Site
    index: int

    @property
    def name(self) -> str:
        return self.site.name

    @property
    def key(self) -> tuple[str, int]:
        return (self.site.name, self.index)


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor in a tensor, tuple, list or mapping (depth first), or None."""
    return next(iter(tensors(obj)), None)


def tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) tensor, tuple, list or mapping, in order."""
    if isinstance(obj, torch.Tensor):  # the common case, once per hooked call
        return [obj]
    found: list[torch.Tensor] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):  # before the slower abstract-class check
            stack.extend(reversed(item))
        elif isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
    return found


def tensor_shapes(obj: Any) -> list[list[int]]:
    """Shapes of every tensor in a (nested) tensor, tuple, list or mapping, in order."""
    return [list(t.shape) for t in tensors(obj)]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU for a stateless model)."""
    first = next(chain(model.parameters(), model.buffers()), None)
    return first.device if first is not None else torch.device("cpu")


def model_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's first floating-point parameter or buffer (None: none)."""
    first = next((t for t in chain(model.parameters(), model.buffers())
                  if t.is_floating_point()), None)
    return first.dtype if first is not None else None


def hook_count(model: nn.Module) -> int:
    """Hooks registered on the model and its submodules (forward, pre-forward, backward)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(m._backward_pre_hooks) for m in model.modules())


class Hooks:
    """Owns the handles given to :meth:`keep` (each ``register_*hook`` call's); as a context
    manager, removes all of them on any exit."""

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []

    def keep(self, handle: RemovableHandle) -> RemovableHandle:
        self._handles.append(handle)
        return handle

    def remove(self) -> None:
        """Remove every handle; safe to call twice."""
        while self._handles:
            self._handles.pop().remove()

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


EnterFn = Callable[[Call, tuple[Any, ...], dict[str, Any]], None]
ExitFn = Callable[[Call, tuple[Any, ...], dict[str, Any], Any], Any]


class Tracer(Hooks):
    """Per-call hooks on selected sites: ``on_enter(call, args, kwargs)`` before the module
    (seeing inputs before an in-place module overwrites them), ``on_exit(call, args, kwargs,
    output)`` after it (a non-None return replaces the output). Call indices restart at each
    forward pass; :attr:`active` is the stack of calls entered but not finished."""

    def __init__(self, model: nn.Module, sites: Iterable[Site], *,
                 on_enter: EnterFn | None = None, on_exit: ExitFn | None = None) -> None:
        super().__init__()
        self.model, self.sites = model, list(sites)
        self.on_enter, self.on_exit = on_enter, on_exit
        self.active: list[tuple[Call, tuple[Any, ...], dict[str, Any]]] = []
        #: The exception a callback raised, not to be blamed on the running module.
        self.callback_error: BaseException | None = None
        self.started = False  # the model's own forward has begun
        self.muted = False  # callbacks stay silent while :meth:`locate` runs a pass again
        self._counts: dict[str, int] = {}

    def reset(self) -> None:
        """Forget call counts and the active stack (done automatically per forward pass)."""
        self._counts.clear()
        self.active.clear()
        self.callback_error = None
        self.started = False

    def _root_pre(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self.muted:
            return
        if not self.active:
            self._counts.clear()
        self.started = True

    def _pre(self, site: Site, module: nn.Module, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> None:
        if self.muted:
            return
        index = self._counts.get(site.name, 0)
        self._counts[site.name] = index + 1
        call = Call(site, index)
        self.active.append((call, args, kwargs))
        if self.on_enter is not None:
            self._callback(self.on_enter, call, args, kwargs)

    def _post(self, site: Site, module: nn.Module, args: tuple[Any, ...],
              kwargs: dict[str, Any], output: Any) -> Any:
        if self.muted:
            return None
        # This site's innermost active call (a module may recurse into itself): mostly the last.
        i = len(self.active) - 1
        while self.active[i][0].site is not site:
            i -= 1
        call = self.active.pop(i)[0]
        return None if self.on_exit is None else \
            self._callback(self.on_exit, call, args, kwargs, output)

    def _callback(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except BaseException as exc:
            self.callback_error = exc
            raise

    def attach(self) -> Tracer:
        """Register the hooks (done by ``with``); prepend so hookscope sees outputs first."""
        if self._handles:
            return self
        try:
            for site in self.sites:
                self.keep(site.module.register_forward_pre_hook(
                    partial(self._pre, site), with_kwargs=True, prepend=True))
                self.keep(site.module.register_forward_hook(
                    partial(self._post, site), with_kwargs=True, prepend=True))
            # Registered last with prepend, so it runs first: before the root's own site.
            if not is_scripted(self.model):
                self.keep(self.model.register_forward_pre_hook(self._root_pre, prepend=True))
        except BaseException:
            self.remove()
            raise
        return self

    def locate(self, again: Callable[[], Any], exc: BaseException) -> ForwardError:
        """The :class:`ForwardError` for ``exc``: ``again`` repeats the failed pass with a
        locator on every module (this tracer muted), else the traceback names the module."""
        locator = Tracer(self.model, all_sites(self.model))
        self.muted = True
        try:
            with locator:
                again()
        except type(exc):
            return locator.forward_error(exc)
        except Exception:  # noqa: S110 - another failure: the traceback names the place
            pass
        finally:
            self.muted = False
        return self.traceback_error(exc)

    def traceback_error(self, exc: BaseException) -> ForwardError:
        """Name the innermost module whose code is among ``exc``'s traceback frames."""
        names = {id(m): n for n, m in self.model.named_modules()}
        found = None
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            owner = frame.f_locals.get("self")
            if id(owner) in names:
                found = owner
        if found is None:
            return ForwardError(f"The forward pass failed: {_what(exc)}", cause=exc)
        name = names[id(found)]
        self.active = [(Call(Site(name, type(found).__name__, depth_of(name), found), 0), (), {})]
        self.started = True
        return self.forward_error(exc)

    def forward_error(self, exc: BaseException) -> ForwardError:
        """Wrap an exception raised by the model with the innermost running module."""
        inner = self.active[-1] if self.active else None  # the call that raised
        if inner is None and not self.started:
            return ForwardError(f"The forward pass failed before the model started: {_what(exc)}",
                                cause=exc)
        if inner is None:  # between submodules, in the model's own code
            kind = type(self.model).__name__
            return ForwardError(f"The forward pass failed in the model's own code ({kind}): "
                                f"{_what(exc)}", module="", type_name=kind, call=0, depth=0,
                                cause=exc)
        call, args, kwargs = inner
        shapes = tensor_shapes(args) + tensor_shapes(kwargs)
        if call.name:
            again = f" (call {call.index})" if call.index else ""
            where = f"{call.name}{again} ({call.site.type}, input shapes {shapes})"
        else:
            where = f"the model's own code ({call.site.type}) (input shapes {shapes})"
        return ForwardError(f"The forward pass failed in {where}: {_what(exc)}", module=call.name,
                            type_name=call.site.type, call=call.index, depth=call.site.depth,
                            input_shapes=shapes, cause=exc)

    def __enter__(self) -> Tracer:
        self.reset()
        return self.attach()


def _what(exc: BaseException) -> str:
    """``Type: message``, the message on one line and clipped."""
    return f"{exc.__class__.__name__}: {clip(str(exc)) or exc.__class__.__name__}"
