"""Regenerate the golden traces in traces/ (deliberately: review the diff afterwards).

    python -m minisgl.tools.refresh_traces            # all scenarios
    python -m minisgl.tools.refresh_traces NAME ...   # some of them

Each scenario runs the engine on a tiny deterministic checkpoint under
``tracing.record()`` and returns the events; tests run the same scenarios and
compare with the files, so a changed code path shows up as a failing test and
then as a reviewed diff.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Callable

from minisgl import tracing

TRACES_DIR = Path(__file__).resolve().parents[2] / "traces"
# The traces of one step's order (C1-C12) are taken with the normal loop; overlap_schedule's with the overlap one.
ENGINE_KWARGS = dict(
    max_total_tokens=256,
    max_running_requests=8,
    device="cpu",
    attention_backend="torch_native",
    disable_overlap_schedule=True,
)
PROMPTS = [[5, 6, 7, 8], [9, 10]]


def _tiny(arch: str, workdir: str) -> str:
    from minisgl.tools.make_tiny_model import make_tiny_model

    return str(make_tiny_model(arch, Path(workdir) / arch, seed=0))


def _engine(path: str, **kwargs):
    from minisgl.entrypoints.engine import Engine

    return Engine(model_path=path, **{**ENGINE_KWARGS, **kwargs})


def model_runner_initialize(workdir: str) -> list[dict]:
    """C4/C5: building an Engine, from ModelConfig to init_device_graphs."""
    path = _tiny("llama", workdir)
    with tracing.record() as events:
        _engine(path)
    return events


def model_runner_forward_sample(workdir: str) -> list[dict]:
    """C6/C7/C8: one prefill of two requests, then decode steps, greedy."""
    engine = _engine(_tiny("llama", workdir))
    with tracing.record() as events:
        engine.generate(
            input_ids=PROMPTS,
            sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True},
        )
    return events


def sampling_vocab_mask(workdir: str) -> list[dict]:
    """C7 with a grammar: a regex-constrained request beside a free one. The request's grammar
    compiles in the grammar queue, then every sample() builds the vocab mask from the batch's
    grammars and applies it inside _preprocess_logits, before the Sampler. The spec is compiled
    once before recording, so the recorded request finds it in the cache and waits no step."""
    engine = _engine(_tiny("llama", workdir))
    constrained = {"temperature": 0, "max_new_tokens": 2, "regex": "[a-z]+"}
    engine.generate(input_ids=PROMPTS[0], sampling_params=constrained)
    with tracing.record() as events:
        engine.generate(
            input_ids=PROMPTS,
            sampling_params=[constrained, {"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}],
        )
    keep = (
        "GrammarManager",
        "Scheduler.get_next_batch_to_run",
        "ModelRunner.sample",
        "ModelRunner._preprocess_logits",
        "SamplingBatchInfo",
        "XGrammarGrammar",
        "Sampler.forward",
    )
    return [e for e in events if e["event"].startswith(keep)]


def attention_backend_triton(workdir: str) -> list[dict]:
    """C11 and the Triton backend: chosen at init; metadata built once per forward, before layer 0."""
    path = _tiny("llama", workdir)
    with tracing.record() as events:
        engine = _engine(path, attention_backend="triton", page_size=4)
        engine.generate(
            input_ids=PROMPTS,
            sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True},
        )
    keep = (
        "ModelRunner.init_attention_backend",
        "ModelRunner.forward",
        "attn_backend.init_forward_metadata",
        "RadixAttention.forward",
    )
    return [e for e in events if e["event"].startswith(keep)]


def side_outputs(workdir: str) -> list[dict]:
    """C9: hidden states, routed experts and the expert recorder on a tiny Qwen3-MoE."""
    engine = _engine(
        _tiny("qwen3_moe", workdir),
        enable_return_hidden_states=True,
        enable_return_routed_experts=True,
        expert_distribution_recorder_mode="stat",
    )
    engine.start_expert_distribution_record()
    with tracing.record() as events:
        engine.generate(
            input_ids=PROMPTS[0],
            sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True},
            return_hidden_states=True,
            return_routed_experts=True,
            return_logprob=True,
        )
    keep = (
        "ModelRunner.forward",
        "ModelRunner.sample",
        "ExpertDistributionRecorder",
        "RoutedExpertsCapturer",
        "LogitsProcessor",
    )
    return [e for e in events if e["event"].startswith(keep)]


def run_tp_engine(path: str, trace_dir: Path, generate_kwargs: dict, **engine_kwargs) -> tuple[list, list[list[dict]]]:
    """Run an Engine with tensor (or pipeline) parallelism, its ranks tracing into trace_dir;
    return its results and each rank's events (rank order: stage by stage, TP rank within).
    The ranks are separate processes, so each writes its own trace file when the Engine shuts it down."""
    from minisgl.managers.scheduler_process import TRACE_DIR_ENV

    trace_dir.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get(TRACE_DIR_ENV)
    os.environ[TRACE_DIR_ENV] = str(trace_dir)  # inherited by the spawned rank processes
    try:
        engine = _engine(path, **engine_kwargs)
        try:
            results = engine.generate(**generate_kwargs)
        finally:
            engine.shutdown()
    finally:
        if previous is None:
            os.environ.pop(TRACE_DIR_ENV)
        else:
            os.environ[TRACE_DIR_ENV] = previous
    tp, pp = engine.server_args.tp_size, engine.server_args.pp_size
    names = [f"pp{p}_tp{r}" if pp > 1 else f"tp{r}" for p in range(pp) for r in range(tp)]  # run_scheduler_process's
    return results, [tracing.load_jsonl(trace_dir / f"{n}.jsonl") for n in names]


def tensor_parallel(workdir: str) -> list[dict]:
    """C3 under TP=2: each rank's process builds its own worker (its identity), joins the group
    before loading weights, takes rank 0's seed, and schedules the same batches."""
    _, per_rank = run_tp_engine(
        _tiny("llama", workdir),
        Path(workdir) / "tp-traces",
        dict(input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}),
        tp_size=2,
        random_seed=1234,
    )
    keep = (
        "run_scheduler_process",
        "Scheduler.__init__",
        "TpModelWorker",
        "ModelConfig.from_server_args",
        "ModelRunner.__init__",
        "ModelRunner.init_torch_distributed",
        "ModelRunner.initialize",
        "ModelRunner.load_model",
        "ModelRunner.init_memory_pool",
        "Scheduler.recv_requests",
        "Scheduler.get_next_batch_to_run",
    )
    return [e for events in per_rank for e in events if e["event"].startswith(keep)]


