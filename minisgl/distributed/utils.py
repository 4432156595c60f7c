"""Small collectives over Python objects.

Mirrors broadcast_pyobj in python/sglang/srt/utils/common.py: rank 0 pickles
an object and the other ranks receive it. With one rank it is the identity.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def broadcast_pyobj(data: list[Any], rank: int, src: int = 0) -> list[Any]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return data
    box = [data if rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]
