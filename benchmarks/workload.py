"""The fixed offline workload every engine in benchmarks/ runs: random token ids, greedy, EOS ignored."""

from __future__ import annotations

import random

# Issue 8's workload: what bench_offline.py runs by default and workload_phases.py always runs.
OFFLINE_WORKLOAD = dict(num_requests=64, min_input=16, max_input=256, min_output=16, max_output=128, seed=0)


def make_workload(num_requests, min_input, max_input, min_output, max_output, vocab_size, seed):
    """[(prompt_ids, output_len)]: the same list for the same arguments, in any process."""
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(100, vocab_size - 100) for _ in range(rng.randint(min_input, max_input))],
            rng.randint(min_output, max_output),
        )
        for _ in range(num_requests)
    ]
