"""C3 under tensor parallelism: one scheduler process per rank, each building its own
TpModelWorker (its rank identity) and taking rank 0's random seed; weights sharded at load,
all-reduce after row-parallel layers, vocab-parallel embedding and LM head. TP=2 over gloo must
give TP=1's greedy tokens. Checked against traces/tensor_parallel.jsonl."""

import os
import subprocess
import sys

import pytest

from minisgl.configs.model_config import ModelConfig
from minisgl.entrypoints.engine import Engine
from minisgl.managers.scheduler_client import with_dist_init_addr
from minisgl.server_args import ServerArgs
from minisgl.tools.refresh_traces import run_tp_engine
from tests._models import tiny_model_dir
from tests._traces import fresh_and_golden

KW = dict(max_total_tokens=256, max_running_requests=8, device="cpu", attention_backend="torch_native")
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17]]
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def _tp1(path: str, **kwargs) -> list[dict]:
    return Engine(model_path=path, **KW, **kwargs).generate(
        input_ids=PROMPTS, sampling_params=GREEDY, return_logprob=True
    )


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_c3_tp2_gives_tp1_greedy_tokens(arch):
    path = tiny_model_dir(arch)
    expected = _tp1(path)
    with Engine(model_path=path, tp_size=2, **KW) as engine:
        got = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY, return_logprob=True)
        # Control requests reach every rank too; a flushed cache leaves the whole pool free.
        assert engine.flush_cache()
        stats = engine.get_server_info()
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    for g, e in zip(got, expected):
        ours = [lp for lp, _, _ in g["meta_info"]["output_token_logprobs"]]
        ref = [lp for lp, _, _ in e["meta_info"]["output_token_logprobs"]]
        assert ours == pytest.approx(ref, abs=1e-4)
    assert stats["available_kv_tokens"] == stats["max_total_num_tokens"] == 256


def test_c3_tp2_samples_like_tp1_with_the_same_seed(tiny_llama):
    # Unseeded requests draw their seed from the global RNG, seeded by rank 0's random_seed on
    # every rank: ranks sample the same tokens (else their batches would drift apart), and TP=1's.
    params = [
        {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 12, "seed": 3},
        {"temperature": 0.8, "max_new_tokens": 12},
        {"temperature": 1.2, "top_k": 20, "max_new_tokens": 12},
    ]
    kw = dict(model_path=tiny_llama, random_seed=7, **KW)
    expected = Engine(**kw).generate(input_ids=PROMPTS, sampling_params=params)
    with Engine(tp_size=2, **kw) as engine:
        got = engine.generate(input_ids=PROMPTS, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]


def test_c3_uneven_split_is_refused_with_the_reason(tiny_llama):
    config = ModelConfig(tiny_llama)  # 4 heads, 2 KV heads, intermediate 128
    config.verify_tp_size(4)  # KV heads replicated twice
    with pytest.raises(ValueError, match="does not divide the 4 attention heads"):
        config.verify_tp_size(3)


def test_c3_smollm2_heads_do_not_split_in_two(smollm2):
    # 9 query heads, 3 KV heads: refused before any rank process starts.
    with pytest.raises(ValueError, match=r"tp_size=2 does not divide the 9 attention heads.*\[1, 3, 9\]"):
        Engine(model_path=smollm2, tp_size=2, **KW)


def test_c3_golden_trace_matches():
    fresh, golden = fresh_and_golden("tensor_parallel")
    assert fresh == golden, "TP trace changed: review, then python -m minisgl.tools.refresh_traces tensor_parallel"


def _per_rank(events: list[dict]) -> list[list[dict]]:
    ranks, current = [], None
    for e in events:
        if e["event"] == "run_scheduler_process" and e["phase"] == "begin":
            current = []
            ranks.append(current)
        current.append(e)
    return ranks


