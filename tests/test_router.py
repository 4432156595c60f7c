"""sglang-router (SGLang's Rust load balancer, cache-aware policy) in front of two minisgl servers on
loopback, started by minisgl.tools.launch_replicas: it serves the openai client and /generate,
spreads concurrent distinct prompts over both replicas, and sends prompts that share a long prefix to one
replica, whose radix cache then serves that prefix (its cached-token count, from /get_server_info)."""

import concurrent.futures
import random
import socket

import httpx
import openai
import pytest

from minisgl.tools import launch_replicas

pytest.importorskip("sglang_router")
pytestmark = pytest.mark.slow  # two servers and the router start: ~30-60 s on 2 cores

GREEDY = {"temperature": 0, "max_tokens": 4}


def _free_port_block(n: int) -> int:
    """A port p with p .. p+n-1 free (the router, the replicas, the router's metrics)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no block of free ports")


@pytest.fixture(scope="module")
def router(tiny_llama, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("OMP_NUM_THREADS", "1")
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    port = _free_port_block(4)
    server_argv = ["--model-path", tiny_llama, "--served-model-name", "tiny", "--max-total-tokens", "4096"]
    log_dir = str(tmp_path_factory.mktemp("replicas"))
    supervisor = launch_replicas.launch(2, port, server_argv, log_dir=log_dir, timeout=240)
    yield f"http://127.0.0.1:{port}", [f"http://127.0.0.1:{port + 1}", f"http://127.0.0.1:{port + 2}"]
    supervisor.stop()
    assert all(p.returncode is not None for p in supervisor.procs)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _counts(replicas: list[str]) -> list[tuple[int, int]]:
    infos = [httpx.get(f"{url}/get_server_info", timeout=30).json() for url in replicas]
    return [(info["prompt_tokens"], info["cached_tokens"]) for info in infos]


def test_openai_client_and_generate_through_the_router(router):
    url, _ = router
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    completion = client.completions.create(model="tiny", prompt="The river", **GREEDY)
    assert completion.usage.completion_tokens == 4
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], **GREEDY)
    assert chat.choices[0].finish_reason == "length"
    stream = client.completions.create(model="tiny", prompt="The river", stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in stream) == completion.choices[0].text
    # The native route too: the router re-serializes the body with its own defaults and the model name.
    out = httpx.post(
        f"{url}/generate", json={"text": "The river", "sampling_params": {"max_new_tokens": 4}}, timeout=60
    )
    assert out.status_code == 200, out.text
    assert out.json()["meta_info"]["completion_tokens"] == 4


def test_distinct_prompts_spread_and_a_shared_prefix_sticks(router):
    url, replicas = router
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    rng = random.Random(0)
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar".split()

    # Distinct prompts sent together: none matches the router's prefix trees, so each goes to the
    # replica with the fewest requests in flight (sglang-router's low-match rule), which spreads them.
    prompts = [f"{i} " + " ".join(rng.choice(words) for _ in range(12)) for i in range(8)]
    before = _counts(replicas)
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        list(
            pool.map(lambda p: client.completions.create(model="tiny", prompt=p, temperature=0, max_tokens=16), prompts)
        )
    after = _counts(replicas)
    assert all(a[0] > b[0] for a, b in zip(after, before)), (before, after)

    # Prompts sharing a long prefix: all go where the first went, whose radix cache serves the prefix.
    prefix = " ".join(rng.choice(words) for _ in range(150))
    before = _counts(replicas)
    for i in range(6):
        client.completions.create(model="tiny", prompt=f"{prefix} question {i}:", **GREEDY)
    after = _counts(replicas)
    prompt_delta = [a[0] - b[0] for a, b in zip(after, before)]
    cached_delta = [a[1] - b[1] for a, b in zip(after, before)]
    (target,) = [i for i, d in enumerate(prompt_delta) if d > 0]  # exactly one replica saw them
    # Five of the six found the prefix cached: well over half of their prompt tokens.
    assert cached_delta[target] > 0.5 * prompt_delta[target] * 5 / 6, (prompt_delta, cached_delta)
