"""The float path: weights in the model dtype, for linear layers and for MoE experts.

Mirrors python/sglang/srt/layers/quantization/unquant.py (UnquantizedLinearMethod,
UnquantizedFusedMoEMethod). Every layer of an unquantized model takes these, and so do the
layers a scheme leaves in float (an MoE router). The CPU kernels they run (the packed GEMM,
oneDNN) are chosen in layers/linear.py by apply_linear and pack_linear_weight.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from minisgl.layers.linear import apply_linear, pack_linear_weight
from minisgl.layers.moe.fused_moe_native import fused_experts_native
from minisgl.layers.quantization.base_config import FusedMoEMethodBase, LinearMethodBase

# Only where CUDA is: importing triton maps about 65 MB of its libraries, which a CPU engine never uses.
if torch.cuda.is_available():
    from minisgl.layers.moe.fused_moe_triton.fused_moe import fused_moe


class UnquantizedLinearMethod(LinearMethodBase):
    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        weight = torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype)
        layer.weight = nn.Parameter(weight, requires_grad=False)
        layer.weight.weight_loader = extra_weight_attrs["weight_loader"]

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        # As SGLang's _amx_process_weight_after_loading: repack once for the CPU GEMM.
        layer.weight = nn.Parameter(pack_linear_weight(layer.weight.data), requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return apply_linear(x, layer.weight, bias)


class UnquantizedFusedMoEMethod(FusedMoEMethodBase):
    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        inter = intermediate_size_per_partition
        layer.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden_size, dtype=params_dtype), False)
        layer.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, inter, dtype=params_dtype), False)
        layer.w13_weight.weight_loader = layer.w2_weight.weight_loader = extra_weight_attrs["weight_loader"]

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        # On CPU every expert's two matrices are packed once, as a dense layer's are, so each runs
        # on the GEMM apply_linear picks for its dtype (the matrix engines' VNNI layout for bf16
        # where the CPU has AVX512-BF16 or AMX). Left plain, oneDNN re-derived its layout on every
        # call. SGLang packs them too (_amx_process_weight_after_loading), for its fused CPU MoE
        # kernel; minisgl keeps the loop over experts and lists the packed matrices by expert id.
        if layer.w13_weight.is_cuda:
            return  # the Triton kernel reads the stacked [E, N, K] tensors
        for name in ("w13", "w2"):
            weights = getattr(layer, f"{name}_weight").data
            delattr(layer, f"{name}_weight")
            setattr(layer, f"{name}_packed", [pack_linear_weight(w) for w in weights])

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        # The grouped Triton kernel on the GPU; on the CPU the loop over experts is faster
        # than the interpreted kernel (which the kernel tests run against this loop).
        if x.is_cuda:
            return fused_moe(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids)
        return fused_experts_native(x, layer.w13_packed, layer.w2_packed, topk_weights, topk_ids, apply_linear)
