"""The two-level KV memory: request -> token slots -> K/V tensors.

Mirrors python/sglang/srt/mem_cache/memory_pool.py (ReqToTokenPool, MHATokenToKVPool,
MLATokenToKVPool). Level one, ReqToTokenPool, maps (request slot, position) to a KV slot
index. Level two holds per-layer buffers indexed by that slot: K and V per KV head
(MHATokenToKVPool), or one compressed latent plus one rope key shared by all heads
(MLATokenToKVPool, DeepSeek's multi-head latent attention). The allocator (allocator.py)
decides which slots are free. SGLang also has FP8/FP4, SWA, NSA, Mamba and host-offload
pools; omitted.
"""

from __future__ import annotations

import torch

from minisgl import tracing


class ReqToTokenPool:
    """A [size, max_context_len] table: row = a running request, entry = its KV slot per position."""

    def __init__(self, size: int, max_context_len: int, device: str) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self.free_slots = list(range(size))

    def write(self, indices, values) -> None:
        self.req_to_token[indices] = values

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> list[int] | None:
        if need_size > len(self.free_slots):
            return None
        select, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return select

    def free(self, free_index: int | list[int]) -> None:
        self.free_slots.extend([free_index] if isinstance(free_index, int) else free_index)


class MHATokenToKVPool:
    """Per-layer K/V buffers of shape [size + page_size, head_num, head_dim].

    Slot 0 (the first page) is never handed out: padded or dummy tokens write
    there, so a kernel never needs a branch for "no slot".
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str,
        start_layer: int = 0,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.head_num = head_num
        self.head_dim = head_dim
        self.layer_num = layer_num
        # A pipeline stage holds only layers [start_layer, start_layer + layer_num); layer ids stay global.
        self.start_layer = start_layer
        self.device = device
        shape = (size + page_size, head_num, head_dim)
        self.k_buffer = [self._alloc(shape) for _ in range(layer_num)]
        self.v_buffer = [self._alloc(shape) for _ in range(layer_num)]

    def _alloc(self, shape: tuple[int, ...]) -> torch.Tensor:
        return _alloc_pool_buffer(shape, self.page_size, self.dtype, self.device)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id - self.start_layer], self.v_buffer[layer_id - self.start_layer]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        # cache_k/v: [num_tokens, head_num, head_dim]; loc: [num_tokens]
        self.k_buffer[layer_id - self.start_layer][loc] = cache_k.to(self.dtype)
        self.v_buffer[layer_id - self.start_layer][loc] = cache_v.to(self.dtype)

    def get_kv_size_bytes(self) -> int:
        per_layer = self.k_buffer[0].numel() * self.k_buffer[0].element_size()
        return 2 * per_layer * self.layer_num


class MLATokenToKVPool:
    """Per-layer buffers of shape [size + page_size, 1, kv_lora_rank + qk_rope_head_dim].

    A token's row is its compressed latent (kv_a_layernorm's output, which kv_b_proj expands
    into every head's K-nope and V) followed by its rotated rope key, one for all heads. In
    the weight-absorbed attention the row is the single key head and its latent prefix the
    single value head, so ``get_kv_buffer`` returns the buffer and a view of its first
    kv_lora_rank columns: the value costs no memory of its own. Slot 0 is the dummy page.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str,
        start_layer: int = 0,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.layer_num = layer_num
        self.start_layer = start_layer  # as MHATokenToKVPool's
        self.device = device
        shape = (size + page_size, 1, self.kv_cache_dim)
        tracing.point("MLATokenToKVPool.__init__", values_per_token_per_layer=self.kv_cache_dim, layer_num=layer_num)
        self.kv_buffer = [_alloc_pool_buffer(shape, page_size, dtype, device) for _ in range(layer_num)]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.kv_buffer[layer_id - self.start_layer]
        return buf, buf[..., : self.kv_lora_rank]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v=None) -> None:
        """Store [num_tokens, 1, kv_lora_rank + rope] rows; the value is the key's prefix, so cache_v is unused."""
        self.kv_buffer[layer_id - self.start_layer][loc] = cache_k.to(self.dtype)

    def set_mla_kv_buffer(self, layer_id: int, loc: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor) -> None:
        # latent: [num_tokens, kv_lora_rank], k_pe: [num_tokens, qk_rope_head_dim]; written in place, no concat.
        buf = self.kv_buffer[layer_id - self.start_layer]
        buf[loc, 0, : self.kv_lora_rank] = latent.to(self.dtype)
        buf[loc, 0, self.kv_lora_rank :] = k_pe.to(self.dtype)

    def get_kv_size_bytes(self) -> int:
        return sum(buf.numel() * buf.element_size() for buf in self.kv_buffer)


def _alloc_pool_buffer(shape: tuple[int, ...], page_size: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    # empty, not zeros: on a CPU the pool's untouched pages then cost no RAM (the OS maps them
    # on first write), so RSS grows with the KV actually in use. Every slot is written before
    # it is read, except the padding page that masked reads may touch: that one is zeroed.
    buf = torch.empty(shape, dtype=dtype, device=device)
    buf[:page_size].zero_()
    return buf
