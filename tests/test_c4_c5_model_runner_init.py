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
    "device",
    "is_draft_worker",
    "shares_pools",
    "use_mla_backend",
    "is_generation",
    "is_multimodal",
    "page_size",
    "attention_backend",
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
    assert (runner.is_draft_worker, runner.page_size) == (False, 4)
    # The pools the runner built are the ones the scheduler allocates from (C3's get_memory_pool).
    assert runner.req_to_token_pool is engine.scheduler.req_to_token_pool
    assert runner.token_to_kv_pool_allocator is engine.scheduler.token_to_kv_pool_allocator


def test_c5_a_moved_init_step_fails_the_order_check(tiny_llama, monkeypatch):
    """Each init step traces itself, so the trace follows the code: build the sampler after
    the model (a reordering a label typed at the call site would have hidden) and the order
    C5 asserts is gone."""
    from minisgl import tracing
    from minisgl.entrypoints.engine import Engine
    from minisgl.model_executor import model_runner as mr

    def initialize_sampler_late(self):
        self.expert_location_metadata = mr.compute_initial_expert_location_metadata(2, 0)
        mr.set_global_expert_distribution_recorder(mr.ExpertDistributionRecorder.init_new(None, 2, 0))
        self.load_model()
        self.sampler = mr.create_sampler()
        self.init_memory_pool()
        self.init_routed_experts_capturer()
        self.init_attention_backend()
        self.init_device_graphs()

    monkeypatch.setattr(
        mr.ModelRunner, "initialize", tracing.traced(initialize_sampler_late, name="ModelRunner.initialize")
    )
    with tracing.record() as events:
        Engine(model_path=tiny_llama, max_total_tokens=64)
    (inside,) = children(events, "ModelRunner.initialize")
    order = top_level_spans(inside)
    assert order != C5_ORDER
    assert order.index("ModelRunner.load_model") < order.index("create_sampler")
