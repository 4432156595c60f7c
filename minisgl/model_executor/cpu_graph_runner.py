"""CPUGraphRunner: the decode forward compiled with torch.compile, one graph per batch-size bucket.

Mirrors python/sglang/srt/model_executor/cpu_graph_runner.py (register_fake_ops,
set_torch_compile_config, CPUGraphRunner: can_run, capture, replay). A CPU has no
graph to replay, but the same idea pays at small batches: a decode step is hundreds
of small ops, each dispatched from Python. torch.compile (inductor) traces the whole
forward once per batch size and replaces it by one generated C++ function with the
elementwise ops fused; minisgl's own C++ kernels (torch.ops.minisgl_kernel.*) stay
calls, which inductor can trace only through the "fake" (meta) implementations
registered here: shape and dtype, no work. A speculating target compiles its verify
instead of decode, as SGLang's CudaGraphRunner captures TARGET_VERIFY, and an EAGLE head its
draft steps, as SGLang's EAGLEDraftCudaGraphRunner does (graph_runner.py).

Differences from SGLang: SGLang compiles every batch size 1..16 when the server
starts and runs only those sizes; minisgl pads a batch up to the next bucket of
GraphRunner (as the CUDA runner does) and compiles a bucket the first time a batch
needs it, with inductor's on-disk cache (fx_graph_cache) so a restart reuses the
generated code. The compiled graph takes the static buffers of GraphRunner, so one
bucket's graph serves every batch padded to it. minisgl is also stricter and leaner
than SGLang here: the forward must compile as one graph (fullgraph=True; a graph break
used to fall back to eager per layer, slower than no compile, without a word), the
graph's op calls are made from generated C++ (cpp_wrapper), as plain C calls to
kernels/cpu/aoti_shims.cpp rather than through the dispatcher, and a replay calls the
bucket's compiled graph directly on the tensors it was traced on, as a CUDA graph
replays, where SGLang's replay enters dynamo each step (its guards, its Python).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

import torch

from minisgl import tracing
from minisgl.kernels.cpu import is_available as kernels_available
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.model_executor.graph_runner import GraphRunner

if TYPE_CHECKING:
    from minisgl.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_fake_ops_registered = False
_FAKE_OPS: list[str] = []  # the ops a compiled graph may call: those given a fake below


def register_fake_ops() -> None:
    """Shape-only versions of minisgl's C++ ops, so torch.compile can trace through them."""
    global _fake_ops_registered
    if _fake_ops_registered:
        return

    def fake(name: str):
        _FAKE_OPS.append(name)
        return torch.library.register_fake("minisgl_kernel::" + name)

    @fake("rmsnorm_cpu")
    def _(input, weight, eps):
        return torch.empty_like(input)

    @fake("fused_add_rmsnorm_cpu")
    def _(input, residual, weight, eps):
        return torch.empty_like(input), torch.empty_like(residual)

    @fake("silu_and_mul_cpu")
    def _(input):
        return input.new_empty(*input.shape[:-1], input.shape[-1] // 2)

    @fake("rotary_embedding_cpu")
    def _(positions, query, key, head_size, cos_sin_cache):
        return torch.empty_like(query), torch.empty_like(key)

    @fake("decode_attention_cpu")
    def _(q, o, k_buffer, v_buffer, key, value, loc, req_to_token, req_pool_indices, seq_lens, scale):
        return None  # writes o and the KV buffers in place

    @fake("extend_attention_cpu")  # an EAGLE target's verify
    def _(q, o, k_buffer, v_buffer, key, value, loc, req_to_token, req_pool_indices, seq_lens, *extend_args):
        return None  # writes o and the KV buffers in place

    @fake("weight_packed_linear")
    def _(mat1, mat2, bias):
        # mat2 is packed as [N / BLOCK_N, K, BLOCK_N] (convert_weight_packed).
        return mat1.new_empty(mat1.shape[0], mat2.shape[0] * mat2.shape[2])

    @fake("int8_scaled_mm_with_quant")
    def _(mat1, mat2, scales2, bias, out_dtype, is_vnni):
        return mat1.new_empty(mat1.shape[0], scales2.numel(), dtype=out_dtype)

    @fake("gguf_mul_mat")
    @fake("gguf_mul_mat_vec_a8")
    def _(x, qweight, weight_type, bias, use_avx2):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @fake("fused_experts_cpu")
    def _(hidden_states, w13, w2, topk_weights, topk_ids):
        return torch.empty_like(hidden_states)

    @fake("fused_experts_int8_cpu")
    def _(hidden_states, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids):
        return torch.empty_like(hidden_states)

    @fake("topk_softmax_cpu")
    def _(gating_output, topk, renormalize):
        tokens = gating_output.shape[0]
        return gating_output.new_empty(tokens, topk, dtype=torch.float32), gating_output.new_empty(
            tokens, topk, dtype=torch.int64
        )

    @fake("packed_weight_rows")
    def _(packed, ids):
        return packed.new_empty(ids.shape[0], packed.shape[1] * (2 if packed.dim() == 4 else 1))

    @fake("argmax_cpu")
    def _(logits):
        return logits.new_empty(logits.shape[0], dtype=torch.int64)

    _fake_ops_registered = True


# How a C shim takes each kind of argument, as torch's generated shims do (c_shim_cpu.h); a
# ScalarType reads as "int" in a schema.
_C_SHIM_TYPES = {
    "Tensor": "AtenTensorHandle",
    "Optional[Tensor]": "AtenTensorHandle*",
    "float": "double",
    "int": "int64_t",
    "bool": "int32_t",
}


class _CShims(dict):
    """custom_ops_to_c_shims as inductor reads it (op overload -> declarations) that pickles as
    {op name: declarations}: inductor's on-disk cache pickles its config into each graph's key, and
    an op overload does not pickle, which made every compile bypass the cache."""

    def __reduce__(self):
        return dict, ({str(op): declarations for op, declarations in self.items()},)


def c_shim_declarations() -> dict:
    """aot_inductor.custom_ops_to_c_shims: every op a compiled graph may call (those with a fake
    above) -> the C declaration of its function in minisgl/kernels/cpu/aoti_shims.cpp, derived from
    the op's schema. Inductor then calls the kernel directly instead of through the dispatcher."""
    declarations = _CShims()
    for name in _FAKE_OPS:
        op = getattr(torch.ops.minisgl_kernel, name).default
        params = [f"{_C_SHIM_TYPES[str(a.type)]} {a.name}" for a in op._schema.arguments]
        # Each result comes back through a pointer; an op with none still gets one, always nullptr.
        params += [f"AtenTensorHandle* ret{i}" for i in range(max(1, len(op._schema.returns)))]
        declarations[op] = [f"AOTITorchError aoti_torch_cpu_{name}({', '.join(params)})"]
    return declarations


def set_torch_compile_config(num_buckets: int, tp_size: int) -> None:
    import torch._dynamo.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = True  # generated code is reused across processes
    # The graph's ~300 op calls made from generated C++ rather than Python: under the profiler, a
    # batch-1 float32 step of the default model spent 11 ms in the Python wrapper, 1.6 ms in C++.
    # Not under TP: the C++ wrapper cannot yet pass the process group that a traced all-reduce
    # takes (inductor: "arg type Any is not yet supported by custom_op_wrapper").
    torch._inductor.config.cpp_wrapper = tp_size == 1
    # That wrapper is a straight run of ~300 dispatcher calls (6,000 lines for the default model),
    # which gcc built at -O3 with inductor's few generated kernels: 46 s of a bucket's 57 s compile
    # (bfloat16, Zen 4). Built apart, the wrapper at -O1 (aot_inductor.compile_wrapper_opt_level) and
    # the kernels still at -O3, a bucket compiled in 17 s (29 s in a fresh process, inductor's one-time
    # ISA probes included) and replayed as fast (paired, 0.98x; at -O0 14 s but 1.08x). Inductor keeps
    # this off by default for graphs of many small generated kernels.
    torch._inductor.config.cpp_wrapper_build_separate = True
    if torch._inductor.config.cpp_wrapper and kernels_available():
        # Each call of one of minisgl's ops as a plain C call instead of the dispatcher's boxed one.
        torch._inductor.config.aot_inductor.custom_ops_to_c_shims = c_shim_declarations()
    # No size and stride check after each op, nor on the graph's inputs: each builds a
    # std::stringstream whether or not it fails, ~580 of them a step, about 0.6 us each. The inputs
    # cannot differ, since a replay passes the very tensors the graph was traced on, and that each
    # kernel's outputs have its fake's shapes and strides is checked by tests/test_cpu_graph_runner.py.
    torch._inductor.config.size_asserts = False
    # One graph per bucket: each needs its own cache entry.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, num_buckets)


def _storage_key(x: torch.Tensor) -> int:
    """Where a tensor's data lives, one key for a tensor and its views (a oneDNN-blocked weight has
    no storage to ask: the tensor itself)."""
    return id(x) if x.is_mkldnn else x.untyped_storage().data_ptr()


def _tensors_in(attributes: dict) -> list[torch.Tensor]:
    """The tensors among an object's attributes, and those in its lists and tuples of them."""
    tensors = []
    for v in attributes.values():
        tensors += [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    return tensors


class CPUGraphRunner(GraphRunner):
    """Mirrors CPUGraphRunner in cpu_graph_runner.py; see the module docstring for the differences."""

    def __init__(self, model_runner: "ModelRunner", extend_features: int = 0) -> None:
        """extend_features > 0: an EAGLE head's draft extend after verify, whose tokens bring the
        target's features that wide (EAGLEWorker builds this one; ModelRunner builds the rest)."""
        args = model_runner.server_args
        # A speculating target compiles its verify, an EAGLE head its draft steps (graph_runner.py);
        # STANDALONE's draft model compiles its decode steps.
        speculating = args.speculative_algorithm is not None
        target = speculating and not model_runner.is_draft_worker
        head = speculating and model_runner.is_draft_worker and args.speculative_algorithm in ("EAGLE", "EAGLE3")
        if extend_features:  # a request brings 1 to k + 1 tokens (graph_runner.py)
            shape = dict(num_tokens_per_bs=args.speculative_num_steps + 1, extend_features=extend_features)
        else:
            shape = dict(
                num_tokens_per_bs=args.speculative_num_draft_tokens if target else 1,
                tree_mask=(target or head) and args.speculative_eagle_topk > 1,
                draft_lanes=args.speculative_eagle_topk if head else 0,
            )
        super().__init__(model_runner, args.torch_compile_max_bs, **shape)
        register_fake_ops()
        set_torch_compile_config(len(self.capture_bs), model_runner.tp_size)
        self.compile_seconds: dict[int, float] = {}  # bucket -> time its first (compiling) replay took
        self.capture()
        tracing.point("CPUGraphRunner.capture", batch_sizes=self.capture_bs)

    def capture(self) -> None:
        """Wrap the model's forward; inductor compiles a bucket when a batch first needs it."""
        model = self.model_runner.model
        self.batches = {bs: self.static_batch(bs) for bs in self.capture_bs}
        # bucket -> (inductor's compiled graph, the tensors it was traced on, in its input order)
        self.graphs: dict[int, tuple[Callable, list[torch.Tensor]]] = {}
        self._compiling_bs = 0

        def forward(input_ids, positions, forward_batch):
            with torch.no_grad():
                out = model.forward(input_ids, positions, forward_batch)
            # A verify's draft extend reads every row's hidden state too, a draft step its lanes' outputs.
            return out.next_token_logits, out.hidden_states

        # The KV pool's slot count, sized from the memory free at start-up, enters each graph as a
        # symbol, not a number: inductor's on-disk cache keys a graph by its inputs' shapes, and a
        # restart, whose pool came out a little larger or smaller, would never find its graphs there.
        for buffer in self._kv_buffers():
            torch._dynamo.maybe_mark_dynamic(buffer, 0)

        # A code object of this runner's own: dynamo keeps compiled graphs, and counts recompiles
        # against cache_size_limit, per code object, so a second runner in the process (a test, a
        # notebook) would otherwise recompile on the first one's entry and exhaust its limit.
        forward.__code__ = forward.__code__.replace()
        # fullgraph: a graph break would run the rest of the forward eagerly, slower than no compile
        # at all, and silently (SGLang's runner allows breaks); here it is an error at the first replay.
        self.compiled_forward = torch.compile(forward, backend=self._compile_bucket, dynamic=False, fullgraph=True)

    def _compile_bucket(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        """dynamo's backend: inductor compiles the traced graph, kept with the tensors it was traced on.

        Every input must outlive the step (a parameter, a static buffer, a pool), so that a replay can
        hand the compiled graph the same tensors again, with this step's values written into them."""
        from torch._inductor.compile_fx import compile_fx  # inductor's import is heavy: only when compiling

        persistent = self._persistent_storages()
        pool_sizes = {buffer.shape[0] for buffer in self._kv_buffers()}
        # The pool's size as the graph's symbol takes it; its hint, since int() on a SymInt would guard
        # on the value and bring the size back into the graph's key.
        inputs = [x.node.hint if isinstance(x, torch.SymInt) else x for x in example_inputs]
        names = [node.name for node in gm.graph.find_nodes(op="placeholder")]
        for name, x in zip(names, inputs):
            if isinstance(x, int) and x in pool_sizes:  # capture's symbol, fixed for the runner's life
                continue
            if not isinstance(x, torch.Tensor) or _storage_key(x) not in persistent:
                raise RuntimeError(
                    f"CPUGraphRunner: graph input {name} is not a tensor that outlives the step "
                    "(a parameter, a static buffer, a pool), so a replay could not pass it again"
                )
        compiled = compile_fx(gm, example_inputs)
        self.graphs[self._compiling_bs] = (compiled, inputs)
        return compiled

    def _kv_buffers(self) -> list[torch.Tensor]:
        """The KV pool's per-layer key and value buffers, [slots, heads, head_dim] each."""
        pool = self.model_runner.token_to_kv_pool
        return getattr(pool, "k_buffer", []) + getattr(pool, "v_buffer", [])

    def _persistent_storages(self) -> set[int]:
        """Storages that live as long as the runner: the model's tensors, the static buffers, the pools."""
        runner = self.model_runner
        tensors = self.static_buffers()
        for module in runner.model.modules():  # parameters, buffers and plain tensor attributes
            tensors += [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            tensors += _tensors_in(vars(module))
        for pool in (runner.req_to_token_pool, runner.token_to_kv_pool):  # allocated once, at start-up
            tensors += _tensors_in(vars(pool))
        return {_storage_key(t) for t in tensors}

    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """Run the bucket's compiled graph on the static buffers, as a CUDA graph replays.

        After its first run a bucket's graph is called directly, with the tensors it was traced on:
        dynamo is not asked again, so neither its guards nor its Python around the graph run."""
        # Rows out: a verify's every token; a decode's, a draft step's or a draft extend's one a request.
        rows = forward_batch.batch_size * (1 if self.extend_features else self.num_tokens_per_bs)
        bs = self.load_inputs(forward_batch)
        if bs in self.graphs:
            compiled, inputs = self.graphs[bs]
            outputs = compiled(*inputs)
        else:
            static = self.batches[bs]
            start, self._compiling_bs = time.perf_counter(), bs
            outputs = self.compiled_forward(static.input_ids, static.positions, static)
            self.compile_seconds[bs] = time.perf_counter() - start
            mode = self.capture_forward_mode.name.lower()
            logger.info("compiled the %s forward for batch size %d in %.1f s", mode, bs, self.compile_seconds[bs])
        logits, hidden = outputs if len(outputs) == 2 else (outputs[0], None)  # a graph returns no None
        return LogitsProcessorOutput(
            next_token_logits=logits[:rows], hidden_states=None if hidden is None else hidden[:rows]
        )
