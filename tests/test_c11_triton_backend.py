"""The Triton attention backend end to end (under the interpreter on CPU).

Greedy tokens equal the torch_native backend's; the backend is chosen in
init_attention_backend (C11) and its metadata is built once per forward, before the
first attention layer. Checked against traces/attention_backend_triton.jsonl."""

import pytest

from minisgl.entrypoints.engine import Engine
from minisgl.layers.attention.triton_backend import TritonAttnBackend
from tests._models import tiny_model_dir
from tests._traces import children, fresh_and_golden

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18], [19]]
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


# The llama case stays in the default suite; the other two (about 25 s under the Triton interpreter) run with -m slow.
@pytest.mark.parametrize(
    "arch,page_size",
    [
        ("llama", 1),
        pytest.param("qwen3", 4, marks=pytest.mark.slow),
        pytest.param("qwen3_moe", 1, marks=pytest.mark.slow),
    ],
)
def test_triton_matches_torch_native(arch, page_size):
    path = tiny_model_dir(arch)
    native = Engine(model_path=path, max_total_tokens=256, page_size=page_size, attention_backend="torch_native")
    triton = Engine(model_path=path, max_total_tokens=256, page_size=page_size, attention_backend="triton")
    assert isinstance(triton.scheduler.tp_worker.model_runner.attn_backend, TritonAttnBackend)
    expected = native.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    got = triton.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in expected]
    assert triton.flush_cache() and triton.scheduler.token_to_kv_pool_allocator.available_size() == 256


def test_golden_trace_matches():
    fresh, golden = fresh_and_golden("attention_backend_triton")
    assert fresh == golden, "triton trace changed: review, then python -m minisgl.tools.refresh_traces"


def test_metadata_once_per_forward_before_first_layer():
    fresh, _ = fresh_and_golden("attention_backend_triton")
    chosen = [e for e in fresh if e["event"] == "ModelRunner.init_attention_backend" and e["phase"] == "begin"]
    assert [e["backend"] for e in chosen] == ["triton"]
    forwards = children(fresh, "ModelRunner.forward")
    assert len(forwards) == 2
    for inside in forwards:
        names = [e["event"] for e in inside]
        assert names.count("attn_backend.init_forward_metadata") == 2  # one begin, one end
        first_layer = names.index("RadixAttention.forward")
        assert names.index("attn_backend.init_forward_metadata") < first_layer
        assert [e["layer_id"] for e in inside if e["event"] == "RadixAttention.forward"] == [0, 1]
