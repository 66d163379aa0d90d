"""hookscope: inspect PyTorch vision models through hooks that are always removed.

The package root stays import-light (no torch) so that ``hookscope --help`` is fast;
the Python API is loaded on first attribute access.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "collect_stats": "hookscope.probes.stats",
    "StatsReport": "hookscope.probes.stats",
    "LayerStats": "hookscope.probes.stats",
    "load_model": "hookscope.sources",
    "HookscopeError": "hookscope.core.errors",
    "Hooks": "hookscope.core.hooks",
    "Tracer": "hookscope.core.hooks",
    "select_sites": "hookscope.core.select",
    "Selection": "hookscope.core.select",
    "gradcam": "hookscope.cam.probe",
    "explain": "hookscope.cam.probe",
    "CamResult": "hookscope.cam.result",
    "attribute": "hookscope.cam.attribution",
    "collect_grads": "hookscope.probes.grads",
    "GradReport": "hookscope.probes.grads",
    "model_structure": "hookscope.probes.structure",
    "run_debug": "hookscope.probes.debug",
    "find_models": "hookscope.catalog",
    "cam_metrics": "hookscope.cam.faithfulness",
    "watch": "hookscope.training.watch",
    "Watch": "hookscope.training.watch",
    "NonFiniteError": "hookscope.training.nonfinite",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hookscope' has no attribute {name!r}")
