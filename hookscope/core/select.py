"""Which modules to hook: a :class:`Selection` (every command's ``--layers``, ``--type``,
``--all-modules``, ``--max-depth``) and the :class:`Site` of each module it selects.
Torch-free at import, so the command line builds a selection before torch loads."""

from __future__ import annotations

import fnmatch
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from hookscope.core.errors import HookscopeError, at_least_one, param, suggest

if TYPE_CHECKING:
    from torch import nn

R = TypeVar("R")


@dataclass(frozen=True)
class Site:
    """A module selected for hooking, named as in ``model.named_modules()``."""

    name: str
    type: str
    depth: int
    module: nn.Module = field(compare=False, repr=False, hash=False)


def depth_of(name: str) -> int:
    """A dotted module name's depth: 0 for the root, 1 for its children."""
    return 0 if not name else name.count(".") + 1


def is_scripted(module: nn.Module) -> bool:
    """Whether ``module`` is TorchScript (``torch.jit.script``), which takes no hooks."""
    from torch.jit import ScriptModule

    return isinstance(module, ScriptModule)


def _walk(model: nn.Module) -> tuple[list[str], list[tuple[str, nn.Module]]]:
    """One walk of ``model``: its outermost scripted modules (``""``: the model itself), whose
    subtrees cannot be hooked, and every other named module outside them. ``named_modules``
    yields a module before its submodules, so a scripted one is found before what it holds."""
    from torch.jit import ScriptModule

    found: list[str] = []
    rest = []
    for name, module in model.named_modules():
        if found and any(not s or name == s or name.startswith(s + ".") for s in found):
            continue
        if isinstance(module, ScriptModule):
            found.append(name)
        else:
            rest.append((name, module))
    return found, rest


def scripted_names(model: nn.Module) -> list[str]:
    """The outermost scripted modules of ``model`` (``""``: the model itself), whose
    subtrees cannot be hooked."""
    return _walk(model)[0]


def _unhooked(found: list[str]) -> str:
    shown = ", ".join(repr(n) if n else "the model itself" for n in found[:6])
    more = f" and {len(found) - 6} more" if len(found) > 6 else ""
    return (f"not hooked: {shown}{more} (TorchScript: hooks cannot be registered on a scripted "
            "module or its submodules; their work counts toward the module that calls them)")


def all_sites(model: nn.Module) -> list[Site]:
    """Every named module except the root, in definition order (the root only for a bare
    leaf), leaving out scripted modules and their submodules (one warning names them)."""
    found, rest = _walk(model)
    sites = [Site(name, type(module).__name__, depth_of(name), module) for name, module in rest
             if name]
    if found:
        logging.getLogger("hookscope").warning(_unhooked(found))
    if "" in found:
        return []
    return sites or [Site("", type(model).__name__, 0, model)]


def hooked_sites(model: nn.Module) -> list[Site]:
    """The model itself, then every module :func:`all_sites` can hook (the model too only
    when it is not scripted)."""
    root = [] if is_scripted(model) else [Site("", type(model).__name__, 0, model)]
    return root + [s for s in all_sites(model) if s.name]