def test_c3_each_rank_builds_its_own_worker_and_takes_rank0_seed():
    ranks = _per_rank(fresh_and_golden("tensor_parallel")[0])
    assert len(ranks) == 2
    for rank, events in enumerate(ranks):
        names = [e["event"] for e in events]
        worker = next(e for e in events if e["event"] == "TpModelWorker.__init__")
        assert (worker["tp_rank"], worker["is_draft_worker"]) == (rank, False)
        # The group is joined before any layer is built: layers read their rank at construction.
        assert names.index("ModelRunner.init_torch_distributed") < names.index("ModelRunner.initialize")
        seed = next(e for e in events if e["event"] == "TpModelWorker.set_random_seed")
        assert (seed["source_rank"], seed["random_seed"]) == (0, 1234)
    # Rank 0 broadcasts what it received, so both ranks schedule the same batches.
    schedule = [[e for e in events if e["event"].startswith("Scheduler.")] for events in ranks]
    assert schedule[0] == schedule[1] and any(e["event"] == "Scheduler.recv_requests" for e in schedule[0])


@pytest.mark.slow  # two launchers and four processes, ~17 s; the single-node TP tests stay in the default suite
def test_c3_two_nodes_on_loopback(tmp_path, tiny_llama):
    """--nnodes 2: node 1 is a separate launch_server process running rank 1 with its own
    (different) seed; node 0's Engine runs rank 0 and talks to the client. Rank 1 ends up
    with rank 0's seed and the tokens are TP=1's."""
    expected = _tp1(tiny_llama)
    addr = with_dist_init_addr(ServerArgs(model_path=tiny_llama)).dist_init_addr
    env = {**os.environ, "MINISGL_TRACE_DIR": str(tmp_path)}
    node1 = subprocess.Popen(
        [sys.executable, "-m", "minisgl.launch_server", "--model-path", tiny_llama, "--tp-size", "2",
         "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", addr, "--random-seed", "999",
         "--max-total-tokens", "256", "--device", "cpu"],
        env=env,
    )  # fmt: skip
    try:
        got, per_rank = run_tp_engine(
            tiny_llama,
            tmp_path,
            dict(input_ids=PROMPTS, sampling_params=GREEDY),
            tp_size=2,
            nnodes=2,
            node_rank=0,
            dist_init_addr=addr,
            random_seed=1234,
        )
        assert node1.wait(timeout=60) == 0  # node 1 exits when node 0 shuts the group down
    finally:
        node1.kill()
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    rank1 = per_rank[1]
    assert rank1[0]["event"] == "run_scheduler_process" and (rank1[0]["tp_rank"], rank1[0]["node_rank"]) == (1, 1)
    seed = next(e for e in rank1 if e["event"] == "TpModelWorker.set_random_seed")
    assert seed["random_seed"] == 1234


def test_c3_kv_heads_replicated_at_tp4(tiny_llama):
    # 2 KV heads over 4 ranks: each rank keeps one KV head, held by two ranks.
    expected = _tp1(tiny_llama)
    with Engine(model_path=tiny_llama, tp_size=4, **KW) as engine:
        got = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]


@pytest.mark.slow
def test_c3_smollm2_tp3_gives_tp1_greedy_tokens(smollm2):
    # 9 heads / 3 KV heads split three ways: the real model, sharded.
    plain = Engine(model_path=smollm2, **KW)
    prompts = [
        plain.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in ("What is the capital of France?", "Name three colors.")
    ]
    params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    expected = plain.generate(prompts, params)
    with Engine(model_path=smollm2, tp_size=3, **KW) as engine:
        got = engine.generate(prompts, params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]


@pytest.mark.slow  # a TP server and a TP=1 Engine, ~16 s; the Engine-level TP tests stay in the default suite
def test_c3_server_with_tp2_answers_the_openai_client_as_tp1(tiny_llama, tmp_path):
    """``launch_server --tp-size 2``: rank 0 answers HTTP, the other rank follows its broadcasts;
    greedy completions through the real openai client equal the TP=1 Engine's."""
    import socket
    import time

    import httpx
    import openai

    with Engine(model_path=tiny_llama, **KW) as engine:
        expected = [engine.generate(p, GREEDY)["text"] for p in ("The river", "A serving engine")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "minisgl.launch_server", "--model-path", tiny_llama, "--port", str(port),
           "--tp-size", "2", "--max-total-tokens", "256", "--max-running-requests", "8",
           "--attention-backend", "torch_native", "--served-model-name", "tiny"]  # fmt: skip
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        got = [
            client.completions.create(
                model="tiny", prompt=p, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
            )
            .choices[0]
            .text
            for p in ("The river", "A serving engine")
        ]
        assert got == expected
        assert httpx.get(f"http://127.0.0.1:{port}/get_server_info").json()["tp_size"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=60)
