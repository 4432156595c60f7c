"""TpModelWorker: the outer execution shell the scheduler drives.

Mirrors python/sglang/srt/managers/tp_worker.py (TpModelWorker.__init__,
_init_model_config, _init_model_runner, get_worker_info, get_memory_pool,
forward_batch_generation). It is more than a rank wrapper (claim C3): it
picks the draft or target model path, builds the ModelRunner, agrees on the
random seed with the other ranks, and gives the scheduler a narrow interface,
so the scheduler never reaches a ModelRunner or a model (C1). On a pipeline stage before the last
it returns the stage's PPProxyTensors instead of sampled tokens (tp_worker.py:511). SGLang also
hosts LoRA, weight updates, hicache hooks and dLLM here; omitted.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Callable, Optional

import torch

from minisgl import tracing
from minisgl.configs.model_config import ModelConfig
from minisgl.distributed.parallel_state import get_pp_group, get_world_group
from minisgl.distributed.utils import broadcast_pyobj
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.layers.utils import PPProxyTensors
from minisgl.mem_cache.allocator import TokenToKVPoolAllocator
from minisgl.mem_cache.memory_pool import ReqToTokenPool
from minisgl.model_executor.forward_batch_info import ForwardBatch
from minisgl.model_executor.model_runner import ModelRunner
from minisgl.server_args import ServerArgs

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import ModelWorkerBatch
    from minisgl.sampling.sampling_batch_info import SamplingBatchInfo


@dataclasses.dataclass
class GenerationBatchResult:
    logits_output: Optional[LogitsProcessorOutput]  # None on a pipeline stage before the last
    next_token_ids: Optional[torch.Tensor]  # None for a verify forward, which the caller samples
    # Speculative decode: drafts accepted per request; next_token_ids then holds, request
    # after request, those drafts and one token of the target's own (n + 1 each).
    accept_length_per_req_cpu: Optional[list[int]] = None
    # A pipeline stage before the last: what it hands the next stage (SGLang's field name).
    pp_hidden_states_proxy_tensors: Optional[PPProxyTensors] = None
    # A batch whose sampling was delayed (ModelWorkerBatch.delay_sample): the overlap loop calls
    # this with the batch's sampling info once it can be built, and gets the next token ids.
    delay_sample_func: Optional[Callable[["SamplingBatchInfo"], torch.Tensor]] = None


@dataclasses.dataclass
class WorkerInfo:
    max_total_num_tokens: int
    max_prefill_tokens: int
    max_running_requests: int
    max_req_len: int
    max_req_input_len: int
    random_seed: int
    device: str
    page_size: int
    vocab_size: int
    # Every rank's process and share, gathered at start-up: pid, pp_rank, tp_rank, its layers
    # [start, end), its KV pool's and weights' bytes (/get_server_info reports it).
    rank_layout: list[dict]


class TpModelWorker:
    def __init__(
        self,
        server_args: ServerArgs,
        tp_rank: int = 0,
        is_draft_worker: bool = False,
        req_to_token_pool: Optional[ReqToTokenPool] = None,
        token_to_kv_pool_allocator: Optional[TokenToKVPoolAllocator] = None,
        pp_rank: int = 0,
    ) -> None:
        self.server_args = server_args
        self.tp_rank = tp_rank
        self.tp_size = server_args.tp_size
        self.pp_rank = pp_rank
        self.pp_size = server_args.pp_size
        self.is_draft_worker = is_draft_worker
        with tracing.span("TpModelWorker.__init__", tp_rank=tp_rank, is_draft_worker=is_draft_worker):
            self._init_model_config()
            self._init_model_runner(req_to_token_pool, token_to_kv_pool_allocator)
            # Every rank must sample identically, so rank 0's seed wins (claim C3).
            world = get_world_group()
            self.random_seed = broadcast_pyobj(
                [server_args.random_seed], world.rank if world else 0, world.cpu_group if world else None, src=0
            )[0]
            tracing.point("TpModelWorker.set_random_seed", source_rank=0, random_seed=self.random_seed)
            torch.manual_seed(self.random_seed)

    def _init_model_config(self) -> None:
        model_path = (
            self.server_args.speculative_draft_model_path if self.is_draft_worker else self.server_args.model_path
        )
        if self.is_draft_worker and model_path is None:
            raise ValueError("a draft worker needs speculative_draft_model_path")
        self.model_config = ModelConfig.from_server_args(
            self.server_args, model_path=model_path, is_draft_model=self.is_draft_worker
        )

    def _init_model_runner(self, req_to_token_pool, token_to_kv_pool_allocator) -> None:
        self._model_runner = ModelRunner(
            model_config=self.model_config,
            server_args=self.server_args,
            tp_rank=self.tp_rank,
            tp_size=self.tp_size,
            is_draft_worker=self.is_draft_worker,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
            pp_rank=self.pp_rank,
            pp_size=self.pp_size,
        )
        runner = self._model_runner
        mine = {
            "pid": os.getpid(),
            "pp_rank": self.pp_rank,
            "tp_rank": self.tp_rank,
            "layers": [runner.start_layer, runner.end_layer],
            "kv_pool_bytes": runner.token_to_kv_pool.get_kv_size_bytes(),
            "weight_bytes": runner.weight_size_bytes(),
        }
        world = get_world_group()
        self.rank_layout = world.all_gather_object(mine) if world is not None and not self.is_draft_worker else [mine]

    @property
    def model_runner(self) -> ModelRunner:
        return self._model_runner

    def get_worker_info(self) -> WorkerInfo:
        runner = self._model_runner
        # A speculative round writes its slots' positions past the last token.
        max_req_len = self.model_config.context_len - (self.server_args.speculative_num_slots_per_round() - 1)
        return WorkerInfo(
            max_total_num_tokens=runner.max_total_num_tokens,
            max_prefill_tokens=self.server_args.max_prefill_tokens,
            max_running_requests=min(self.server_args.max_running_requests, runner.req_to_token_pool.size),
            max_req_len=max_req_len,
            max_req_input_len=max_req_len - 1,  # room for at least one generated token
            random_seed=self.random_seed,
            device=runner.device,
            page_size=runner.page_size,
            vocab_size=self.model_config.vocab_size,
            rank_layout=self.rank_layout,
        )

    def get_memory_pool(self) -> tuple[ReqToTokenPool, TokenToKVPoolAllocator]:
        return self._model_runner.req_to_token_pool, self._model_runner.token_to_kv_pool_allocator

    def get_routed_experts(self, slots: torch.Tensor) -> torch.Tensor:
        """A finished request's experts, [tokens, layers, top_k], read by its KV slots. A pipeline
        stage filled only its own layers (-1 elsewhere), so the stages' maxima are the whole."""
        experts = self._model_runner.get_routed_experts(slots)
        pp_group = get_pp_group()
        return experts if pp_group is None else pp_group.all_reduce_max(experts)

    @tracing.traced
    def forward_batch_generation(
        self,
        model_worker_batch: "ModelWorkerBatch",
        is_verify: bool = False,
        pp_proxy_tensors: Optional[PPProxyTensors] = None,
    ) -> GenerationBatchResult:
        """ForwardBatch.init_new -> forward -> (verify: stop) -> sample (claim C8). A pipeline stage
        before the last stops after its layers and returns their tensors (SGLang's tp_worker.py:511);
        a batch with delay_sample returns before sampling, with the sampling as delay_sample_func."""
        forward_batch = ForwardBatch.init_new(model_worker_batch, self._model_runner)
        out = self._model_runner.forward(forward_batch, pp_proxy_tensors=pp_proxy_tensors)
        if self.pp_rank < self.pp_size - 1:
            return GenerationBatchResult(None, None, pp_hidden_states_proxy_tensors=out.logits_output)
        if is_verify:
            # Speculative verification samples against the draft tokens itself.
            return GenerationBatchResult(out.logits_output, None)
        if model_worker_batch.delay_sample:
            # SGLang's delay_sample_func: the forward is done, the sampling waits for the caller.
            def delay_sample_func(sampling_info: "SamplingBatchInfo") -> torch.Tensor:
                forward_batch.sampling_info = sampling_info
                return self._model_runner.sample(out.logits_output, forward_batch)

            return GenerationBatchResult(out.logits_output, None, delay_sample_func=delay_sample_func)
        next_token_ids = self._model_runner.sample(out.logits_output, forward_batch)
        return GenerationBatchResult(out.logits_output, next_token_ids)
