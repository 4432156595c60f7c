"""SGLang's frontend language (``sgl.function`` from the sglang package, 0.5.9) against minisgl:
a program with roles, gen, fork and select, run once and through run_batch, gives the same
output through ``sgl.RuntimeEndpoint`` over ``minisgl.launch_server`` as on the offline Engine
(minisgl.entrypoints.sgl_backend.EngineBackend), under greedy sampling."""

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

sgl = pytest.importorskip("sglang")

from minisgl.entrypoints.engine import Engine  # noqa: E402
from minisgl.entrypoints.sgl_backend import EngineBackend  # noqa: E402

ARGS = ["--max-total-tokens", "4096"]


@sgl.function
def review(s, topic):
    s += sgl.system("You are terse.")
    s += sgl.user("Tell me about " + topic)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8, temperature=0))
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"\nPoint {i} of {topic}:" + sgl.gen("point", max_tokens=6, temperature=0, stop="\n")
    s["points"] = [f["point"] for f in forks]
    s += "\nVerdict:" + sgl.select("verdict", choices=["good", "bad", "unclear"])


def _outputs(backend) -> list:
    state = review.run(topic="rivers", backend=backend)
    batch = review.run_batch([{"topic": t} for t in ("cats", "dogs", "owls")], backend=backend, num_threads=3)
    return [(s["answer"], s["points"], s["verdict"], s.text()) for s in [state, *batch]]


@pytest.fixture(scope="module")
def server_url(tiny_llama, tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "minisgl.launch_server", "--model-path", tiny_llama, "--port", str(port), *ARGS]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log_path.read_text()
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_program_on_server_equals_program_on_engine(server_url, tiny_llama):
    remote = _outputs(sgl.RuntimeEndpoint(server_url))
    with Engine(model_path=tiny_llama, max_total_tokens=4096) as engine:
        local = _outputs(EngineBackend(engine))
    assert remote == local
    for answer, points, verdict, text in remote:
        assert answer and len(points) == 2 and verdict in ("good", "bad", "unclear")
        assert text.startswith("SYSTEM:You are terse.\nUSER:Tell me about ")  # the default chat template's roles
        assert text.endswith(f"\nVerdict:{verdict}")
