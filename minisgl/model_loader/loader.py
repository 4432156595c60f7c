"""Build the model class for a ModelConfig and fill it from the checkpoint.

Mirrors python/sglang/srt/model_loader/loader.py (DefaultModelLoader.load_model):
construct on the target device in the target dtype, then stream weights into
each parameter's weight_loader. SGLang also has sharded, dummy, remote and
quantized loaders; minisgl reads local safetensors (a GGUF file is converted to
safetensors once, when ServerArgs resolves the model path: model_loader/gguf.py).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from minisgl.configs.model_config import ModelConfig
from minisgl.model_loader.weight_utils import safetensors_weights_iterator
from minisgl.models.registry import ModelRegistry


@contextlib.contextmanager
def set_default_torch_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def get_model(model_config: ModelConfig, device: str) -> nn.Module:
    model_cls = ModelRegistry.resolve_model_cls(model_config.architectures)
    with set_default_torch_dtype(model_config.dtype), torch.device(device):
        model = model_cls(model_config.hf_config)
    # Big tensors arrive already in the model's dtype: no float32 copy of one is ever whole in memory.
    model.load_weights(safetensors_weights_iterator(model_config.model_path, model_config.dtype))
    # As SGLang's DefaultModelLoader.load_model: layers may re-lay their weights out for the device.
    for module in model.modules():
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    return model.eval()
