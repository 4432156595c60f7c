"""Small collectives over Python objects.

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