def pipeline_parallel(workdir: str) -> list[dict]:
    """Issue 32, pp 2 on the tiny 2-layer Llama: one request's prefill micro-batch, then its decode
    micro-batch, crossing the two stages. Stage 0 runs layer 0 and sends PPProxyTensors (hidden_states
    and residual, [tokens, hidden]) on; stage 1 receives them, runs layer 1, samples, and sends the
    next token ids back to stage 0; both process the result one iteration later. Stage 0's events,
    then stage 1's."""
    _, per_stage = run_tp_engine(
        _tiny("llama", workdir),
        Path(workdir) / "pp-traces",
        dict(input_ids=PROMPTS[0], sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}),
        pp_size=2,
    )
    keep = (
        "SchedulerPPMixin.",
        "Scheduler.recv_requests",
        "Scheduler.get_next_batch_to_run",
        "Scheduler.process_batch_result",
        "ModelRunner.forward",
        "RadixAttention.forward",
        "ModelRunner.sample",
    )
    return [e for events in per_stage for e in _busy_pp_steps(events, 2) if e["event"].startswith(keep)]


def _busy_pp_steps(events: list[dict], pp_size: int) -> list[dict]:
    """The events of the loop iterations that launch or finish a micro-batch, their slots numbered
    from the first. The others depend on timing, not on the code path: an idle stage 0 polls the
    front end for up to a second per iteration (Scheduler.recv_requests), and every stage runs one
    iteration per stage-0 iteration, so how many idle iterations come before the request, after it
    and around the shutdown depends on when the Engine's messages arrive, and so does the slot
    (mb_id cycles through 0..pp_size-1 every iteration) the request first lands in."""
    steps, current, depth = [], None, 0
    for e in events:
        if e["event"] == "SchedulerPPMixin._pp_step" and e["phase"] == "begin":
            current, depth = [], 0
        if current is None:
            continue
        current.append(e)
        depth += {"begin": 1, "end": -1}.get(e["phase"], 0)
        if depth == 0:
            if any(
                x["event"] in ("Scheduler.get_next_batch_to_run", "Scheduler.process_batch_result") for x in current
            ):
                steps.append(current)
            current = None
    first = steps[0][0]["mb_id"] if steps else 0
    for step in steps:
        step[0] = {**step[0], "mb_id": (step[0]["mb_id"] - first) % pp_size}
    return [e for step in steps for e in step]


