"""hookscope: inspect PyTorch vision models through hooks that are always removed.

The package root stays import-light (no torch) so that ``hookscope --help`` is fast;
the Python API is loaded on first attribute access.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "collect_stats": "hookscope.stats",
    "StatsReport": "hookscope.stats",
    "LayerStats": "hookscope.stats",
    "load_model": "hookscope.sources",
    "HookscopeError": "hookscope.errors",
    "Hooks": "hookscope.hooks",
    "Tracer": "hookscope.hooks",
    "select_sites": "hookscope.hooks",
    "gradcam": "hookscope.cam",
    "CamResult": "hookscope.cam",
    "collect_grads": "hookscope.grads",
    "GradReport": "hookscope.grads",
    "model_structure": "hookscope.structure",
    "run_debug": "hookscope.debug",
    "find_models": "hookscope.catalog",
    "cam_metrics": "hookscope.cam_faithfulness",
    "watch": "hookscope.training.watch",
    "Watch": "hookscope.training.watch",
    "NonFiniteError": "hookscope.training.nonfinite",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hookscope' has no attribute {name!r}")
