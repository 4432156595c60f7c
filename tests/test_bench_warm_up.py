"""bench_offline's graph-runner warm-up: its requests walk the decode batch through every bucket."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

from offline_engines import warm_up_decode_buckets  # noqa: E402

from minisgl.entrypoints.engine import Engine  # noqa: E402
from minisgl.model_executor.graph_runner import get_batch_sizes_to_capture  # noqa: E402


def test_warm_up_decodes_at_every_batch_size_so_every_bucket_compiles_before_the_clock(tiny_llama):
    # Eager: which batch sizes the warm-up decodes at is what decides which buckets it compiles.
    engine = Engine(model_path=tiny_llama, max_total_tokens=2048)
    runner = engine.scheduler.tp_worker.model_runner
    forward, decoded = runner.forward, []

    def recording_forward(forward_batch, **kwargs):
        if forward_batch.forward_mode.is_decode():
            decoded.append(forward_batch.batch_size)
        return forward(forward_batch, **kwargs)

    runner.forward = recording_forward
    try:
        warm_up_decode_buckets(engine, 9)  # buckets 1, 2, 4, 8, 9: 9 needs all nine requests at once
    finally:
        runner.forward = forward
        engine.shutdown()
    assert decoded == list(range(9, 0, -1))
    buckets = get_batch_sizes_to_capture(9)
    assert {min(b for b in buckets if b >= size) for size in decoded} == set(buckets)