def speculative_decoding(workdir: str) -> list[dict]:
    """C12: the draft worker built on the target's pools; a prefill runs both models, a decode
    round drafts k tokens, verifies them in one target forward and frees the rejected slots.
    The draft is the target cut to one layer, so most drafts are refused; on the first prompt
    the first round keeps one."""
    from minisgl.tools.make_draft_model import make_truncated_model

    target = _tiny("llama", workdir)
    draft = str(make_truncated_model(target, Path(workdir) / "draft", num_layers=1))
    with tracing.record() as events:
        engine = _engine(
            target, speculative_algorithm="STANDALONE", speculative_draft_model_path=draft, speculative_num_steps=2
        )
        engine.generate(
            input_ids=[[20, 21, 22, 23, 24], PROMPTS[0]],
            sampling_params={"temperature": 0, "max_new_tokens": 4, "ignore_eos": True},
        )
    keep = (
        "Scheduler.__init__",
        "StandaloneWorker",
        "TpModelWorker",
        "ModelConfig.from_server_args",
        "ModelRunner.__init__",
        "ModelRunner.init_memory_pool",
        "ModelRunner.forward",
        "ForwardBatch.init_new",
        "Scheduler.get_next_batch_to_run",
    )
    return [e for e in events if e["event"].startswith(keep)]


def eagle_decoding(workdir: str) -> list[dict]:
    """C12 with an EAGLE head: the prefill's target extend and draft extend, then rounds of two
    draft forwards (a tree of top-2 per step), one TARGET_VERIFY of t0 and the 3 best nodes,
    and the draft extend over what was accepted. The head is random, so the scenario plants the
    target's next tokens along one branch (tools/eagle_oracle.py) and verify accepts a path."""
    from minisgl.tools.eagle_oracle import plant_oracle
    from minisgl.tools.make_eagle_head import make_eagle_head

    target = _tiny("llama", workdir)
    head = str(make_eagle_head(target, Path(workdir) / "head", "EAGLE"))
    params = {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}
    expected = _engine(target).generate(input_ids=PROMPTS[:1], sampling_params=params)[0]["output_ids"]
    with tracing.record() as events:
        engine = _engine(
            target,
            speculative_algorithm="EAGLE",
            speculative_draft_model_path=head,
            speculative_num_steps=3,
            speculative_eagle_topk=2,
            speculative_num_draft_tokens=4,
        )
        plant_oracle(engine.scheduler.draft_worker, {tuple(PROMPTS[0]): expected}, depth=2)
        engine.generate(input_ids=PROMPTS[0], sampling_params=params)
    keep = ("EAGLEWorker", "TpModelWorker.__init__", "ModelRunner.forward", "Scheduler.get_next_batch_to_run")
    return [e for e in events if e["event"].startswith(keep)]


