"""What the book's figures show, measured by running the engine on tiny checkpoints.

Each function returns plain data (lists, dicts, ints): minisgl/tools/make_figures.py
draws it, and tests/test_docs_figures.py recomputes it and compares with the data
committed beside the figures, so a figure cannot drift from the code it pictures.
The init timeline and the forward/sample sequence are drawn from the golden traces in
traces/, which tests/test_c4_c5_model_runner_init.py and
tests/test_c6_c7_c8_forward_sample.py compare against fresh runs.
"""

from __future__ import annotations

from minisgl import tracing
from minisgl.managers.io_struct import TokenizedGenerateReqInput
from minisgl.sampling.sampling_params import SamplingParams

# The normal loop, whose steps each run one batch start to end; overlap_timeline compares both loops.
CPU = dict(device="cpu", attention_backend="torch_native", disable_overlap_schedule=True)


def _engine(path: str, **kwargs):
    from minisgl.entrypoints.engine import Engine

    return Engine(model_path=path, **{**CPU, **kwargs})


def _request(rid: str, input_ids: list[int], max_new_tokens: int) -> TokenizedGenerateReqInput:
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, ignore_eos=True)
    return TokenizedGenerateReqInput(rid=rid, input_text=None, input_ids=input_ids, sampling_params=params)


def _slots(sched, req) -> list[int]:
    if req.req_pool_idx is None:
        return []
    return sched.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].tolist()


def kv_slots(llama: str) -> dict:
    """Chapter 4: which KV slots two requests own after each step, with pages of four slots."""
    engine = _engine(llama, max_total_tokens=64, page_size=4, disable_radix_cache=True)
    sched = engine.scheduler
    reqs = []
    for rid, ids, new in (("a", list(range(10, 15)), 4), ("b", list(range(20, 23)), 4)):
        sched.handle_generate_request(_request(rid, ids, new))
        reqs.append(sched.waiting_queue[-1])
    steps = []
    while not sched.is_idle():
        sched.step()
        steps.append({"batch": sched.last_batch.forward_mode.name, **{r.rid: _slots(sched, r) for r in reqs}})
    return {"page_size": 4, "requests": [r.rid for r in reqs], "steps": steps}


def _tree(node) -> dict:
    return {
        "key": list(node.key),
        "slots": [] if node.value is None else node.value.tolist(),
        "children": [_tree(c) for _, c in sorted(node.children.items())],
    }


def radix_tree(llama: str) -> dict:
    """Chapter 4: the radix cache after three requests that share prefixes have finished."""
    engine = _engine(llama, max_total_tokens=64)
    prompts = {"a": [10, 11, 12, 13, 14, 15], "b": [10, 11, 12, 13, 40, 41], "c": [10, 11, 50]}
    cached = {}
    for rid, ids in prompts.items():  # one after another, so each sees the previous ones' KV
        out = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 1})
        cached[rid] = out["meta_info"]["cached_tokens"]
    return {"prompts": prompts, "cached_tokens": cached, "root": _tree(engine.scheduler.tree_cache.root_node)}


def continuous_batching(llama: str) -> dict:
    """Chapter 9: what each request does at each scheduler step, in a pool too small for all of them."""
    engine = _engine(llama, max_total_tokens=64)
    sched = engine.scheduler
    arrivals = {0: [_request(f"r{i}", [3 + i, 4 + i], 24) for i in range(3)], 6: [_request("r3", [9, 10, 11], 8)]}
    rids = [r.rid for step in sorted(arrivals) for r in arrivals[step]]
    done: set[str] = set()
    steps = []
    while arrivals or not sched.is_idle():
        for req in arrivals.pop(len(steps), []):
            sched.handle_generate_request(req)
        with tracing.record() as events:
            outputs = sched.step()
        retracted = sum(e["num_retracted"] for e in events if e["event"] == "Scheduler.retract_decode")
        batch = sched.last_batch if any(e["event"] == "Scheduler.run_batch" for e in events) else None
        ran = {r.rid for r in batch.reqs} if batch is not None else set()
        waiting = {r.rid for r in sched.waiting_queue}
        done |= {o.rid for o in outputs if o.finished}
        previous = steps[-1] if steps else {}
        state = {}
        for rid in rids:
            if rid in ran and rid not in done:
                state[rid] = "prefill" if batch.forward_mode.name == "EXTEND" else "decode"
            elif rid in waiting:
                was_running = previous.get(rid) in ("prefill", "decode")
                state[rid] = "retracted" if retracted and was_running else "waiting"
            else:
                state[rid] = "done" if rid in done else ""
        steps.append(state)
    return {"requests": rids, "pool": sched.worker_info.max_total_num_tokens, "steps": steps}


