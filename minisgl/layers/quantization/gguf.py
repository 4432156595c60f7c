"""GGUF: a llama.cpp file's quantized weights, kept in their blocks and multiplied as they are.

Mirrors python/sglang/srt/layers/quantization/gguf.py (GGUFConfig, GGUFLinearMethod,
GGUFEmbeddingMethod). ``--quantization gguf`` is chosen by itself for a ``.gguf`` model path
(as SGLang's ServerArgs._handle_load_format, server_args.py:2501); the loader
(model_loader/gguf.py) then yields, per layer, ``qweight`` (the raw blocks, uint8
[N, K / 32 * block bytes]) and ``qweight_type`` (the ggml type id), with llama.cpp's q/k row
permutation already undone. The block layouts and the
GEMM are in gguf_kernel.py.

Each layer holds one block type. A fused layer (qkv_proj, gate_up_proj) is its shards' rows one
after the other, so q, k and v must share a type; SGLang keeps a type per shard and runs one GEMM
each. Tensor parallelism splits a column-parallel weight by rows and a row-parallel one by whole
blocks (a split inside a block is refused). The embedding stays quantized too: a lookup
dequantizes only the rows it reads, and a tied LM head multiplies the same blocks. A MoE layer's
experts stay in their blocks as well (GGUFMoEMethod): one stack per projection, run expert by
expert through the same GEMM, as SGLang's fused_moe_gguf falls back to where it has no grouped
kernel for a type. Omitted: SGLang's grouped MoE kernels (ggml_moe_a8, CUDA), K- and I-quants,
modules_to_not_convert.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from minisgl.layers.moe.fused_moe_native import fused_experts_native
from minisgl.layers.quantization.base_config import (
    FusedMoEMethodBase,
    LinearMethodBase,
    QuantizationConfig,
    moe_weight_shapes,
)
from minisgl.layers.quantization.gguf_kernel import apply_gguf_embedding, fused_mul_mat_gguf, row_bytes


class GGUFConfig(QuantizationConfig):
    """Where the blocks come from: the .gguf file the model folder's config.json points at."""

    def __init__(self, gguf_file: Optional[str]) -> None:
        self.gguf_file = gguf_file

    @classmethod
    def get_name(cls) -> str:
        return "gguf"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "GGUFConfig":
        if "gguf_file" not in config:
            raise ValueError(
                "quantization='gguf' reads a .gguf file: pass its path as --model-path "
                "(this model's config.json names no quantization_config.gguf_file)"
            )
        return cls(config["gguf_file"])

    def get_quant_method(self, layer: nn.Module):
        from minisgl.layers.linear import LinearBase
        from minisgl.layers.moe.fused_moe_triton.layer import FusedMoE
        from minisgl.layers.vocab_parallel_embedding import VocabParallelEmbedding

        if isinstance(layer, LinearBase):
            return GGUFLinearMethod(self)
        if isinstance(layer, VocabParallelEmbedding):
            return GGUFEmbeddingMethod(self)
        if isinstance(layer, FusedMoE):
            return GGUFMoEMethod(self)
        return None


class GGUFLinearMethod(LinearMethodBase):
    def __init__(self, quant_config: GGUFConfig) -> None:
        self.quant_config = quant_config

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        # The bytes per row depend on the block type, which arrives with the weights: qweight gets
        # its storage when qweight_type loads (SGLang uses an UninitializedParameter the same way).
        shape = (sum(output_partition_sizes), input_size_per_partition)
        self.params_dtype = params_dtype  # what an embedding lookup dequantizes to
        layer.qweight, layer.qweight_type = _block_params(shape, extra_weight_attrs["weight_loader"])

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.weight_type = int(layer.qweight_type.item())  # read once, not on every forward

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return fused_mul_mat_gguf(x, layer.qweight, layer.weight_type, bias)


class GGUFEmbeddingMethod(GGUFLinearMethod):
    """A vocabulary's rows as blocks: looked up and dequantized per token, or multiplied as the LM head."""

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return apply_gguf_embedding(ids, layer.qweight, layer.weight_type, self.params_dtype)


class GGUFMoEMethod(FusedMoEMethodBase):
    """The experts' blocks, stacked as the file stacks them: w13_qweight [E, 2I, bytes] (gate rows
    then up rows) and w2_qweight [E, H, bytes], one block type per stack. The layer runs
    fused_experts_native's loop, each chosen expert's rows through fused_mul_mat_gguf; SGLang's
    fused_moe_gguf loops over (token, expert) pairs where it lacks a grouped kernel."""

    def __init__(self, quant_config: GGUFConfig) -> None:
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
        for name, shape in moe_weight_shapes(num_experts, hidden_size, intermediate_size_per_partition).items():
            # FusedMoE's loader, per expert and shard, fills the blocks.
            qweight, qweight_type = _block_params(shape, extra_weight_attrs["weight_loader"])
            setattr(layer, f"{name}_qweight", qweight)
            setattr(layer, f"{name}_qweight_type", qweight_type)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.w13_type, layer.w2_type = (int(getattr(layer, f"{n}_qweight_type").item()) for n in ("w13", "w2"))
        # Each expert's (blocks, type), what fused_experts_native's linear takes: its rows are a view
        # into the stack, made once here rather than on every forward.
        layer.w13_experts = [(blocks, layer.w13_type) for blocks in layer.w13_qweight.data]
        layer.w2_experts = [(blocks, layer.w2_type) for blocks in layer.w2_qweight.data]

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return fused_experts_native(
            x, layer.w13_experts, layer.w2_experts, topk_weights, topk_ids, lambda h, w: fused_mul_mat_gguf(h, *w)
        )


def _block_params(shape: tuple[int, ...], weight_loader) -> tuple[nn.Parameter, nn.Parameter]:
    """A weight of this [..., N, K] shape as blocks: qweight (uint8, storage from its type) and
    qweight_type (-1 until a shard's ggml type id loads)."""
    qweight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
    qweight.weight_loader = weight_loader
    qweight_type = nn.Parameter(torch.full((1,), -1, dtype=torch.int64), requires_grad=False)
    qweight_type.weight_loader = _type_loader(qweight, shape)
    return qweight, qweight_type


def _type_loader(qweight: nn.Parameter, shape: tuple[int, ...]):
    """Loads a shard's ggml type id: the first gives qweight its storage ([..., N, K] weights as
    [..., N, row bytes]), the others must match it."""

    def load(param: nn.Parameter, loaded_type: torch.Tensor, *shard_id) -> None:
        weight_type = int(loaded_type)
        if param.item() == -1:
            qweight.data = torch.empty(*shape[:-1], row_bytes(weight_type, shape[-1]), dtype=torch.uint8)
            param.data.fill_(weight_type)
        elif param.item() != weight_type:
            raise ValueError(
                f"GGUF shard {shard_id} has ggml type {weight_type}, the layer's other shards {param.item()}: "
                "minisgl multiplies one block type per fused layer"
            )

    return load
