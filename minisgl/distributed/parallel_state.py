"""Which tensor-parallel rank this process is, and the collectives layers need.

Mirrors python/sglang/srt/distributed/parallel_state.py (get_tp_group,
get_tensor_model_parallel_rank/world_size, tensor_model_parallel_all_reduce).
SGLang builds GroupCoordinator objects for TP/PP/EP/DP with custom all-reduce
kernels; minisgl has a single TP group over torch.distributed. Until
initialize_model_parallel() runs, the process is rank 0 of a group of one and
every collective is the identity.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_TP_RANK = 0
_TP_SIZE = 1


def initialize_model_parallel(tp_rank: int, tp_size: int) -> None:
    global _TP_RANK, _TP_SIZE
    _TP_RANK, _TP_SIZE = tp_rank, tp_size


def get_tensor_model_parallel_rank() -> int:
    return _TP_RANK


def get_tensor_model_parallel_world_size() -> int:
    return _TP_SIZE


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP_SIZE == 1:
        return x
    dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if _TP_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_SIZE)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)
