"""bench_offline.py's floors (benchmarks/floor.py) on a toy model and workload, worked out by hand."""

import pathlib
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_offline import workload_flops  # noqa: E402
from floor import Step, floors, workload_steps  # noqa: E402

# One layer: 144 multiply-adds per token (QKV 32, O 16, MLP 96), an LM head of 40, KV of 8 bytes
# per token in a 2-byte dtype, weights of (144 + 40) * 2 = 368 bytes.
CONFIG = SimpleNamespace(
    hidden_size=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=2,
    intermediate_size=8,
    num_hidden_layers=1,
    vocab_size=10,
)
WORKLOAD = [([1, 2, 3], 3), ([4, 5], 1)]


def test_steps_are_chunked_prefill_then_decode_with_every_unfinished_request():
    steps = workload_steps(CONFIG, WORKLOAD, elt_bytes=2, chunk=4)
    # attention over query position t costs 16 t FLOPs here (2 matmuls x 2 x heads 2 x dim 2 x t)
    assert steps == [
        Step(288 * 3 + 16 * (1 + 2 + 3) + 80 + 288 + 16 * 1, 368 + 8 * 3 + 8 * 1),  # all of 0, first token of 1
        Step(288 + 16 * 2 + 80, 368 + 8 * 2),  # the rest of 1, which reads its first token's KV too
        Step(288 + 80 + 16 * 4, 368 + 8 * 4),  # decode: request 0 alone, context 4
        Step(288 + 80 + 16 * 5, 368 + 8 * 5),
    ]
    # the same FLOPs as the closed form the compute-only floor divides
    assert sum(s.flops for s in steps) == workload_flops(CONFIG, WORKLOAD)


def test_the_roofline_floor_takes_the_slower_of_compute_and_memory_per_step():
    steps = workload_steps(CONFIG, WORKLOAD, elt_bytes=2, chunk=4)
    compute, roofline = floors(steps, rate=100, bandwidth=1e9)  # memory free: the floors agree
    assert compute == pytest.approx(26.24) and roofline == pytest.approx(compute)
    compute, roofline = floors(steps, rate=100, bandwidth=10)  # every step waits for its bytes here
    assert compute == pytest.approx(26.24) and roofline == pytest.approx(40 + 38.4 + 40 + 40.8)
    _, mixed = floors(steps, rate=100, bandwidth=30)  # the big prefill step is compute-bound, the rest are not
    assert mixed == pytest.approx(13.44 + 384 / 30 + 400 / 30 + 408 / 30)