def mla_personality(workdir: str) -> list[dict]:
    """use_mla_backend on a tiny DeepSeek-V3: the latent pool, then expanded prefill and absorbed decode."""
    with tracing.record() as events:
        engine = _engine(_tiny("deepseek_v3", workdir))
        engine.generate(
            input_ids=PROMPTS,
            sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True},
        )
    keep = ("ModelRunner.__init__", "MLATokenToKVPool", "ModelRunner.forward", "MLAAttention.forward")
    return [e for e in events if e["event"].startswith(keep)]


def overlap_schedule(workdir: str) -> list[dict]:
    """event_loop_overlap: batch N+1 is launched before batch N's result is processed; the forward
    thread's events arrive with its result. Two requests of 2 and 3 tokens: the first's last token
    is known to end it, so it is not decoded again; the second ends one step later."""
    engine = _engine(_tiny("llama", workdir), disable_overlap_schedule=False)
    with tracing.record() as events:
        engine.generate(
            input_ids=PROMPTS,
            sampling_params=[{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in (2, 3)],
        )
    keep = ("Scheduler.launch_batch", "Scheduler.process_batch_result", "ModelRunner.forward")
    return [e for e in events if e["event"].startswith(keep) and e["phase"] != "end"]


def overlap_delayed_sample(workdir: str) -> list[dict]:
    """event_loop_overlap with a grammar: the batch is launched before the previous result is
    processed, and sampled after it (launch_batch_sample), when its matcher has accepted the
    previous token. One request of 3 tokens under a regex."""
    engine = _engine(_tiny("llama", workdir), disable_overlap_schedule=False)
    with tracing.record() as events:
        engine.generate(
            input_ids=PROMPTS[:1], sampling_params={"temperature": 0, "max_new_tokens": 3, "regex": "[a-z]+"}
        )
    keep = ("Scheduler.launch_batch", "Scheduler.process_batch_result", "ModelRunner.forward", "ModelRunner.sample")
    keep += ("SamplingBatchInfo.update_regex_vocab_mask",)
    return [e for e in events if e["event"].startswith(keep) and e["phase"] != "end"]


def mixed_chunk(workdir: str) -> list[dict]:
    """--enable-mixed-chunk: a 4-token prompt and a 20-token one, in chunks of 8. The first prefill
    holds the short prompt and the long one's first 4 tokens; once the short one decodes, each later
    chunk of the long one carries its decode step (MIXED), then both decode."""
    engine = _engine(_tiny("llama", workdir), enable_mixed_chunk=True, chunked_prefill_size=8)
    with tracing.record() as events:
        engine.generate(
            input_ids=[[5, 6, 7, 8], list(range(30, 50))],
            sampling_params={"temperature": 0, "max_new_tokens": 6, "ignore_eos": True},
        )
    return [e for e in events if e["event"] == "Scheduler.get_next_batch_to_run"]


SCENARIOS: dict[str, Callable[[str], list[dict]]] = {
    "model_runner_initialize": model_runner_initialize,
    "model_runner_forward_sample": model_runner_forward_sample,
    "sampling_vocab_mask": sampling_vocab_mask,
    "attention_backend_triton": attention_backend_triton,
    "side_outputs": side_outputs,
    "tensor_parallel": tensor_parallel,
    "pipeline_parallel": pipeline_parallel,
    "speculative_decoding": speculative_decoding,
    "eagle_decoding": eagle_decoding,
    "mla_personality": mla_personality,
    "overlap_schedule": overlap_schedule,
    "overlap_delayed_sample": overlap_delayed_sample,
    "mixed_chunk": mixed_chunk,
}


def run_scenario(name: str) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="minisgl-trace-") as workdir:
        return SCENARIOS[name](workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", choices=[[], *SCENARIOS], default=[])
    names = parser.parse_args().names or list(SCENARIOS)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name in names:
        path = TRACES_DIR / f"{name}.jsonl"
        events = run_scenario(name)
        tracing.dump_jsonl(events, path)
        print(f"wrote {len(events)} events to {path}")


if __name__ == "__main__":
    main()
