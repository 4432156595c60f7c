"""FutureMap: the token ids of batches whose forward has not finished yet.

Mirrors python/sglang/srt/managers/overlap_utils.py (FutureMap, FutureIndices,
_resolve_future_token_ids). Under the overlap scheduler, batch N+1 is built before
batch N's tokens exist. Each request of N is given a slot in a circular buffer;
N+1's input id for that request is the slot's index, negated. The forward thread
stores N's sampled tokens in their slots, and resolves N+1's negative ids right
before N+1's forward, so the scheduler never waits for a token just to build a
batch. SGLang's version also carries speculative decoding's draft state and is
compiled with torch.compile; minisgl keeps token ids only (speculative decoding
runs with the normal loop).
"""

from __future__ import annotations

import dataclasses

import torch


def _resolve_future_token_ids(input_ids: torch.Tensor, future_token_ids_map: torch.Tensor) -> None:
    """Replace every negative id -i by the token stored in slot i (in place)."""
    input_ids[:] = torch.where(input_ids < 0, future_token_ids_map[torch.clamp(-input_ids, min=0)], input_ids)


@dataclasses.dataclass
class FutureIndices:
    indices: torch.Tensor  # [bs], the slots; a request's placeholder is -indices[i]
    interval: slice


class FutureMap:
    """A circular buffer of future token ids (SGLang's FutureMap, token ids only)."""

    def __init__(self, max_running_requests: int, device: str) -> None:
        # At most two batches are unresolved at once (the one running and the one queued
        # behind it), each of at most max_running_requests tokens, so a buffer of three
        # batches never hands out a slot whose token is still to be read. Slot 0 is unused:
        # -0 is not negative.
        self.future_limit = max_running_requests * 3
        self.future_ct = 0
        self.token_ids_buf = torch.zeros(self.future_limit + max_running_requests + 1, dtype=torch.int64, device=device)
        self.device = device

    def alloc_future_indices(self, bs: int) -> FutureIndices:
        start = self.future_ct + 1
        self.future_ct = (self.future_ct + bs) % self.future_limit
        indices = torch.arange(start, start + bs, dtype=torch.int64, device=self.device)
        return FutureIndices(indices=indices, interval=slice(start, start + bs))

    def resolve_future(self, input_ids: torch.Tensor) -> None:
        _resolve_future_token_ids(input_ids, self.token_ids_buf)

    def store_to_map(self, future_indices: FutureIndices, next_token_ids: torch.Tensor) -> None:
        self.token_ids_buf[future_indices.interval] = next_token_ids