@dataclass(frozen=True)
class Selection:
    """The modules to hook: by default every leaf (no children, or at ``max_depth``; 1 is the
    model's children); a container only by ``all_modules``, its class in ``types`` or its exact
    name in ``layers`` (fnmatch patterns). A module must satisfy both ``layers`` and ``types``."""

    layers: Sequence[str] | None = None
    types: Sequence[str] | None = None
    all_modules: bool = False
    max_depth: int | None = None

    def sites(self, model: nn.Module) -> list[Site]:
        """The selected modules of ``model``, in definition order; when nothing matches, a
        :class:`HookscopeError` says which filter excluded what."""
        layers, types, max_depth = self.layers, self.types, at_least_one("max_depth", self.max_depth)
        wanted = set(types or ())
        exact = set(layers or ())
        candidates = [s for s in all_sites(model)
                      if (max_depth is None or s.depth <= max_depth)
                      and (self.all_modules or s.type in wanted or s.name in exact or self._is_leaf(s))]
        by_name = [s for s in candidates
                   if not layers or any(fnmatch.fnmatchcase(s.name, p) for p in layers)]
        chosen = [s for s in by_name if not types or s.type in wanted]
        if chosen:
            return chosen
        raise self._no_match(model, candidates, by_name)

    def _is_leaf(self, site: Site) -> bool:
        return site.depth == self.max_depth or not any(True for _ in site.module.children())

    def _no_match(self, model: nn.Module, candidates: list[Site],
                  by_name: list[Site]) -> HookscopeError:
        """The one error that says which filter left nothing."""
        layers, types, max_depth = self.layers, self.types, self.max_depth
        kind = type(model).__name__
        everything = all_sites(model)
        if not everything:
            return HookscopeError(f"{kind} is TorchScript (scripted) as a whole, and hooks cannot "
                                  "be registered on it; load the eager model instead.")
        names = [s.name for s in everything]
        hint = " Run `hookscope layers MODEL` to list the names."
        within = f" within {param('max_depth')} {max_depth}" if max_depth is not None else ""
        if layers and not by_name:
            hidden = [n for n, _ in model.named_modules() if n not in names
                      and any(fnmatch.fnmatchcase(n, p) for p in layers)]
            if hidden and not any(fnmatch.fnmatchcase(n, p) for n in names for p in layers):
                return HookscopeError(f"{param('layers')} {' '.join(layers)} matches only "
                                      f"modules inside TorchScript (scripted) modules of {kind} "
                                      f"({', '.join(hidden[:4])}), which cannot be hooked.")
            if not any(fnmatch.fnmatchcase(n, p) for n in names for p in layers):
                close = "".join(suggest(p, names) for p in layers)
                return HookscopeError(f"{param('layers')} {' '.join(layers)} matches no module "
                                      f"of {kind}.{close}{hint}")
            return HookscopeError(
                f"{param('layers')} {' '.join(layers)} matches only containers{within}; name "
                f"one exactly, or add {param('all_modules')} to include containers.{hint}")
        present = sorted({s.type for s in everything})
        if types and not any(s.type in set(types) for s in candidates):
            close = "".join(suggest(t, present) for t in types)
            listed = ", ".join(present[:12]) + ("..." if len(present) > 12 else "")
            return HookscopeError(f"{param('types')} {' '.join(types)} matches no module of "
                                  f"{kind}{within}.{close} Types present: {listed}.")
        if layers and types:
            found = sorted({s.type for s in by_name})
            return HookscopeError(
                f"{param('layers')} {' '.join(layers)} and {param('types')} {' '.join(types)} "
                f"each match modules, but no module matches both; the modules "
                f"{param('layers')} selects are of type {', '.join(found[:8])}"
                f"{'...' if len(found) > 8 else ''}.")
        return HookscopeError(f"The selection matches no module{within}.{hint}")


#: The default selection: every leaf module.
LEAVES = Selection()


def selecting(wrapper: Callable[..., R]) -> Callable[..., R]:
    """Let callers of a library wrapper that takes one ``select`` give, instead, the keywords
    of a :class:`Selection` (``layers``, ``types``, ``all_modules``, ``max_depth``)."""
    keys = [f.name for f in fields(Selection)]

    @functools.wraps(wrapper)
    def call(*args: Any, **kwargs: Any) -> R:
        if chosen := {key: kwargs.pop(key) for key in keys if key in kwargs}:
            kwargs["select"] = Selection(**chosen)
        return wrapper(*args, **kwargs)
    return call


@selecting
def select_sites(model: nn.Module, *, select: Selection = LEAVES) -> list[Site]:
    """``Selection(layers, types, all_modules, max_depth).sites(model)``."""
    return select.sites(model)


def find_site(model: nn.Module, name: str) -> Site:
    """The site of one module by its exact dotted name (else an error with close matches)."""
    sites = {site.name: site for site in all_sites(model)}
    if name in sites:
        return sites[name]
    if name in dict(model.named_modules()):
        raise HookscopeError(f"{name!r} is inside a TorchScript (scripted) module of "
                             f"{type(model).__name__}, and hooks cannot be registered there; "
                             "choose a module outside it.")
    raise HookscopeError(f"{type(model).__name__} has no module named {name!r}."
                         f"{suggest(name, sites)} Run `hookscope layers MODEL` to list the names.")
