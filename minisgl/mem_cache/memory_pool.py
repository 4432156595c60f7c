"""The two-level KV memory: request -> token slots -> K/V tensors.

Mirrors python/sglang/srt/mem_cache/memory_pool.py (ReqToTokenPool, MHATokenToKVPool).
Level one, ReqToTokenPool, maps (request slot, position) to a KV slot index.
Level two, MHATokenToKVPool, holds per-layer K and V buffers indexed by that slot.
The allocator (allocator.py) decides which slots are free. SGLang also has MLA,
FP8/FP4, SWA, Mamba and host-offload pools; minisgl keeps the plain MHA pool.
"""

from __future__ import annotations

import torch


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
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.head_num = head_num
        self.head_dim = head_dim
        self.layer_num = layer_num
        self.device = device
        shape = (size + page_size, head_num, head_dim)
        self.k_buffer = [self._alloc(shape) for _ in range(layer_num)]
        self.v_buffer = [self._alloc(shape) for _ in range(layer_num)]

    def _alloc(self, shape: tuple[int, ...]) -> torch.Tensor:
        # empty, not zeros: on a CPU the pool's untouched pages then cost no RAM (the OS maps them
        # on first write), so RSS grows with the KV actually in use. Every slot is written before
        # it is read, except the padding page that masked reads may touch: that one is zeroed.
        buf = torch.empty(shape, dtype=self.dtype, device=self.device)
        buf[: self.page_size].zero_()
        return buf

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        # cache_k/v: [num_tokens, head_num, head_dim]; loc: [num_tokens]
        self.k_buffer[layer_id][loc] = cache_k.to(self.dtype)
        self.v_buffer[layer_id][loc] = cache_v.to(self.dtype)

    def get_kv_size_bytes(self) -> int:
        per_layer = self.k_buffer[0].numel() * self.k_buffer[0].element_size()
        return 2 * per_layer * self.layer_num
