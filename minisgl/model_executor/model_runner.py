"""ModelRunner: where the model, the KV pools, the attention backend and sampling meet.

Mirrors python/sglang/srt/model_executor/model_runner.py (and the
init_memory_pool of model_runner_kv_cache_mixin.py). Read it in the book's order:
``__init__`` fixes the runner's personality; ``initialize()`` assembles the
execution shell in a fixed order (claim C5); ``forward()`` dispatches on the
batch's ForwardMode (C6); ``sample()`` turns logits into tokens (C7). A pipeline stage
(pp_rank of pp_size) builds, loads and caches only its layers [start_layer, end_layer), and
its forward returns PPProxyTensors instead of logits on every stage but the last.
SGLang additionally wires LoRA, quantization, EPLB rebalancing, piecewise
CUDA graphs, remote weight transfer and many hardware backends; each is a
branch minisgl leaves out.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Union

import psutil
import torch

from minisgl import tracing
from minisgl.configs.model_config import AttentionArch, ModelConfig
from minisgl.distributed.parallel_state import get_world_group, init_distributed_environment, initialize_model_parallel
from minisgl.distributed.utils import get_pp_indices
from minisgl.eplb.expert_distribution import (
    ExpertDistributionRecorder,
    get_global_expert_distribution_recorder,
    set_global_expert_distribution_recorder,
)
from minisgl.eplb.expert_location import compute_initial_expert_location_metadata
from minisgl.huge_pages import move_to_huge_pages
from minisgl.layers.attention.attention_registry import ATTENTION_BACKENDS
from minisgl.layers.attention.base_attn_backend import AttentionBackend
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.layers.moe.fused_moe_triton.layer import FusedMoE
from minisgl.layers.moe.routed_experts_capturer import (
    RoutedExpertsCapturer,
    get_global_experts_capturer,
    set_global_experts_capturer,
)
from minisgl.layers.sampler import Sampler
from minisgl.layers.utils import PPProxyTensors
from minisgl.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from minisgl.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.model_loader.loader import get_model
from minisgl.server_args import KV_CACHE_DTYPES, ServerArgs

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ModelRunnerOutput:
    logits_output: Union[LogitsProcessorOutput, PPProxyTensors]  # PPProxyTensors on a stage before the last
    can_run_graph: bool


@tracing.traced
def create_sampler() -> Sampler:
    return Sampler()


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        server_args: ServerArgs,
        tp_rank: int = 0,
        tp_size: int = 1,
        is_draft_worker: bool = False,
        req_to_token_pool: Optional[ReqToTokenPool] = None,
        token_to_kv_pool_allocator: Optional[TokenToKVPoolAllocator] = None,
        pp_rank: int = 0,
        pp_size: int = 1,
        draft_model_idx: Optional[int] = None,
    ) -> None:
        # The personality (claim C4): fixed here, read by every later branch, never re-decided.
        self.model_config = model_config
        self.server_args = server_args
        self.device = server_args.device
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.pp_rank = pp_rank
        self.pp_size = pp_size
        # This stage's layers (the model builds the same slice: layers/utils.make_layers).
        self.start_layer, self.end_layer = get_pp_indices(model_config.num_hidden_layers, pp_rank, pp_size)
        self.num_effective_layers = self.end_layer - self.start_layer
        self.spec_algorithm = None  # minisgl's speculative worker wraps this runner from outside
        self.is_draft_worker = is_draft_worker
        # Multi-layer EAGLE: which layer of the draft checkpoint this runner's model is (SGLang's name).
        self.draft_model_idx = draft_model_idx
        # A draft runner is handed the target's pools; a target runner creates its own.
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        # DeepSeek's latent attention: decides the KV pool's layout and the attention kernels.
        self.use_mla_backend = model_config.attention_arch == AttentionArch.MLA
        self.is_generation = model_config.is_generation
        self.is_multimodal = model_config.is_multimodal
        self.page_size = server_args.page_size
        tracing.point(
            "ModelRunner.__init__",
            device=self.device,
            is_draft_worker=is_draft_worker,
            shares_pools=req_to_token_pool is not None,
            use_mla_backend=self.use_mla_backend,
            is_generation=self.is_generation,
            is_multimodal=self.is_multimodal,
            page_size=self.page_size,
            attention_backend=server_args.attention_backend,
        )
        if not self.is_generation:
            raise ValueError(f"{model_config.architectures} is not a generation model")
        if self.is_multimodal:
            raise ValueError("minisgl serves text-only models")
        model_config.verify_tp_size(tp_size)
        self.forward_pass_id = 0
        if tp_size * pp_size > 1 and not is_draft_worker:
            # Before initialize(): every layer reads its rank from parallel_state when it is built.
            # A draft runner lives in a process whose target already joined the group.
            self.init_torch_distributed()
        self.initialize()

    def init_torch_distributed(self) -> None:
        """Join the TP and PP groups: gloo on CPU, nccl on CUDA, rendezvous at server_args.dist_init_addr.
        The world is pp_size x tp_size processes; this one is rank pp_rank * tp_size + tp_rank (SGLang's order)."""
        if self.server_args.dist_init_addr is None:
            raise ValueError("tp_size or pp_size > 1 runs one process per rank; start them with Engine(tp_size=...)")
        backend = "gloo" if self.device == "cpu" else "nccl"
        world_size, rank = self.tp_size * self.pp_size, self.pp_rank * self.tp_size + self.tp_rank
        with tracing.span(
            "ModelRunner.init_torch_distributed", backend=backend, tp_rank=self.tp_rank, tp_size=self.tp_size
        ):
            if self.device.startswith("cuda"):
                torch.cuda.set_device(rank % (world_size // self.server_args.nnodes))
            init_distributed_environment(backend, world_size, rank, self.server_args.dist_init_addr)
            initialize_model_parallel(self.tp_size, self.pp_size)

    @tracing.traced
    def initialize(self) -> None:
        """Assemble the execution shell, in SGLang's order (claim C5). Each step traces itself
        (tracing.traced), so the golden trace shows the order in which they really run."""
        mc = self.model_config
        self.expert_location_metadata = compute_initial_expert_location_metadata(mc.num_hidden_layers, mc.num_experts)
        set_global_expert_distribution_recorder(
            ExpertDistributionRecorder.init_new(
                self.server_args.expert_distribution_recorder_mode,
                mc.num_hidden_layers,
                self.expert_location_metadata.num_physical_experts,
            )
        )
        self.sampler = create_sampler()
        self.load_model()
        self.init_memory_pool()
        self.init_routed_experts_capturer()
        self.init_attention_backend()
        self.init_device_graphs()

    @tracing.traced(attrs=lambda self: {"dtype": str(self.model_config.dtype).removeprefix("torch.")})
    def load_model(self) -> None:
        self.model = get_model(self.model_config, self.device, self.draft_model_idx)
        if self.device == "cpu":
            # Decode streams every weight each step: on 2 MiB pages, 512x fewer TLB misses (huge_pages.py).
            move_to_huge_pages(self.model)
        self.dtype = self.model_config.dtype
        # SGLang's configure_kv_cache_dtype, minus fp4 (ServerArgs refuses it): "auto" keeps the model's
        # dtype; bfloat16 halves a float32 model's KV and what decode attention reads, fp8 halves a
        # bfloat16 model's, stored unscaled (as SGLang stores it for a checkpoint without k_scale/v_scale).
        self.kv_cache_dtype = KV_CACHE_DTYPES.get(self.server_args.kv_cache_dtype, self.dtype)  # "auto": the model's

    def profile_max_num_token(self) -> int:
        """How many tokens of KV fit in the memory budget (SGLang's profile_max_num_token)."""
        mc = self.model_config
        if self.use_mla_backend:
            # One latent + one rope key per token and layer, whole on every rank (heads are expanded from it).
            cell_size = (
                (mc.kv_lora_rank + mc.qk_rope_head_dim) * self.num_effective_layers * self.kv_cache_dtype.itemsize
            )
        else:
            kv_heads = mc.get_num_kv_heads(self.tp_size)
            cell_size = kv_heads * mc.head_dim * self.num_effective_layers * 2 * self.kv_cache_dtype.itemsize
        if self.device.startswith("cuda"):
            available, _ = torch.cuda.mem_get_info()
        else:
            available = psutil.virtual_memory().available
        max_tokens = int(available * self.server_args.mem_fraction_static) // cell_size
        if self.tp_size * self.pp_size > 1:
            # Every rank must hold the same number of tokens, or their schedulers would decide differently
            # (a stage with fewer layers could hold more; the smallest wins).
            max_tokens = get_world_group().all_reduce_min(max_tokens)
        return max_tokens

    @tracing.traced
    def init_memory_pool(self) -> None:
        if self.token_to_kv_pool_allocator is not None:
            # A draft runner keeps its own KV in the slots the target's allocator hands out.
            max_tokens = self.token_to_kv_pool_allocator.size
        else:
            max_tokens = self.server_args.max_total_tokens or self.profile_max_num_token()
        # The pool holds whole pages.
        self.max_total_num_tokens = max_tokens // self.page_size * self.page_size
        if self.max_total_num_tokens <= 0:
            raise RuntimeError("not enough memory for the KV cache; raise mem_fraction_static")
        if self.req_to_token_pool is None:
            self.req_to_token_pool = ReqToTokenPool(
                size=self.server_args.max_running_requests,
                max_context_len=self.model_config.context_len + 4,
                device=self.device,
            )
        if self.use_mla_backend:
            self.token_to_kv_pool = MLATokenToKVPool(
                size=self.max_total_num_tokens,
                page_size=self.page_size,
                dtype=self.kv_cache_dtype,
                kv_lora_rank=self.model_config.kv_lora_rank,
                qk_rope_head_dim=self.model_config.qk_rope_head_dim,
                layer_num=self.num_effective_layers,
                device=self.device,
                start_layer=self.start_layer,
            )
        else:
            self.token_to_kv_pool = MHATokenToKVPool(
                size=self.max_total_num_tokens,
                page_size=self.page_size,
                dtype=self.kv_cache_dtype,
                head_num=self.model_config.get_num_kv_heads(self.tp_size),
                head_dim=self.model_config.head_dim,
                layer_num=self.num_effective_layers,
                device=self.device,
                start_layer=self.start_layer,
            )
        if self.token_to_kv_pool_allocator is None:
            if self.page_size == 1:
                self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(self.max_total_num_tokens, self.device)
            else:
                self.token_to_kv_pool_allocator = PagedTokenToKVPoolAllocator(
                    self.max_total_num_tokens, self.page_size, self.device
                )
        tracing.point(
            "ModelRunner.init_memory_pool.sized",
            page_size=self.page_size,
            allocator=type(self.token_to_kv_pool_allocator).__name__,
        )
        logger.info(
            "pp rank %d, tp rank %d: layers [%d, %d), KV pool %d tokens, %.2f MB; weights %.2f MB",
            self.pp_rank,
            self.tp_rank,
            self.start_layer,
            self.end_layer,
            self.max_total_num_tokens,
            self.token_to_kv_pool.get_kv_size_bytes() / 2**20,
            self.weight_size_bytes() / 2**20,
        )

    def weight_size_bytes(self) -> int:
        """What this rank's weights take (a stage holds only its layers' weights)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @tracing.traced
    def init_routed_experts_capturer(self) -> None:
        mc = self.model_config
        set_global_experts_capturer(
            RoutedExpertsCapturer.create(
                enable=self.server_args.enable_return_routed_experts and mc.is_moe,
                num_layers=mc.num_hidden_layers,
                top_k=mc.num_experts_per_tok,
                num_slots=self.max_total_num_tokens + self.page_size,
                device=self.device,
            )
        )

    @tracing.traced(attrs=lambda self: {"backend": self.server_args.attention_backend})
    def init_attention_backend(self) -> None:
        """The backend is chosen here, once, from server_args and the device (claim C11), by
        name from the registry (ServerArgs has refused any other name)."""
        self.attn_backend = self._get_attention_backend()

    def _get_attention_backend(self) -> "AttentionBackend":
        """Name -> backend, through the registry (SGLang's _get_attention_backend_from_str)."""
        return ATTENTION_BACKENDS[self.server_args.attention_backend](self)

    @tracing.traced
    def init_device_graphs(self) -> None:
        """A graph runner for decode (graph_runner.GraphRunner): CUDA graphs, or torch.compile on a CPU."""
        self.graph_runner = None
        if self.pp_size > 1:
            # A replayed graph returns logits; a stage before the last returns PPProxyTensors.
            tracing.point("ModelRunner.init_device_graphs.skipped", reason="pipeline parallelism")
        elif not self.device.startswith("cuda"):
            self.init_cpu_graph()
        elif self.server_args.disable_cuda_graph:
            tracing.point("ModelRunner.init_device_graphs.skipped", reason="disable_cuda_graph")
        elif not self.attn_backend.supports_cuda_graph:
            tracing.point("ModelRunner.init_device_graphs.skipped", reason="backend is not graph-capturable")
        elif self.server_args.enable_return_routed_experts or self.server_args.expert_distribution_recorder_mode:
            # Their hooks run Python on every forward, which a replayed graph would skip.
            tracing.point("ModelRunner.init_device_graphs.skipped", reason="MoE observers are on")
        else:
            from minisgl.model_executor.cuda_graph_runner import CudaGraphRunner

            self.graph_runner = CudaGraphRunner(self)

    def init_cpu_graph(self) -> None:
        # ServerArgs allows enable_torch_compile only with intel_amx (torch_native's decode loops over
        # requests in Python, which a compiled graph would bake in for one batch), and not beside the
        # MoE observers, whose hooks a compiled forward would skip.
        if not self.server_args.enable_torch_compile:
            tracing.point("ModelRunner.init_device_graphs.skipped", reason="device is not cuda")
            return
        # Refused here rather than at the first decode, where the failed trace would abort the batch.
        if self.use_mla_backend:  # the intel_amx backend runs MLA on torch_native's per-request loop
            raise ValueError("enable_torch_compile: CPUGraphRunner does not trace MLA attention in minisgl")
        for m in self.model.modules():
            if isinstance(m, FusedMoE) and not m.quant_method.runs_in_one_call(m):
                # The loop over experts reads the routing on the host (.tolist()).
                raise ValueError(
                    f"enable_torch_compile: {type(m.quant_method).__name__} runs these experts in a loop, "
                    "which CPUGraphRunner cannot trace (the fused CPU kernels need the hidden and "
                    "intermediate sizes in whole panels; GGUF experts have no fused kernel)"
                )
        from minisgl.model_executor.cpu_graph_runner import CPUGraphRunner

        self.graph_runner = CPUGraphRunner(self)

    # ---- forward -------------------------------------------------------------------------

    @tracing.traced(
        attrs=lambda self, forward_batch, pp_proxy_tensors=None: {"forward_mode": forward_batch.forward_mode.name}
    )
    def forward(
        self, forward_batch: ForwardBatch, pp_proxy_tensors: Optional[PPProxyTensors] = None
    ) -> ModelRunnerOutput:
        """One forward pass (claim C6); a stage after the first starts from the previous stage's tensors."""
        self.forward_pass_id += 1
        with get_global_expert_distribution_recorder().with_forward_pass(self.forward_pass_id, forward_batch):
            output = self._forward_raw(forward_batch, pp_proxy_tensors)
        get_global_experts_capturer().on_forward_end(forward_batch.out_cache_loc)
        return output

    def _forward_raw(
        self, forward_batch: ForwardBatch, pp_proxy_tensors: Optional[PPProxyTensors]
    ) -> ModelRunnerOutput:
        mode = forward_batch.forward_mode
        if self.graph_runner is not None and self.graph_runner.can_run(forward_batch):
            tracing.point("ModelRunner.forward.dispatch", branch="graph_replay")
            return ModelRunnerOutput(self.graph_runner.replay(forward_batch), can_run_graph=True)
        if mode.is_decode():
            tracing.point("ModelRunner.forward.dispatch", branch="decode")
            return ModelRunnerOutput(self.forward_decode(forward_batch, pp_proxy_tensors), can_run_graph=False)
        if mode.is_extend():
            tracing.point("ModelRunner.forward.dispatch", branch="extend")
            return ModelRunnerOutput(self.forward_extend(forward_batch, pp_proxy_tensors), can_run_graph=False)
        if mode.is_idle():
            raise NotImplementedError("IDLE batches only occur with data-parallel attention, which minisgl omits")
        raise ValueError(f"invalid forward mode {mode}")

    def forward_extend(
        self, forward_batch: ForwardBatch, pp_proxy_tensors: Optional[PPProxyTensors] = None
    ) -> Union[LogitsProcessorOutput, PPProxyTensors]:
        """SGLang's forward_extend and forward_decode differ in graph and metadata paths minisgl omits;
        here they are one body: the backend's metadata for this batch, then the model."""
        self.attn_backend.init_forward_metadata_step(forward_batch)
        # Only a later pipeline stage passes the tensors, so a model without stages is called as before.
        kwargs = {} if pp_proxy_tensors is None else {"pp_proxy_tensors": pp_proxy_tensors}
        with tracing.span("model.forward"):
            return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch, **kwargs)

    forward_decode = forward_extend

    def get_routed_experts(self, slots: torch.Tensor) -> torch.Tensor:
        return get_global_experts_capturer().get_routed_experts(slots)

    # ---- sample --------------------------------------------------------------------------

    @tracing.traced
    def _preprocess_logits(self, logits_output: LogitsProcessorOutput, sampling_info) -> None:
        sampling_info.update_regex_vocab_mask()
        sampling_info.apply_logits_bias(logits_output.next_token_logits)

    @tracing.traced(attrs=lambda self, logits_output, forward_batch: {"return_logprob": forward_batch.return_logprob})
    def sample(self, logits_output: LogitsProcessorOutput, forward_batch: ForwardBatch) -> torch.Tensor:
        """Logits -> next token ids, with logprobs attached when asked (claim C7)."""
        self._preprocess_logits(logits_output, forward_batch.sampling_info)
        return self.sampler(
            logits_output,
            forward_batch.sampling_info,
            forward_batch.return_logprob,
            forward_batch.top_logprobs_nums,
            forward_batch.token_ids_logprobs,
        )
