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
import copy
import re
from typing import Optional

import torch
from torch import nn

from minisgl.configs.model_config import ModelConfig
from minisgl.layers.linear import LinearBase
from minisgl.layers.quantization import get_quantization_config
from minisgl.layers.quantization.base_config import QuantizationConfig, set_default_quant_config
from minisgl.layers.quantization.gguf import GGUFConfig
from minisgl.layers.quantization.unquant import UnquantizedFusedMoEMethod, UnquantizedLinearMethod
from minisgl.layers.quantization.utils import packed_modules_mapping
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


def get_model(model_config: ModelConfig, device: str, draft_model_idx: Optional[int] = None) -> nn.Module:
    model_cls = ModelRegistry.resolve_model_cls(model_config.architectures)
    quant_config = get_quant_config(model_config)
    hf_config = model_config.hf_config
    if isinstance(quant_config, GGUFConfig):
        weights = gguf_quant_weights_iterator(quant_config.gguf_file, hf_config, model_config.dtype)
    else:
        # Big tensors arrive already in the model's dtype: no float32 copy of one is ever whole in memory.
        weights = safetensors_weights_iterator(model_config.model_path, model_config.dtype)
    if draft_model_idx is not None:
        # One layer of a multi-layer draft, built and loaded as layer 0 (SGLang's _filter_mtp_weights).
        hf_config = copy.copy(hf_config)
        hf_config.num_hidden_layers = 1
        weights = _filter_draft_layer(weights, draft_model_idx)
    with set_default_torch_dtype(model_config.dtype), torch.device(device), set_default_quant_config(quant_config):
        model = model_cls(hf_config)
        if quant_config is not None:
            keep_ignored_layers_in_float(model, quant_config)
    model.load_weights(weights)
    # As SGLang's DefaultModelLoader.load_model: layers may re-lay their weights out for the device.
    for module in model.modules():
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    return model.eval()


def keep_ignored_layers_in_float(model: nn.Module, quant_config: QuantizationConfig) -> None:
    """Give every linear layer the checkpoint keeps in float (its ignore list) the float method and
    weights, before any weight is read. SGLang passes each layer its name (prefix) at construction
    and get_quant_method decides there; minisgl's models pass none, so the loader asks once the
    model is built."""
    fused_mapping = packed_modules_mapping(model)
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or isinstance(method, (UnquantizedLinearMethod, UnquantizedFusedMoEMethod)):
            continue  # a float layer (the LM head, a router) stays as it is, ignored or not
        if not quant_config.is_layer_skipped(name, fused_mapping):
            continue
        if not isinstance(module, LinearBase):
            raise NotImplementedError(
                f"{name}: the checkpoint's quantization_config.ignore keeps this {type(module).__name__} in float; "
                "minisgl keeps only linear layers in float by name"
            )
        module.set_quant_method(UnquantizedLinearMethod())


def _filter_draft_layer(weights, draft_model_idx: int):
    """Keep layer draft_model_idx's weights, renamed to layer 0, and the weights outside any layer."""
    pattern = re.compile(r"(^|\.)layers\.(\d+)\.")
    for name, tensor in weights:
        match = pattern.search(name)
        if match is None:
            yield name, tensor
        elif int(match.group(2)) == draft_model_idx:
            yield pattern.sub(r"\1layers.0.", name, count=1), tensor
