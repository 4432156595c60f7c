"""Which tensor- and pipeline-parallel rank this process is, and the collectives layers need.

Mirrors python/sglang/srt/distributed/parallel_state.py (GroupCoordinator with its
send_object / recv_object / send_tensor_dict / recv_tensor_dict, init_distributed_environment,
initialize_model_parallel, get_tp_group, get_pp_group, get_tensor_model_parallel_rank/world_size)
and, for tensor_model_parallel_all_reduce / all_gather, python/sglang/srt/distributed/communication_op.py:11,
which minisgl keeps in this file because each is one line over the TP group. A GroupCoordinator
holds two process groups over the same ranks:
``device_group`` for tensors (gloo on CPU, nccl on CUDA) and ``cpu_group``
(always gloo) for Python objects such as the scheduler's requests. Until
initialize_model_parallel() runs, the process is rank 0 of a group of one and
every collective is the identity. The world is pp_size x tp_size processes, rank
pp_rank * tp_size + tp_rank, as in SGLang: a TP group is one pipeline stage's ranks
[p * tp, (p + 1) * tp), a PP group the ranks [t, t + tp, t + 2 tp, ...] that hold the
same TP shard of successive stages, which pass hidden states down the pipeline.
SGLang also builds EP/attention-DP groups, custom all-reduce kernels and shared-memory
broadcast queues; omitted.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pickle
import socket
from typing import Optional

import torch
import torch.distributed as dist


class GroupCoordinator:
    """A set of ranks and the collectives over them (SGLang's GroupCoordinator, minus custom kernels).

    Built from every group of its kind (``group_ranks``): torch.distributed requires every process
    to create every group, in the same order, even those it is not in; this one keeps its own."""

    def __init__(self, group_ranks: list[list[int]], backend: str) -> None:
        self.rank = dist.get_rank()
        for ranks in group_ranks:
            device_group = dist.new_group(ranks, backend=backend)
            # Objects are pickled into CPU byte tensors, which nccl cannot carry.
            # A group of its own even when tensors also use gloo: under overlap scheduling the forward
            # thread's collectives and the scheduler's broadcasts run at the same time.
            cpu_group = dist.new_group(ranks, backend="gloo")
            if self.rank in ranks:
                self.ranks, self.device_group, self.cpu_group = ranks, device_group, cpu_group
        self.world_size = len(self.ranks)
        self.rank_in_group = self.ranks.index(self.rank)

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    @property
    def next_rank(self) -> int:
        """The global rank after this one, wrapping around (the last stage's next is the first)."""
        return self.ranks[(self.rank_in_group + 1) % self.world_size]

    @property
    def prev_rank(self) -> int:
        return self.ranks[(self.rank_in_group - 1) % self.world_size]

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

    def all_reduce_max(self, x: torch.Tensor) -> torch.Tensor:
        """Elementwise maximum over the group's CPU tensors (e.g. routed experts, -1 where a rank has no layer)."""
        if self.world_size > 1:
            dist.all_reduce(x, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return x

    def all_gather_object(self, obj) -> list:
        """Every rank's ``obj``, in rank order."""
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.cpu_group)
        return gathered

    def barrier(self) -> None:
        dist.barrier(group=self.cpu_group)

    # ---- point to point, along the pipeline -------------------------------------------------

    def send_object(self, obj, dst: int) -> list[dist.Work]:
        """Pickle ``obj`` to global rank ``dst``: its size, then its bytes (the receiver must know the
        size). Asynchronous, as every send of the pipeline loop: the caller keeps the works (each
        holds its tensor) and the receiver's blocking recv is what orders the stages."""
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        return [dist.isend(size, dst, group=self.cpu_group), dist.isend(payload, dst, group=self.cpu_group)]

    def recv_object(self, src: int):
        size = torch.empty(1, dtype=torch.int64)
        dist.recv(size, src, group=self.cpu_group)
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(payload, src, group=self.cpu_group)
        return pickle.loads(payload.numpy().tobytes())

    def send_tensor_dict(self, tensors: dict[str, torch.Tensor], dst: Optional[int] = None) -> list[dist.Work]:
        """Send named tensors to ``dst`` (default: the next rank): their shapes and dtypes as an object,
        so the receiver can allocate, then each tensor over the device group (SGLang's send_tensor_dict)."""
        dst = self.next_rank if dst is None else dst
        works = self.send_object({k: (t.shape, t.dtype) for k, t in tensors.items()}, dst)
        return works + [dist.isend(t.contiguous(), dst, group=self.device_group) for t in tensors.values()]

    def recv_tensor_dict(self, src: Optional[int] = None, device: str = "cpu") -> dict[str, torch.Tensor]:
        """The named tensors send_tensor_dict sent; or, where the sender had none and sent an object of
        another kind with send_object (a pipeline stage whose forward failed), that object."""
        src = self.prev_rank if src is None else src
        header = self.recv_object(src)
        if not isinstance(header, dict):
            return header
        tensors = {k: torch.empty(shape, dtype=dtype, device=device) for k, (shape, dtype) in header.items()}
        for t in tensors.values():
            dist.recv(t, src, group=self.device_group)
        return tensors


_WORLD: Optional[GroupCoordinator] = None
_TP: Optional[GroupCoordinator] = None
_PP: Optional[GroupCoordinator] = None


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
        _WORLD = GroupCoordinator([list(range(dist.get_world_size()))], backend)


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


def initialize_model_parallel(tensor_model_parallel_size: int, pipeline_model_parallel_size: int = 1) -> None:
    """The TP groups (one per stage) and the PP groups (one per TP shard), as SGLang's."""
    global _TP, _PP
    assert _WORLD is not None, "init_distributed_environment must run first"
    tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
    if tp * pp != _WORLD.world_size:
        raise ValueError(f"world size {_WORLD.world_size} != tp_size {tp} x pp_size {pp}")
    backend = dist.get_backend()
    _TP = GroupCoordinator([list(range(p * tp, (p + 1) * tp)) for p in range(pp)], backend)
    _PP = GroupCoordinator([list(range(t, tp * pp, tp)) for t in range(tp)], backend)


def get_world_group() -> Optional[GroupCoordinator]:
    return _WORLD


def get_tp_group() -> Optional[GroupCoordinator]:
    return _TP


def get_pp_group() -> Optional[GroupCoordinator]:
    return _PP


def get_pipeline_model_parallel_rank() -> int:
    return 0 if _PP is None else _PP.rank_in_group


def get_pipeline_model_parallel_world_size() -> int:
    return 1 if _PP is None else _PP.world_size


def get_tensor_model_parallel_rank() -> int:
    return 0 if _TP is None else _TP.rank_in_group


def get_tensor_model_parallel_world_size() -> int:
    return 1 if _TP is None else _TP.world_size


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    return x if _TP is None else _TP.all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return x if _TP is None else _TP.all_gather(x, dim)


def destroy_distributed_environment() -> None:
    global _WORLD, _TP, _PP
    _TP = _PP = _WORLD = None
    if dist.is_initialized():
        dist.destroy_process_group()
