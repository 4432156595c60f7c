"""W8A8-int8: int8 weights per output channel, int8 activations per token, int32 sums.

Mirrors python/sglang/srt/layers/quantization/w8a8_int8.py (W8A8Int8Config,
W8A8Int8LinearMethod, W8A8Int8MoEMethod). A checkpoint in SGLang's layout (what
``python -m minisgl.tools.quantize_w8a8`` writes) stores each linear layer's ``weight`` as
int8 [N, K] beside ``weight_scale`` float32 [N, 1], and says
``"quantization_config": {"quant_method": "w8a8_int8"}`` in config.json.

Where minisgl differs: ``--quantization w8a8_int8`` on a float checkpoint quantizes each
layer when its weights are in (``process_weights_after_loading``), as SGLang's fp8 does for
float checkpoints; SGLang's w8a8_int8 expects an int8 checkpoint. SGLang's CPU path needs AMX
and its fused MoE kernel; minisgl runs its own kernels (kernels/cpu/gemm_int8.cpp, and
gemm_int8_vnni.cpp on AVX512-VNNI) and, for MoE, its own fused kernel in either layout
(moe_int8.cpp), else (sizes not in whole panels, or no C++ kernels) the int8 GEMM once per chosen
expert. A checkpoint's ``ignore`` list (module names, or ``re:`` patterns) keeps those linear
layers in float, as SGLang's config does (layers/quantization/utils.py); minisgl's loader applies it
once the model is built, because its models pass layers no name (base_config.py). Omitted: static
activation scales, and ignored MoE experts (refused by name).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

from minisgl.layers.moe.fused_moe_native import fused_experts_native
from minisgl.layers.quantization.base_config import (
    FusedMoEMethodBase,
    LinearMethodBase,
    QuantizationConfig,
    moe_weight_shapes,
)
from minisgl.layers.quantization.int8_kernel import (
    int8_scaled_mm_with_quant,
    pack_int8_weight,
    quantize_weight_int8,
    use_int8_kernel,
)
from minisgl.layers.quantization.utils import should_ignore_layer


class W8A8Int8Config(QuantizationConfig):
    """Weights static, per channel, symmetric; activations dynamic, per token, symmetric."""

    def __init__(self, is_checkpoint_int8_serialized: bool, ignore: Sequence[str] = ()) -> None:
        self.is_checkpoint_int8_serialized = is_checkpoint_int8_serialized
        self.ignore = list(ignore)

    @classmethod
    def get_name(cls) -> str:
        return "w8a8_int8"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "W8A8Int8Config":
        ignore = config.get("ignore") or []
        if not isinstance(ignore, list) or not all(isinstance(name, str) for name in ignore):
            raise ValueError(f"quantization_config.ignore must be a list of module names, got {ignore!r}")
        return cls(is_checkpoint_int8_serialized=config.get("quant_method") == cls.get_name(), ignore=ignore)

    def get_quant_method(self, layer: nn.Module):
        from minisgl.layers.linear import LinearBase
        from minisgl.layers.moe.fused_moe_triton.layer import FusedMoE

        if isinstance(layer, LinearBase):
            return W8A8Int8LinearMethod(self)
        if isinstance(layer, FusedMoE):
            return W8A8Int8MoEMethod(self)
        return None

    def is_layer_skipped(self, prefix: str, fused_mapping: Mapping[str, list[str]]) -> bool:
        return should_ignore_layer(prefix, self.ignore, fused_mapping)


def _weight_dtype(config: W8A8Int8Config, params_dtype: torch.dtype) -> torch.dtype:
    return torch.int8 if config.is_checkpoint_int8_serialized else params_dtype


def _int8_checked(weight_loader):
    """The layer's weight_loader, refusing a float tensor for an int8 parameter (copy_ would cast it)."""

    def load(param: nn.Parameter, loaded_weight: torch.Tensor, *shard) -> None:
        if param.dtype == torch.int8 and loaded_weight.dtype != torch.int8:
            raise ValueError(
                f"a w8a8_int8 checkpoint stores int8 weights, got a {loaded_weight.dtype} tensor of shape "
                f"{tuple(loaded_weight.shape)} (quantize it with python -m minisgl.tools.quantize_w8a8)"
            )
        weight_loader(param, loaded_weight, *shard)

    return load


