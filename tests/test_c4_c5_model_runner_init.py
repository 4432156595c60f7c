"""C4: ModelRunner.__init__ fixes the personality before initialize() runs.
C5: initialize() assembles the shell in SGLang's order. Checked against traces/model_runner_initialize.jsonl."""

from tests._traces import children, fresh_and_golden, top_level_spans

C5_ORDER = [
    "compute_initial_expert_location_metadata",
    "ExpertDistributionRecorder.init_new",
    "create_sampler",
    "ModelRunner.load_model",
    "ModelRunner.init_memory_pool",
    "ModelRunner.init_routed_experts_capturer",
    "ModelRunner.init_attention_backend",
    "ModelRunner.init_device_graphs",
]
C4_PERSONALITY = {
    "device", "is_draft_worker", "shares_pools", "use_mla_backend", "is_generation",
    "is_multimodal", "page_size", "attention_backend",
}


def test_golden_trace_matches():
    fresh, golden = fresh_and_golden("model_runner_initialize")
    assert fresh == golden, "init trace changed: review, then python -m minisgl.tools.refresh_traces"


def test_c4_personality_fixed_before_initialize():
    fresh, _ = fresh_and_golden("model_runner_initialize")
    names = [e["event"] for e in fresh]
    personality = next(e for e in fresh if e["event"] == "ModelRunner.__init__")
    assert C4_PERSONALITY <= personality.keys()
    assert names.index("ModelRunner.__init__") < names.index("ModelRunner.initialize")
    # The personality comes from a ModelConfig normalized before any model class is built (C2 -> C4).
    assert names.index("ModelConfig.from_server_args") < names.index("ModelRunner.__init__")


def test_c5_initialize_order():
    fresh, _ = fresh_and_golden("model_runner_initialize")
    (inside,) = children(fresh, "ModelRunner.initialize")
    assert top_level_spans(inside) == C5_ORDER


def test_c4_personality_object(tiny_llama):
    from minisgl.entrypoints.engine import Engine

    engine = Engine(model_path=tiny_llama, max_total_tokens=128, page_size=4)
    runner = engine.scheduler.tp_worker.model_runner
    assert (runner.is_draft_worker, runner.use_mla_backend, runner.page_size) == (False, False, 4)
    assert runner.is_generation and not runner.is_multimodal
    assert runner.req_to_token_pool is not None and runner.token_to_kv_pool_allocator is not None
