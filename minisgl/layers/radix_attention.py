"""RadixAttention: the attention layer a model calls, with no kernel of its own.

Mirrors python/sglang/srt/layers/radix_attention.py. The layer only knows its
shape (heads, head_dim, scaling) and its layer_id; the actual computation and
the KV-cache write are delegated to ``forward_batch.attn_backend``, chosen once
at init (claim C11). That is why the same model file runs on every backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl import tracing

if TYPE_CHECKING:
    from minisgl.model_executor.forward_batch_info import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scaling: float,
        num_kv_heads: int,
        layer_id: int,
        logit_cap: float = 0.0,
        v_head_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.tp_v_head_num = num_kv_heads
        self.head_dim = head_dim
        self.qk_head_dim = head_dim
        # MLA's attentions have values narrower than keys (see mla_attention.py).
        self.v_head_dim = v_head_dim or head_dim
        self.scaling = scaling
        self.layer_id = layer_id
        self.logit_cap = logit_cap

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        # q: [num_tokens, tp_q_head_num * head_dim]; k: [num_tokens, tp_k_head_num * head_dim];
        # v: [num_tokens, tp_v_head_num * v_head_dim] (any view with those shapes)
        tracing.point("RadixAttention.forward", layer_id=self.layer_id)
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)
