"""GraphRunner: what ModelRunner asks of a decode-graph runner, on any device.

SGLang's CudaGraphRunner and CPUGraphRunner (model_executor/cuda_graph_runner.py,
cpu_graph_runner.py) share one informal interface, which ModelRunner relies on:
``capture()`` prepares the graphs, ``can_run(batch)`` says whether a batch may use
one, ``replay(batch)`` runs it. minisgl writes that interface down once here, with
the part both runners share: static input buffers, padded up to a captured batch
size, and a ForwardBatch view of them. Padding rows have sequence length 1 and read
and write only the pool's dummy slot 0.
"""

from __future__ import annotations

import abc
import bisect
from typing import TYPE_CHECKING

import torch

from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from minisgl.model_executor.model_runner import ModelRunner


def get_batch_sizes_to_capture(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_bs + 1, 8))
    return sorted({bs for bs in sizes if bs <= max_bs} | {max_bs})


class GraphRunner(abc.ABC):
    """Static buffers for the largest captured batch; subclasses capture and replay."""

    def __init__(self, model_runner: "ModelRunner", max_bs: int) -> None:
        self.model_runner = model_runner
        self.device = model_runner.device
        self.capture_bs = get_batch_sizes_to_capture(min(max_bs, model_runner.req_to_token_pool.size))
        self.max_bs = self.capture_bs[-1]
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int64, device=self.device)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return (
            forward_batch.forward_mode.is_decode()
            and forward_batch.batch_size <= self.max_bs
            and not forward_batch.capture_hidden_mode.need_capture()
        )

    @abc.abstractmethod
    def capture(self) -> None: ...

    @abc.abstractmethod
    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput: ...

    def padded_batch_size(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def load_inputs(self, forward_batch: ForwardBatch) -> int:
        """Copy the batch into the static buffers, padded; return the padded batch size."""
        raw_bs = forward_batch.batch_size
        bs = self.padded_batch_size(raw_bs)
        self.seq_lens[raw_bs:bs].fill_(1)
        self.out_cache_loc[raw_bs:bs].zero_()
        self.req_pool_indices[raw_bs:bs].zero_()
        self.input_ids[:raw_bs].copy_(forward_batch.input_ids)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(forward_batch.out_cache_loc)
        self.positions[:bs].copy_(self.seq_lens[:bs] - 1)
        return bs

    def static_batch(self, bs: int) -> ForwardBatch:
        """A decode ForwardBatch over the first bs rows of the static buffers."""
        runner = self.model_runner
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            positions=self.positions[:bs],
            req_pool_indices_cpu=[0] * bs,
            seq_lens_cpu=[1] * bs,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
        )
