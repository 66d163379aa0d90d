"""The torchvision source: every name in ``torchvision.models.list_models()``."""

from __future__ import annotations

from hookscope.sources.base import LoadedModel, LoadOptions, ModelSpec, register


class Torchvision:
    """torchvision's models, weights enums and preprocessing presets."""

    name = "torchvision"

    def parse(self, spec: str) -> ModelSpec | None:
        from hookscope.models import input_ndim, model_tasks

        task = model_tasks().get(spec)
        if task is None:
            return None
        return ModelSpec("torchvision", spec, spec, task, input_ndim(spec))

    def load(self, spec: ModelSpec, options: LoadOptions) -> LoadedModel:
        from hookscope.models import load_torchvision

        return load_torchvision(spec, options)


register(Torchvision())
