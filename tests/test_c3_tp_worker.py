"""C3: TpModelWorker picks the draft or target model path, builds the ModelRunner, syncs the
random seed, and exposes get_worker_info() and get_memory_pool()."""

import pytest

from minisgl import tracing
from minisgl.managers.tp_worker import TpModelWorker
from minisgl.server_args import ServerArgs
from tests._models import tiny_model_dir


def test_c3_target_worker(tiny_llama):
    args = ServerArgs(model_path=tiny_llama, max_total_tokens=96, random_seed=1234)
    with tracing.record() as events:
        worker = TpModelWorker(args)
    info = worker.get_worker_info()
    assert (info.max_total_num_tokens, info.random_seed, info.device) == (96, 1234, "cpu")
    assert info.max_req_input_len == info.max_req_len - 1
    req_pool, allocator = worker.get_memory_pool()
    assert req_pool is worker.model_runner.req_to_token_pool
    assert allocator.available_size() == 96
    names = [e["event"] for e in events]
    assert names.index("ModelConfig.from_server_args") < names.index("ModelRunner.__init__")
    assert names.index("ModelRunner.initialize") < names.index("TpModelWorker.set_random_seed")


def test_c3_draft_worker_takes_the_draft_path_and_shares_pools(tiny_llama):
    draft_path = tiny_model_dir("qwen3")
    args = ServerArgs(model_path=tiny_llama, speculative_draft_model_path=draft_path, max_total_tokens=64)
    target = TpModelWorker(args)
    req_pool, allocator = target.get_memory_pool()
    draft = TpModelWorker(args, is_draft_worker=True, req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator)
    assert draft.model_config.model_path == draft_path and draft.model_config.is_draft_model
    assert target.model_config.model_path == tiny_llama
    assert draft.get_memory_pool() == (req_pool, allocator)


def test_c3_draft_worker_needs_a_path(tiny_llama):
    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        TpModelWorker(ServerArgs(model_path=tiny_llama, max_total_tokens=64), is_draft_worker=True)