class W8A8Int8LinearMethod(LinearMethodBase):
    def __init__(self, quant_config: W8A8Int8Config) -> None:
        self.quant_config = quant_config

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        n = sum(output_partition_sizes)
        weight = torch.empty(n, input_size_per_partition, dtype=_weight_dtype(self.quant_config, params_dtype))
        layer.weight = nn.Parameter(weight, requires_grad=False)
        layer.weight.weight_loader = _int8_checked(extra_weight_attrs["weight_loader"])
        if self.quant_config.is_checkpoint_int8_serialized:
            # One scale per output row, sharded with the rows (SGLang's ChannelQuantScaleParameter).
            layer.weight_scale = nn.Parameter(torch.empty(n, 1, dtype=torch.float32), requires_grad=False)
            layer.weight_scale.weight_loader = extra_weight_attrs["weight_loader"]

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.quant_config.is_checkpoint_int8_serialized:
            weight, scale = layer.weight.data, layer.weight_scale.data
        else:
            weight, scale = quantize_weight_int8(layer.weight.data)
        layer.weight = nn.Parameter(pack_int8_weight(weight), requires_grad=False)
        layer.weight_scale = nn.Parameter(scale.contiguous(), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return int8_scaled_mm_with_quant(x, layer.weight, layer.weight_scale, bias)


class W8A8Int8MoEMethod(FusedMoEMethodBase):
    """Every expert's matrices as in the linear method. Where the C++ kernels run and the sizes fit,
    the layer runs in one call, fused_experts_int8_cpu (sgl-kernel's fused_experts_cpu with
    use_int8_w8a8), on whichever int8 layout this CPU's GEMM uses; elsewhere the experts run one by
    one (fused_experts_native's loop) through the int8 GEMM."""

    def __init__(self, quant_config: W8A8Int8Config) -> None:
        self.quant_config = quant_config

    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        dtype = _weight_dtype(self.quant_config, params_dtype)
        for name, shape in moe_weight_shapes(num_experts, hidden_size, intermediate_size_per_partition).items():
            params = {f"{name}_weight": torch.empty(shape, dtype=dtype)}
            if self.quant_config.is_checkpoint_int8_serialized:
                params[f"{name}_weight_scale"] = torch.empty(*shape[:2], 1, dtype=torch.float32)
            for param_name, data in params.items():
                setattr(layer, param_name, nn.Parameter(data, requires_grad=False))
                getattr(layer, param_name).weight_loader = _int8_checked(extra_weight_attrs["weight_loader"])

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        # Where fused_experts_int8_cpu runs, each projection becomes one stack of the experts' packed
        # int8 matrices and one of their scales; elsewhere a list of (packed weight, scales) pairs,
        # indexed by expert id, for the loop over experts.
        hidden, inter = layer.w2_weight.shape[1], layer.w2_weight.shape[2]
        fused = _fused_experts_int8_runs(layer.w2_weight.data, hidden, inter)
        for name in ("w13", "w2"):
            weights = getattr(layer, f"{name}_weight").data
            if self.quant_config.is_checkpoint_int8_serialized:
                pairs = zip(weights, getattr(layer, f"{name}_weight_scale").data)
                delattr(layer, f"{name}_weight_scale")
            else:
                pairs = (quantize_weight_int8(w) for w in weights)
            delattr(layer, f"{name}_weight")
            experts = [(pack_int8_weight(w), s.contiguous()) for w, s in pairs]
            if fused:
                packed, scales = zip(*experts)
                experts = (torch.stack(packed), torch.stack(scales).view(len(scales), -1))
            setattr(layer, f"{name}_int8", experts)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        if isinstance(layer.w13_int8, tuple):  # stacks for the fused kernel
            return torch.ops.minisgl_kernel.fused_experts_int8_cpu(
                x, *layer.w13_int8, *layer.w2_int8, topk_weights, topk_ids
            )

        def linear(h: torch.Tensor, expert: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return int8_scaled_mm_with_quant(h, *expert)

        return fused_experts_native(x, layer.w13_int8, layer.w2_int8, topk_weights, topk_ids, linear)

    def runs_in_one_call(self, layer: nn.Module) -> bool:
        return isinstance(layer.w13_int8, tuple)


def _fused_experts_int8_runs(weight: torch.Tensor, hidden: int, inter: int) -> bool:
    """Whether fused_experts_int8_cpu (kernels/cpu/moe_int8.cpp) takes these experts: where the C++
    kernels run (in either int8 layout), with I and H multiples of the 32 columns a unit takes."""
    return use_int8_kernel(weight) and inter % 32 == hidden % 32 == 0
