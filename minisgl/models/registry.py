"""Architecture name (config.json "architectures") -> model class.

Mirrors python/sglang/srt/models/registry.py (ModelRegistry). SGLang scans
every module in models/ for an ``EntryClass``; minisgl lists its few modules.
As in SGLang, a module may serve several architectures (EntryClass is then a list).
"""

from __future__ import annotations

import importlib

from torch import nn

_MODEL_MODULES = ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "deepseek_v2", "llama_eagle", "llama_eagle3"]


def _load_registry() -> dict[str, type[nn.Module]]:
    registry = {}
    for module_name in _MODEL_MODULES:
        module = importlib.import_module(f"minisgl.models.{module_name}")
        entries = module.EntryClass if isinstance(module.EntryClass, list) else [module.EntryClass]
        for model_cls in entries:
            registry[model_cls.__name__] = model_cls
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
        raise ValueError(f"unsupported architecture {architectures}; minisgl supports {sorted(cls.models)}")
