"""The contract every attention backend fulfils.

Mirrors python/sglang/srt/layers/attention/base_attn_backend.py. A backend
prepares per-batch metadata once (``init_forward_metadata``, before the first
layer runs), then serves every layer's ``forward``, which dispatches on the
batch's forward mode. The CUDA-graph hooks are part of the contract, as in SGLang;
a backend that implements them says so with ``supports_cuda_graph`` (only Triton's does),
which ModelRunner.init_device_graphs reads instead of the backend's name. Backends are
found by name in attention_registry.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from minisgl import tracing

if TYPE_CHECKING:
    from minisgl.layers.radix_attention import RadixAttention
    from minisgl.model_executor.forward_batch_info import ForwardBatch


class AttentionBackend(ABC):
    # Whether the three CUDA-graph hooks below are implemented (ModelRunner.init_device_graphs).
    supports_cuda_graph = False

    @abstractmethod
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        """Build whatever index tensors the kernels need for this batch."""

    @tracing.traced(name="attn_backend.init_forward_metadata", attrs=lambda self, fb: {"backend": type(self).__name__})
    def init_forward_metadata_step(self, forward_batch: "ForwardBatch") -> None:
        """What the model runner calls before the first layer: every backend's init_forward_metadata,
        traced under one name here so that no backend has to emit its own span."""
        self.init_forward_metadata(forward_batch)

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

    # ---- CUDA graphs (SGLang's names): the metadata lives in static buffers the graph reads ----

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        """Allocate the static metadata buffers for batches of up to max_bs requests."""
        raise NotImplementedError(f"{type(self).__name__} does not capture CUDA graphs")

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        """Point the metadata at the static buffers, for capturing a decode of bs requests."""
        raise NotImplementedError(f"{type(self).__name__} does not capture CUDA graphs")

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int
    ) -> None:
        """Refill the static buffers in place for a (padded) decode batch of size bs."""
        raise NotImplementedError(f"{type(self).__name__} does not capture CUDA graphs")
