"""CudaGraphRunner: capture decode forwards once per batch size, then replay them.

Mirrors python/sglang/srt/model_executor/cuda_graph_runner.py (CudaGraphRunner:
__init__, can_run, capture, capture_one_batch_size, replay_prepare, replay).
A decode step launches hundreds of small kernels; a CUDA graph replays the whole
step with one launch. Inputs are copied into static buffers, batches are padded
up to the nearest captured size (padding rows write to the pool's dummy slot 0),
and the attention backend keeps its metadata in static buffers too. SGLang also
captures speculative and DP-attention variants, uses torch.compile and a shared
memory pool across runners; minisgl captures plain decode.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import torch

from minisgl import tracing
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from minisgl.model_executor.model_runner import ModelRunner


def get_batch_sizes_to_capture(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_bs + 1, 8))
    return sorted({bs for bs in sizes if bs <= max_bs} | {max_bs})


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner") -> None:
        self.model_runner = model_runner
        self.device = model_runner.device
        max_running = model_runner.req_to_token_pool.size
        self.capture_bs = get_batch_sizes_to_capture(min(model_runner.server_args.cuda_graph_max_bs, max_running))
        self.max_bs = self.capture_bs[-1]
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int64, device=self.device)
        self.out_cache_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs, model_runner.req_to_token_pool.max_context_len)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.output_logits: dict[int, torch.Tensor] = {}
        self.pool = None
        self.capture()
        tracing.point("CudaGraphRunner.capture", batch_sizes=self.capture_bs)

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return (
            forward_batch.forward_mode.is_decode()
            and forward_batch.batch_size <= self.max_bs
            and not forward_batch.capture_hidden_mode.need_capture()
        )

    def _static_batch(self, bs: int) -> ForwardBatch:
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

    def capture(self) -> None:
        # Largest first, so smaller graphs reuse the memory pool the largest one reserved.
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        runner = self.model_runner
        forward_batch = self._static_batch(bs)
        runner.attn_backend.init_forward_metadata_capture_cuda_graph(bs)

        def run_once() -> torch.Tensor:
            return runner.model.forward(
                forward_batch.input_ids, forward_batch.positions, forward_batch
            ).next_token_logits

        for _ in range(2):  # warm up: Triton compiles and allocators settle outside the graph
            run_once()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = run_once()
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.output_logits[bs] = logits

    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        raw_bs = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        # Padding rows: sequence length 1, reading and writing only the dummy slot 0.
        self.seq_lens[raw_bs:bs].fill_(1)
        self.out_cache_loc[raw_bs:bs].zero_()
        self.req_pool_indices[raw_bs:bs].zero_()
        self.input_ids[:raw_bs].copy_(forward_batch.input_ids)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[:raw_bs].copy_(forward_batch.out_cache_loc)
        self.positions[:bs].copy_(self.seq_lens[:bs] - 1)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, self.req_pool_indices, self.seq_lens, max(forward_batch.seq_lens_cpu)
        )
        self.graphs[bs].replay()
        return LogitsProcessorOutput(next_token_logits=self.output_logits[bs][:raw_bs])
