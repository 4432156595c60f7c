"""Which tensor-parallel rank this process is, and the collectives layers need.

Mirrors python/sglang/srt/distributed/parallel_state.py (GroupCoordinator,
init_distributed_environment, initialize_model_parallel, get_tp_group,
get_tensor_model_parallel_rank/world_size) and, for tensor_model_parallel_all_reduce /
all_gather, python/sglang/srt/distributed/communication_op.py:11, which minisgl keeps in
this file because each is one line over the TP group. A GroupCoordinator holds two process groups over the same ranks:
``device_group`` for tensors (gloo on CPU, nccl on CUDA) and ``cpu_group``
(always gloo) for Python objects such as the scheduler's requests. Until
initialize_model_parallel() runs, the process is rank 0 of a group of one and
every collective is the identity. SGLang also builds PP/EP/attention-DP groups,
custom all-reduce kernels and shared-memory broadcast queues; minisgl has one
TP group, which is the whole world.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from typing import Optional

import torch
import torch.distributed as dist


class GroupCoordinator:
    """A set of ranks and the collectives over them (SGLang's GroupCoordinator, minus custom kernels)."""

    def __init__(self, ranks: list[int], backend: str) -> None:
        self.ranks = ranks
        self.world_size = len(ranks)
        self.rank = dist.get_rank()
        self.rank_in_group = ranks.index(self.rank)
        self.device_group = dist.new_group(ranks, backend=backend)
        # Objects are pickled into CPU byte tensors, which nccl cannot carry.
        # A group of its own even when tensors also use gloo: under overlap scheduling the forward
        # thread's collectives and the scheduler's broadcasts run at the same time.
        self.cpu_group = dist.new_group(ranks, backend="gloo")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def all_reduce_min(self, value: int) -> int:
        """The smallest of one integer per rank (e.g. free memory, so every rank sizes the same pool)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def barrier(self) -> None:
        dist.barrier(group=self.cpu_group)


_WORLD: Optional[GroupCoordinator] = None
_TP: Optional[GroupCoordinator] = None


def init_distributed_environment(
    backend: str, world_size: int, rank: int, dist_init_addr: str, timeout_s: Optional[int] = None
) -> None:
    """Join the process group whose rank 0 listens on ``dist_init_addr`` (host:port)."""
    global _WORLD
    if not dist.is_initialized():
        host, port = dist_init_addr.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
        if _is_loopback(host):
            # Gloo's data connections bind to the host's public interface by default.
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        store = _create_store(host, int(port), world_size, rank, timeout)
        dist.init_process_group(backend=backend, store=store, world_size=world_size, rank=rank, timeout=timeout)
    if _WORLD is None:
        _WORLD = GroupCoordinator(list(range(dist.get_world_size())), backend)


def _create_store(host: str, port: int, world_size: int, rank: int, timeout) -> dist.TCPStore:
    """SGLang passes init_method=f"tcp://{dist_init_addr}"; that store listens on every interface,
    so rank 0 binds the socket itself and listens only on the address it was given."""
    kwargs = {"timeout": timeout} if timeout is not None else {}
    if rank != 0:
        return dist.TCPStore(host, port, world_size, is_master=False, **kwargs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    # The store owns the descriptor from here on, and closes it when the group is destroyed.
    return dist.TCPStore(
        host, port, world_size, is_master=True, master_listen_fd=sock.detach(), wait_for_workers=False, **kwargs
    )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def initialize_model_parallel(tensor_model_parallel_size: int) -> None:
    global _TP
    assert _WORLD is not None, "init_distributed_environment must run first"
    if tensor_model_parallel_size != _WORLD.world_size:
        raise ValueError(
            f"minisgl's TP group is the whole world: tp_size {tensor_model_parallel_size} != world {_WORLD.world_size}"
        )
    _TP = GroupCoordinator(list(range(tensor_model_parallel_size)), dist.get_backend())


def get_tp_group() -> Optional[GroupCoordinator]:
    return _TP


def get_tensor_model_parallel_rank() -> int:
    return 0 if _TP is None else _TP.rank_in_group


def get_tensor_model_parallel_world_size() -> int:
    return 1 if _TP is None else _TP.world_size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    return x if _TP is None else _TP.all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return x if _TP is None else _TP.all_gather(x, dim)


def destroy_distributed_environment() -> None:
    global _WORLD, _TP
    _TP = _WORLD = None
    if dist.is_initialized():
        dist.destroy_process_group()