def expert_heat(qwen3_moe: str) -> dict:
    """Chapter 8: how often each expert of each layer was chosen over four prompts."""
    engine = _engine(qwen3_moe, max_total_tokens=256, expert_distribution_recorder_mode="stat")
    engine.start_expert_distribution_record()
    prompts = [[5, 6, 7, 8, 9], [20, 21, 22], [40, 41, 42, 43], [60, 61]]
    engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 6, "ignore_eos": True})
    engine.stop_expert_distribution_record()
    dump = engine.dump_expert_distribution_record()
    return {"mode": dump["mode"], "stat": dump["stat"].tolist()}


def _metadata_inputs(llama: str, prompts: list, max_new_tokens: int, mode: str, take) -> list:
    """take(forward_batch, runner) for each `mode` batch of `prompts`, run after [10..14] was cached."""
    engine = _engine(llama, max_total_tokens=64)
    engine.generate(input_ids=[10, 11, 12, 13, 14], sampling_params={"temperature": 0, "max_new_tokens": 1})
    runner = engine.scheduler.tp_worker.model_runner
    seen = []
    original = runner.attn_backend.init_forward_metadata

    def record(forward_batch):
        if forward_batch.forward_mode.name == mode:
            seen.append(take(forward_batch, runner))
        return original(forward_batch)

    runner.attn_backend.init_forward_metadata = record
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params=params)
    return seen


def extend_attention(llama: str) -> dict:
    """Chapter 5: the KV slots each query of a prefill reads, when one request's prefix is cached."""

    def take(forward_batch, runner):
        table = forward_batch.req_to_token_pool.req_to_token
        return [
            {"prefix": p, "new": n, "slots": table[row, : p + n].tolist()}
            for row, p, n in zip(
                forward_batch.req_pool_indices_cpu,
                forward_batch.extend_prefix_lens_cpu,
                forward_batch.extend_seq_lens_cpu,
            )
        ]

    return {"requests": _metadata_inputs(llama, [[10, 11, 12, 13, 30, 31], [50, 51, 52]], 1, "EXTEND", take)[0]}


def kv_indices(llama: str) -> dict:
    """Chapter 5: the flat slot list a paged kernel reads, built from one real decode batch.

    The batch runs on torch_native; its ForwardBatch is handed to TritonAttnBackend's own
    init_forward_metadata (torch ops only, no Triton kernel runs), the code every decode
    step of the Triton backend goes through.
    """
    from minisgl.layers.attention.triton_backend import TritonAttnBackend

    def take(forward_batch, runner):
        triton = TritonAttnBackend(runner)
        triton.init_forward_metadata(forward_batch)
        lens, rows = forward_batch.seq_lens.tolist(), forward_batch.req_pool_indices.tolist()
        table = forward_batch.req_to_token_pool.req_to_token
        return {
            "req_pool_indices": rows,
            "seq_lens": lens,
            "req_to_token": [table[r, :n].tolist() for r, n in zip(rows, lens)],
            "kv_indptr": triton.forward_metadata.kv_indptr.tolist(),
            "kv_indices": triton.forward_metadata.kv_indices.tolist(),
        }

    prompts = [[10, 11, 12, 13, 20, 21], [30, 31, 32], [40, 41]]
    return {"prompts": prompts, **_metadata_inputs(llama, prompts, 2, "DECODE", take)[0]}


# Chapter 1's figure: each config.json field the personality is made of, and what it becomes.
CONFIG_TO_PERSONALITY = [
    ("architectures", "is_generation"),
    ("dtype", "dtype"),
    ("max_position_embeddings", "context_len"),
    ("num_hidden_layers", "num_hidden_layers"),
    ("num_key_value_heads", "num_key_value_heads"),
    ("head_dim", "head_dim"),
    ("num_local_experts", "num_experts"),
    ("num_experts_per_tok", "num_experts_per_tok"),
    ("eos_token_id", "hf_eos_token_id"),
]


def model_config(qwen3_moe: str) -> dict:
    """Chapter 1: config.json fields, the personality ModelConfig makes of them, and the pools sized by it."""
    import json
    from pathlib import Path

    raw = json.loads((Path(qwen3_moe) / "config.json").read_text(encoding="utf-8"))
    engine = _engine(qwen3_moe, max_total_tokens=64)
    runner = engine.scheduler.tp_worker.model_runner
    mc = runner.model_config

    def value(name):
        v = getattr(mc, name)
        return sorted(v) if isinstance(v, set) else str(v).removeprefix("torch.") if name == "dtype" else v

    return {
        "fields": [[key, raw.get(key), name, value(name)] for key, name in CONFIG_TO_PERSONALITY],
        "is_moe": mc.is_moe,
        "req_to_token": list(runner.req_to_token_pool.req_to_token.shape),
        "kv_layers": len(runner.token_to_kv_pool.k_buffer),
        "k_buffer": list(runner.token_to_kv_pool.k_buffer[0].shape),
    }


