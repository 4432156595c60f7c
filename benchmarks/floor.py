"""The floor of an offline workload, step by step: benchmarks/roofline.py's rule applied to every step.

A step cannot take less than its FLOPs at the best GEMM rate, nor less than the bytes it must read
at DRAM bandwidth: every weight once (a step multiplies each layer once, whatever its batch) and the
KV its attention reads. bench_offline.py sums the larger of the two over the steps a
continuous-batching engine runs the workload in, beside the compute-only floor (all FLOPs at the
GEMM rate). The two part where decode steps are small: at batch 32 a step's matrix work on AMX is a
fraction of the time its weights take to arrive, and the compute-only floor would ask for the impossible.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Step:
    flops: float
    bytes: float


def _sizes(config) -> tuple[int, int, int, int, int]:
    """Hidden size, layers, query heads, head dim, and the multiply-adds (= weights) of one layer per token."""
    h, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", heads)
    head_dim = getattr(config, "head_dim", None) or h // heads
    per_layer = h * (heads + 2 * kv_heads) * head_dim + heads * head_dim * h + 3 * h * config.intermediate_size
    return h, config.num_hidden_layers, heads, head_dim, per_layer


def workload_steps(config, workload: list[tuple[list[int], int]], elt_bytes: int, chunk: int = 2048) -> list[Step]:
    """The steps of the workload ((prompt, output tokens) pairs): prompts prefilled back to back in
    chunks of ``chunk`` tokens (minisgl's CPU chunked_prefill_size), each prompt's last position
    through the LM head; then one decode step per further output token with every unfinished
    request, each attending to its whole context. Bytes: all weights in ``elt_bytes`` per step, plus
    K and V of every context position a step's attention reads."""
    h, layers, heads, head_dim, per_layer = _sizes(config)
    kv_heads = getattr(config, "num_key_value_heads", heads)
    kv_per_token = 2 * layers * kv_heads * head_dim * elt_bytes
    weights = (layers * per_layer + config.vocab_size * h) * elt_bytes
    dense, head = 2 * per_layer * layers, 2 * h * config.vocab_size

    def attention(first: int, last: int) -> int:  # q.k and p.v for query positions first..last (1-based)
        return 2 * 2 * heads * head_dim * layers * (last * (last + 1) - (first - 1) * first) // 2

    steps, current = [], Step(0.0, weights)
    room = chunk
    for prompt, _ in workload:
        done = 0
        while done < len(prompt):
            take = min(room, len(prompt) - done)
            current.flops += dense * take + attention(done + 1, done + take)
            current.bytes += kv_per_token * (done + take)
            done, room = done + take, room - take
            if done == len(prompt):
                current.flops += head
            if room == 0:
                steps.append(current)
                current, room = Step(0.0, weights), chunk
    if room < chunk:
        steps.append(current)
    for j in range(1, max(n for _, n in workload)):
        running = [len(p) + j for p, n in workload if n > j]
        flops = sum(dense + head + attention(c, c) for c in running)
        steps.append(Step(flops, weights + kv_per_token * sum(running)))
    return steps


def floors(steps: list[Step], rate: float, bandwidth: float) -> tuple[float, float]:
    """(compute-only floor, roofline floor) in seconds: all FLOPs at ``rate``, and the sum over steps
    of max(FLOPs at ``rate``, bytes at ``bandwidth``)."""
    compute = sum(s.flops for s in steps) / rate
    return compute, sum(max(s.flops / rate, s.bytes / bandwidth) for s in steps)
