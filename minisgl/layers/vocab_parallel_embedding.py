"""Token embedding and LM head, sharded over the vocabulary.

Mirrors python/sglang/srt/layers/vocab_parallel_embedding.py
(VocabParallelEmbedding, ParallelLMHead). Each rank holds a contiguous slice
of the vocabulary; out-of-slice tokens embed to zero and the all-reduce sums
the slices back. SGLang also pads the vocabulary for LoRA and quantization;
minisgl pads only to a multiple of the TP size. As in SGLang, a quantization scheme may
give the vocabulary a quant_method (GGUF's keeps the rows in their blocks); otherwise the
rows are a plain float weight.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from minisgl.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from minisgl.layers.linear import pack_linear_weight, weight_rows
from minisgl.layers.quantization.base_config import FROM_LOADER, resolve_quant_config


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.org_vocab_size = num_embeddings
        padded = -(-num_embeddings // self.tp_size) * self.tp_size
        self.num_embeddings_per_partition = padded // self.tp_size
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = self.vocab_start_index + self.num_embeddings_per_partition
        quant_config = resolve_quant_config(FROM_LOADER)
        self.quant_method = quant_config.get_quant_method(self) if quant_config is not None else None
        if self.quant_method is not None:
            self.quant_method.create_weights(
                self,
                embedding_dim,
                [self.num_embeddings_per_partition],
                torch.get_default_dtype(),
                weight_loader=self.weight_loader,
            )
            return
        self.weight = nn.Parameter(torch.zeros(self.num_embeddings_per_partition, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        local = loaded_weight[self.vocab_start_index : min(self.vocab_end_index, self.org_vocab_size)]
        param.data[: local.shape[0]].copy_(local)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quant_method is not None:
            return self.quant_method.embedding(self, ids)
        return weight_rows(self.weight, ids)  # plain, or packed by a tied ParallelLMHead

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._embed(input_ids)
        in_shard = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
        local_ids = torch.where(in_shard, input_ids - self.vocab_start_index, 0)
        out = self._embed(local_ids) * in_shard.unsqueeze(-1)
        return tensor_model_parallel_all_reduce(out)

    def process_weights_after_loading(self) -> None:
        if self.quant_method is not None:
            self.quant_method.process_weights_after_loading(self)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; LogitsProcessor does the matmul and gathers the shards."""

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False) -> None:
        super().__init__(num_embeddings, embedding_dim)
        assert not bias, "no model here has an LM-head bias"
        self.packed_weight: Optional[torch.Tensor] = None

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> None:
        if self.quant_method is not None:  # the same blocks (storage and type) serve both
            self.qweight, self.qweight_type = embed_tokens.qweight, embed_tokens.qweight_type
        else:
            self.weight = embed_tokens.weight

    def process_weights_after_loading(self) -> None:
        if self.quant_method is not None:  # LogitsProcessor multiplies through quant_method.apply
            return super().process_weights_after_loading()
        # The logits GEMM reads the weight in apply_linear's fastest layout. minisgl's own panels
        # replace the weight in place: a tied embedding shares this Parameter and reads its rows
        # from the panels (weight_rows), so the vocabulary matrix is held once. oneDNN's blocked
        # layout cannot be read back by rows, so that one is a second copy beside the plain weight.
        packed = pack_linear_weight(self.weight.data)
        if packed.dim() in (3, 4):
            self.weight.data = packed
        elif packed is not self.weight.data:
            self.packed_weight = packed

    @property
    def gemm_weight(self) -> torch.Tensor:
        """What LogitsProcessor multiplies by."""
        return self.packed_weight if self.packed_weight is not None else self.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor, not called")
