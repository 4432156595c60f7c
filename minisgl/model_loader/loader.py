"""Build the model class for a ModelConfig and fill it from the checkpoint.

Mirrors python/sglang/srt/model_loader/loader.py (DefaultModelLoader.load_model):
construct on the target device in the target dtype, then stream weights into
each parameter's weight_loader. The model's QuantizationConfig (get_quant_config, as
SGLang's model_loader/weight_utils.py) decides which parameters each layer creates. SGLang
also has sharded, dummy and remote loaders; minisgl reads local safetensors, or, under
``--quantization gguf``, the blocks of the .gguf file the model folder points at (SGLang's
GGUFModelLoader: model_loader/gguf.py).
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import nn

from minisgl.configs.model_config import ModelConfig
from minisgl.layers.quantization import get_quantization_config
from minisgl.layers.quantization.base_config import QuantizationConfig, set_default_quant_config
from minisgl.layers.quantization.gguf import GGUFConfig
from minisgl.model_loader.gguf import gguf_quant_weights_iterator
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


def get_quant_config(model_config: ModelConfig) -> Optional[QuantizationConfig]:
    """The scheme ModelConfig settled on, read from the checkpoint's quantization_config
    ({} when only --quantization names it: a float checkpoint to quantize while loading)."""
    if model_config.quantization is None:
        return None
    try:
        quant_cls = get_quantization_config(model_config.quantization)
    except ValueError as e:
        source = "quantization_config.quant_method" if model_config.quant_hf_config else "quantization"
        raise ValueError(f"{model_config.model_path}: {source}={model_config.quantization!r}: {e}") from None
    return quant_cls.from_config(model_config.quant_hf_config or {})


def get_model(model_config: ModelConfig, device: str) -> nn.Module:
    model_cls = ModelRegistry.resolve_model_cls(model_config.architectures)
    quant_config = get_quant_config(model_config)
    with set_default_torch_dtype(model_config.dtype), torch.device(device), set_default_quant_config(quant_config):
        model = model_cls(model_config.hf_config)
    if isinstance(quant_config, GGUFConfig):
        weights = gguf_quant_weights_iterator(quant_config.gguf_file, model_config.hf_config, model_config.dtype)
    else:
        # Big tensors arrive already in the model's dtype: no float32 copy of one is ever whole in memory.
        weights = safetensors_weights_iterator(model_config.model_path, model_config.dtype)
    model.load_weights(weights)
    # As SGLang's DefaultModelLoader.load_model: layers may re-lay their weights out for the device.
    for module in model.modules():
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    return model.eval()
