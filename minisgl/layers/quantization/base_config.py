"""The interface every quantization scheme implements, and how a layer finds its scheme.

Mirrors python/sglang/srt/layers/quantization/base_config.py (QuantizeMethodBase,
LinearMethodBase, FusedMoEMethodBase, QuantizationConfig). A layer does not know how its
weights are stored: it asks the model's QuantizationConfig for a *quant method*, which

1. ``create_weights``: registers the parameters the checkpoint fills (a float weight; or an
   int8 weight and its scales; or GGUF blocks), each with the layer's ``weight_loader``;
2. ``process_weights_after_loading``: re-lays them out once for the kernel (packing);
3. ``apply``: runs the layer's matmul on them.

SGLang threads ``quant_config`` and a ``prefix`` through every model constructor, so that a
config can skip layers by name. minisgl's models stay as they were: the loader makes the config
the default of every layer built inside :func:`set_default_quant_config`, and the one kind of
layer SGLang never quantizes (an MoE router) says ``quant_config=None``. A checkpoint that keeps
some layers in float by name (an ignore list) is served by asking the config once the model is
built and named (``is_layer_skipped``, called by the loader), and those layers re-create their weights
with the float method. Omitted: activation dtypes, GPU capabilities and the override/name-mapper hooks.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any, Mapping, Optional

import torch
from torch import nn


class QuantizeMethodBase(ABC):
    """How one layer's weights are created, prepared and applied."""

    def create_weights(self, layer: nn.Module, *weight_args, **extra_weight_attrs) -> None:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once every shard of the layer's weights is in (repacking, quantizing)."""

    @abstractmethod
    def apply(self, layer: nn.Module, *args, **kwargs) -> torch.Tensor:
        raise NotImplementedError


class LinearMethodBase(QuantizeMethodBase):
    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        """Register the weight parameters on ``layer``: [sum(output_partition_sizes), input] logically.

        ``output_partition_sizes`` lists the fused outputs (q, k, v or gate, up) on this rank;
        extra_weight_attrs carries ``weight_loader``, set on every parameter created."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """y = x W^T + bias, on the weights create_weights registered."""


def moe_weight_shapes(num_experts: int, hidden_size: int, intermediate_size: int) -> dict[str, tuple[int, int, int]]:
    """The experts' stacks, as every MoE method registers them: w13 [E, 2I, H] (gate rows, then up
    rows) and w2 [E, H, I]."""
    return {
        "w13": (num_experts, 2 * intermediate_size, hidden_size),
        "w2": (num_experts, hidden_size, intermediate_size),
    }


class FusedMoEMethodBase(QuantizeMethodBase):
    @abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        """Register w13_weight [E, 2I, H] and w2_weight [E, H, I] (and any scales) on ``layer``."""

    @abstractmethod
    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """The experts' output for routed tokens (SGLang passes a DispatchOutput; minisgl has no
        expert parallelism to dispatch over, so the routing itself)."""

    def runs_in_one_call(self, layer: nn.Module) -> bool:
        """Whether ``apply`` is one fused op, which torch.compile traces through its fake, rather
        than a loop over experts that reads the routing on the host (CPUGraphRunner asks)."""
        return False


class QuantizationConfig(ABC):
    """A checkpoint's quantization scheme: its name, how to read it, which method each layer gets."""

    @classmethod
    @abstractmethod
    def get_name(cls) -> str:
        """The name in QUANTIZATION_METHODS and in a checkpoint's quantization_config.quant_method."""

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict[str, Any]) -> "QuantizationConfig":
        """From the checkpoint's quantization_config ({} when only --quantization names the scheme)."""

    @abstractmethod
    def get_quant_method(self, layer: nn.Module) -> Optional[QuantizeMethodBase]:
        """The method for this layer; None for a layer the scheme leaves as it is."""

    def is_layer_skipped(self, prefix: str, fused_mapping: Mapping[str, list[str]]) -> bool:
        """Whether the checkpoint keeps the module named `prefix` in float (SGLang decides this in
        get_quant_method(layer, prefix); minisgl's loader asks here once the names exist).
        `fused_mapping`: a fused module's last name -> its parts' (qkv_proj -> q_proj, k_proj, v_proj)."""
        return False


class _FromLoader:
    def __repr__(self) -> str:
        return "FROM_LOADER"


# A layer's default quant_config: whatever get_model is loading with (see set_default_quant_config).
FROM_LOADER: Any = _FromLoader()
_default_quant_config: Optional[QuantizationConfig] = None


@contextlib.contextmanager
def set_default_quant_config(quant_config: Optional[QuantizationConfig]):
    """Layers built inside this block, and given no quant_config, use this one (as the loader's
    set_default_torch_dtype does for the dtype)."""
    global _default_quant_config
    old, _default_quant_config = _default_quant_config, quant_config
    try:
        yield
    finally:
        _default_quant_config = old


def resolve_quant_config(quant_config) -> Optional[QuantizationConfig]:
    return _default_quant_config if quant_config is FROM_LOADER else quant_config
