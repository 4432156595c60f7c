"""CudaGraphRunner: capture decode forwards once per batch size, then replay them.

Mirrors python/sglang/srt/model_executor/cuda_graph_runner.py (CudaGraphRunner:
__init__, can_run, capture, capture_one_batch_size, replay_prepare, replay).
A decode step launches hundreds of small kernels; a CUDA graph replays the whole
step with one launch. Inputs are copied into static buffers, batches are padded
up to the nearest captured size (padding rows write to the pool's dummy slot 0),
and the attention backend keeps its metadata in static buffers too (the buffers and
the padding are graph_runner.GraphRunner's, shared with the CPU runner). SGLang also
captures speculative and DP-attention variants, uses torch.compile and a shared
memory pool across runners; minisgl captures plain decode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl import tracing
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.model_executor.graph_runner import GraphRunner

if TYPE_CHECKING:
    from minisgl.model_executor.model_runner import ModelRunner


class CudaGraphRunner(GraphRunner):
    def __init__(self, model_runner: "ModelRunner") -> None:
        super().__init__(model_runner, model_runner.server_args.cuda_graph_max_bs)
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs, model_runner.req_to_token_pool.max_context_len)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.output_logits: dict[int, torch.Tensor] = {}
        self.pool = None
        self.capture()
        tracing.point("CudaGraphRunner.capture", batch_sizes=self.capture_bs)

    def capture(self) -> None:
        # Largest first, so smaller graphs reuse the memory pool the largest one reserved.
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        runner = self.model_runner
        forward_batch = self.static_batch(bs)
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
        bs = self.load_inputs(forward_batch)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, self.req_pool_indices, self.seq_lens, max(forward_batch.seq_lens_cpu)
        )
        self.graphs[bs].replay()
        return LogitsProcessorOutput(next_token_logits=self.output_logits[bs][:raw_bs])
