"""The contract every attention backend fulfils.

Mirrors python/sglang/srt/layers/attention/base_attn_backend.py. A backend
prepares per-batch metadata once (``init_forward_metadata``, before the first
layer runs), then serves every layer's ``forward``, which dispatches on the
batch's forward mode. SGLang's base also has CUDA-graph capture/replay hooks;
minisgl's Triton backend adds those itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.layers.radix_attention import RadixAttention
    from minisgl.model_executor.forward_batch_info import ForwardBatch


class AttentionBackend(ABC):
    @abstractmethod
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Build whatever index tensors the kernels need for this batch."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    @abstractmethod
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor: ...

    @abstractmethod
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor: ...
