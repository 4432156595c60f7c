"""CPUGraphRunner: the decode forward compiled with torch.compile, one graph per batch-size bucket.

Mirrors python/sglang/srt/model_executor/cpu_graph_runner.py (register_fake_ops,
set_torch_compile_config, CPUGraphRunner: can_run, capture, replay). A CPU has no
graph to replay, but the same idea pays at small batches: a decode step is hundreds
of small ops, each dispatched from Python. torch.compile (inductor) traces the whole
forward once per batch size and replaces it by one generated C++ function with the
elementwise ops fused; minisgl's own C++ kernels (torch.ops.minisgl_kernel.*) stay
calls, which inductor can trace only through the "fake" (meta) implementations
registered here: shape and dtype, no work.

Differences from SGLang: SGLang compiles every batch size 1..16 when the server
starts and runs only those sizes; minisgl pads a batch up to the next bucket of
GraphRunner (as the CUDA runner does) and compiles a bucket the first time a batch
needs it, with inductor's on-disk cache (fx_graph_cache) so a restart reuses the
generated code. The compiled graph takes the static buffers of GraphRunner, so one
bucket's graph serves every batch padded to it. minisgl is also stricter and leaner
than SGLang here: the forward must compile as one graph (fullgraph=True; a graph break
used to fall back to eager per layer, slower than no compile, without a word), the
graph's op calls are made from generated C++ (cpp_wrapper), and dynamo does not
re-check every parameter of the model before each replay (the guard filter): the
weights of a loaded model are not replaced, only written in place.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from minisgl import tracing
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.model_executor.graph_runner import GraphRunner

if TYPE_CHECKING:
    from minisgl.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_fake_ops_registered = False


def register_fake_ops() -> None:
    """Shape-only versions of minisgl's C++ ops, so torch.compile can trace through them."""
    global _fake_ops_registered
    if _fake_ops_registered:
        return
    ops = "minisgl_kernel::"

    @torch.library.register_fake(ops + "rmsnorm_cpu")
    def _(input, weight, eps):
        return torch.empty_like(input)

    @torch.library.register_fake(ops + "fused_add_rmsnorm_cpu")
    def _(input, residual, weight, eps):
        return torch.empty_like(input), torch.empty_like(residual)

    @torch.library.register_fake(ops + "silu_and_mul_cpu")
    def _(input):
        return input.new_empty(*input.shape[:-1], input.shape[-1] // 2)

    @torch.library.register_fake(ops + "rotary_embedding_cpu")
    def _(positions, query, key, head_size, cos_sin_cache):
        return torch.empty_like(query), torch.empty_like(key)

    @torch.library.register_fake(ops + "decode_attention_cpu")
    def _(q, o, k_buffer, v_buffer, key, value, loc, req_to_token, req_pool_indices, seq_lens, scale):
        return None  # writes o and the KV buffers in place

    @torch.library.register_fake(ops + "weight_packed_linear")
    def _(mat1, mat2, bias):
        # mat2 is packed as [N / BLOCK_N, K, BLOCK_N] (convert_weight_packed).
        return mat1.new_empty(mat1.shape[0], mat2.shape[0] * mat2.shape[2])

    @torch.library.register_fake(ops + "int8_scaled_mm_with_quant")
    def _(mat1, mat2, scales2, bias, out_dtype, is_vnni):
        return mat1.new_empty(mat1.shape[0], scales2.numel(), dtype=out_dtype)

    @torch.library.register_fake(ops + "gguf_mul_mat")
    @torch.library.register_fake(ops + "gguf_mul_mat_vec_a8")
    def _(x, qweight, weight_type, bias, use_avx2):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake(ops + "fused_experts_cpu")
    def _(hidden_states, w13, w2, topk_weights, topk_ids):
        return torch.empty_like(hidden_states)

    @torch.library.register_fake(ops + "fused_experts_int8_cpu")
    def _(hidden_states, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids):
        return torch.empty_like(hidden_states)

    @torch.library.register_fake(ops + "argmax_cpu")
    def _(logits):
        return logits.new_empty(logits.shape[0], dtype=torch.int64)

    _fake_ops_registered = True


def set_torch_compile_config(num_buckets: int, tp_size: int) -> None:
    import torch._dynamo.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = True  # generated code is reused across processes
    # The graph's ~300 op calls made from generated C++ rather than Python: under the profiler, a
    # batch-1 float32 step of the default model spent 11 ms in the Python wrapper, 1.6 ms in C++.
    # Not under TP: the C++ wrapper cannot yet pass the process group that a traced all-reduce
    # takes (inductor: "arg type Any is not yet supported by custom_op_wrapper").
    torch._inductor.config.cpp_wrapper = tp_size == 1
    # One graph per bucket: each needs its own cache entry.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, num_buckets)


class CPUGraphRunner(GraphRunner):
    """Mirrors CPUGraphRunner in cpu_graph_runner.py; see the module docstring for the differences."""

    def __init__(self, model_runner: "ModelRunner") -> None:
        super().__init__(model_runner, model_runner.server_args.torch_compile_max_bs)
        register_fake_ops()
        set_torch_compile_config(len(self.capture_bs), model_runner.tp_size)
        self.compile_seconds: dict[int, float] = {}  # bucket -> time its first (compiling) replay took
        self.capture()
        tracing.point("CPUGraphRunner.capture", batch_sizes=self.capture_bs)

    def capture(self) -> None:
        """Wrap the model's forward; inductor compiles a bucket when a batch first needs it."""
        model = self.model_runner.model
        self.batches = {bs: self.static_batch(bs) for bs in self.capture_bs}

        def forward(input_ids, positions, forward_batch):
            with torch.no_grad():
                return model.forward(input_ids, positions, forward_batch)

        # A code object of this runner's own: dynamo keeps compiled graphs on the code object, and
        # the guard filter below drops its checks on the model's modules, so two models of one
        # class in one process (a test, a notebook) would otherwise share graphs, constants and all.
        forward.__code__ = forward.__code__.replace()
        # fullgraph: a graph break would run the rest of the forward eagerly, slower than no compile
        # at all, and silently (SGLang's runner allows breaks); here it is an error at the first replay.
        self.compiled_forward = torch.compile(
            forward,
            dynamic=False,
            fullgraph=True,
            options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
        )

    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        raw_bs = forward_batch.batch_size
        bs = self.load_inputs(forward_batch)
        static = self.batches[bs]
        start = time.perf_counter() if bs not in self.compile_seconds else None
        logits = self.compiled_forward(static.input_ids, static.positions, static).next_token_logits
        if start is not None:
            self.compile_seconds[bs] = time.perf_counter() - start
            logger.info("compiled the decode forward for batch size %d in %.1f s", bs, self.compile_seconds[bs])
        return LogitsProcessorOutput(next_token_logits=logits[:raw_bs])
