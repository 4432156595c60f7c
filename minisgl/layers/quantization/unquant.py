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

from minisgl.kernels.cpu import has_packed_gemm, packed_gemm_block_n
from minisgl.kernels.cpu.features import vnni_gemm_engine
from minisgl.layers.linear import apply_linear, pack_linear_weight
from minisgl.layers.moe.fused_moe_native import fused_experts_native
from minisgl.layers.quantization.base_config import FusedMoEMethodBase, LinearMethodBase, moe_weight_shapes

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
        shapes = moe_weight_shapes(num_experts, hidden_size, intermediate_size_per_partition)
        layer.w13_weight = nn.Parameter(torch.empty(shapes["w13"], dtype=params_dtype), False)
        layer.w2_weight = nn.Parameter(torch.empty(shapes["w2"], dtype=params_dtype), False)
        layer.w13_weight.weight_loader = layer.w2_weight.weight_loader = extra_weight_attrs["weight_loader"]

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        # On CPU the experts are packed once, as a dense layer's weight is (SGLang's
        # _amx_process_weight_after_loading does the same for its fused CPU kernel). For
        # fused_experts_cpu each stack [E, N, K] is packed whole: in the VNNI layout for bf16 on the
        # matrix engines, else in float panels. Where it cannot run, each expert gets the layout
        # apply_linear picks for its dtype, in a list by expert id, for the loop over experts.
        if layer.w13_weight.is_cuda:
            return  # the Triton kernel reads the stacked [E, N, K] tensors
        layout = _fused_experts_cpu_layout(layer.w13_weight.data, layer.w2_weight.data)
        for name in ("w13", "w2"):
            weights = getattr(layer, f"{name}_weight").data
            delattr(layer, f"{name}_weight")
            if layout == "vnni":
                packed = torch.ops.minisgl_kernel.convert_weight_packed_vnni(weights)
            elif layout == "panels":
                packed = torch.ops.minisgl_kernel.convert_weight_packed(weights)
            else:
                packed = [pack_linear_weight(w) for w in weights]
            setattr(layer, f"{name}_packed", packed)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        # The grouped Triton kernel on the GPU; on the CPU the C++ fused kernel where the experts
        # were packed as stacks for it, else the loop over experts (faster than the interpreted
        # Triton kernel, which the kernel tests run against this loop).
        if x.is_cuda:
            return fused_moe(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids)
        if isinstance(layer.w13_packed, torch.Tensor):
            return torch.ops.minisgl_kernel.fused_experts_cpu(
                x, layer.w13_packed, layer.w2_packed, topk_weights, topk_ids
            )
        return fused_experts_native(x, layer.w13_packed, layer.w2_packed, topk_weights, topk_ids, apply_linear)

    def runs_in_one_call(self, layer: nn.Module) -> bool:
        return isinstance(layer.w13_packed, torch.Tensor)


def _fused_experts_cpu_layout(w13: torch.Tensor, w2: torch.Tensor) -> Optional[str]:
    """How fused_experts_cpu (kernels/cpu/moe.cpp) takes these experts, or None where it cannot:
    ``"vnni"`` for bf16 on a CPU with vdpbf16ps (or AMX), ``"panels"`` (the FMA GEMM's float panels,
    in the weights' dtype) elsewhere the kernels built. The intermediate size I and the hidden size H
    must be multiples of the layout's panel width: a gate panel pairs with the up panel I columns on."""
    inter, hidden = w2.shape[2], w2.shape[1]
    if not has_packed_gemm():
        return None
    if w13.dtype == torch.bfloat16 and vnni_gemm_engine(torch.bfloat16) is not None and inter % 32 == hidden % 32 == 0:
        return "vnni"
    block_n = packed_gemm_block_n()
    return "panels" if inter % block_n == hidden % block_n == 0 else None
