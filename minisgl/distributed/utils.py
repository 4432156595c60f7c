"""Small collectives over Python objects, and how layers split into pipeline stages.

Mirrors broadcast_pyobj in python/sglang/srt/utils/common.py: the source rank
pickles a list into a byte tensor and broadcasts its size, then its bytes; an
empty list costs only the size. With one rank it is the identity.
"""

from __future__ import annotations

import pickle
from typing import Any, Optional

import torch
import torch.distributed as dist


def broadcast_pyobj(
    data: list[Any], rank: int, dist_group: Optional[dist.ProcessGroup] = None, src: int = 0
) -> list[Any]:
    """Every rank returns ``src``'s list; ``rank`` and ``src`` are global ranks. The group must be gloo."""
    if not dist.is_initialized() or dist.get_world_size(dist_group) == 1:
        return data
    size = torch.zeros(1, dtype=torch.int64)
    if rank == src:
        payload = pickle.dumps(data) if data else b""
        size[0] = len(payload)
        dist.broadcast(size, src=src, group=dist_group)
        if payload:
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=src, group=dist_group)
        return data
    dist.broadcast(size, src=src, group=dist_group)
    if size.item() == 0:
        return []
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(buf, src=src, group=dist_group)
    return pickle.loads(buf.numpy().tobytes())


def get_pp_indices(num_hidden_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """The layers [start, end) of pipeline stage ``pp_rank``: an even split, the last
    ``num_hidden_layers % pp_size`` stages one layer more (SGLang's distributed/utils.py:63,
    without its SGLANG_PP_LAYER_PARTITION override)."""
    if num_hidden_layers < pp_size:
        raise ValueError(f"pp_size {pp_size} is more than the model's {num_hidden_layers} layers")
    base, remainder = divmod(num_hidden_layers, pp_size)
    # Stages before the first one with an extra layer hold `base` each; the rest `base + 1`.
    first_long = pp_size - remainder
    start = pp_rank * base + max(0, pp_rank - first_long)
    end = start + base + (1 if pp_rank >= first_long else 0)
    return start, end