PARTICIPANTS = ["Engine", "TokenizerManager", "Scheduler", "TpModelWorker", "ModelRunner", "model", "Sampler"]


def overlap_timeline(llama: str) -> dict:
    """Chapter 9: the order in which each loop prepares, runs and processes batches, recorded from
    the same two requests (4 and 6 new tokens). Each entry is (action, batch number, mode)."""
    orders = {}
    for loop in ("normal", "overlap"):
        engine = _engine(llama, disable_overlap_schedule=loop == "normal")
        with tracing.record() as events:
            engine.generate(
                input_ids=[[5, 6, 7, 8], [9, 10]],
                sampling_params=[{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in (4, 6)],
            )
        if loop == "normal":  # each batch is processed right after it ran, on the same thread
            modes = [e["forward_mode"] for e in events if e["event"] == "Scheduler.run_batch" and e["phase"] == "begin"]
            order = [(action, n, mode) for n, mode in enumerate(modes, 1) for action in ("launch", "process")]
        else:
            order, count = [], {"launch": 0, "process": 0}
            for e in events:
                action = {"Scheduler.launch_batch": "launch", "Scheduler.process_batch_result": "process"}.get(
                    e["event"]
                )
                if action is not None:
                    count[action] += 1
                    order.append((action, count[action], e["forward_mode"]))
        orders[loop] = order
    return orders


def request_life(llama: str) -> list[dict]:
    """Chapter 10: one request's spans from the front door to the detokenized text, as the code
    emits them (every span is a traced function, or the model's forward). The Engine drives the
    scheduler inline, so one recorder on this thread sees them all; the HTTP route makes the
    same TokenizerManager.generate_request call, with the scheduler on its own thread."""
    from minisgl.entrypoints.engine import Engine

    engine = Engine(model_path=llama, **CPU, max_total_tokens=64)
    with tracing.record() as events:
        engine.generate("The river rose", sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True})
    keep = (
        "Engine.",
        "TokenizerManager.",
        "GenerateRun.",
        "Scheduler.",
        "TpModelWorker.",
        "ForwardBatch.init_new",
        "ModelRunner.forward",
        "ModelRunner.sample",
        "model.forward",
        "Sampler.forward",
    )
    return [e for e in events if e["event"].startswith(keep) and e["event"] != "ModelRunner.forward.dispatch"]


def quant_blocks(llama: str) -> dict:
    """Chapter 6 (quantization): the first 32 weights of one row of the tiny Llama's down_proj, stored
    in each GGUF block type minisgl multiplies and in W8A8's int8 row, with the fields read back from
    the stored bytes and the weights minisgl's own decoders (ggml_dequantize, the int8 scale) make of them.
    The blocks are written by the `gguf` package's quantizer, llama.cpp's reference rounding."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType as T
    from gguf.quants import quantize
    from safetensors import safe_open

    from minisgl.layers.quantization.gguf_kernel import ggml_dequantize
    from minisgl.layers.quantization.int8_kernel import quantize_weight_int8

    name = "model.layers.0.mlp.down_proj.weight"
    with safe_open(f"{llama}/model.safetensors", "pt") as f:
        row = f.get_tensor(name)[0].float()

    def r(values) -> list[float]:  # six significant digits keep data.json stable and readable
        return [float(f"{v:.6g}") for v in values]

    def fp16(two_bytes) -> float:
        return float(f"{float(np.frombuffer(two_bytes.tobytes(), np.float16)[0]):.6g}")

    data = {"tensor": f"{name}[0, :32]", "k": row.numel(), "weights": r(row[:32].tolist())}
    for t in (T.Q8_0, T.Q4_0, T.Q4_1):
        block = quantize(row[:32].numpy()[None], t)[0]  # one block: its bytes as the file stores them
        if t == T.Q8_0:
            q = block[2:].view(np.int8).tolist()
        else:  # byte j holds weight j in its low nibble and weight j + 16 in its high one
            q = [int(b) & 15 for b in block[-16:]] + [int(b) >> 4 for b in block[-16:]]
        decoded = ggml_dequantize(torch.from_numpy(block[None].copy()), t)[0]
        data[t.name] = {
            "bytes": len(block),
            "d": fp16(block[0:2]),
            "m": fp16(block[2:4]) if t == T.Q4_1 else None,
            "q": q,
            "decoded": r(decoded.tolist()),
        }
    q, scale = quantize_weight_int8(row[None])  # one scale for the whole row of K weights
    data["w8a8_int8"] = {
        "scale": float(f"{float(scale):.6g}"),
        "q": q[0, :32].tolist(),
        "decoded": r((q[0, :32] * scale[0]).tolist()),
    }
    return data
