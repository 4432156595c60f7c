"""Architecture name (config.json "architectures") -> model class.

Mirrors python/sglang/srt/models/registry.py (ModelRegistry). SGLang scans
every module in models/ for an ``EntryClass``; minisgl lists its few modules.
"""

from __future__ import annotations

import importlib

from torch import nn

_MODEL_MODULES = ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"]


def _load_registry() -> dict[str, type[nn.Module]]:
    registry = {}
    for module_name in _MODEL_MODULES:
        module = importlib.import_module(f"minisgl.models.{module_name}")
        registry[module.EntryClass.__name__] = module.EntryClass
    return registry


class ModelRegistry:
    models: dict[str, type[nn.Module]] = {}

    @classmethod
    def resolve_model_cls(cls, architectures: list[str]) -> type[nn.Module]:
        if not cls.models:
            cls.models = _load_registry()
        for arch in architectures:
            if arch in cls.models:
                return cls.models[arch]
        raise ValueError(
            f"unsupported architecture {architectures}; minisgl supports {sorted(cls.models)}"
        )
