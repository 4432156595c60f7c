"""Profiling (Engine.start_profile/stop_profile, /start_profile, /stop_profile) and SGLang's smaller routes.

The profiler trace must be a Chrome trace holding minisgl's own spans (minisgl.tracing turns
them into record_function ranges while it runs). Also: /server_info, /get_model_info's
model_path as given, /v1/responses refused by name, --grammar-backend, and an Engine that
has been shut down saying so.
"""

import json
import pathlib

import pytest
from fastapi.testclient import TestClient

from minisgl.entrypoints.engine import Engine
from minisgl.entrypoints.http_server import create_app
from minisgl.launch_server import main as launch_main
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

GREEDY = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 3}


def _span_names(path) -> set[str]:
    events = json.loads(pathlib.Path(path).read_text())["traceEvents"]
    return {e.get("name") for e in events}


def test_engine_profile_writes_a_chrome_trace_with_minisgl_spans(tiny_llama, tmp_path):
    with Engine(model_path=tiny_llama, max_total_tokens=256) as engine:
        engine.start_profile(output_dir=str(tmp_path))
        engine.generate("The river", GREEDY)
        path = engine.stop_profile()
        with pytest.raises(RuntimeError, match="not running"):
            engine.stop_profile()
    assert pathlib.Path(path).parent == tmp_path
    names = _span_names(path)
    assert "ModelRunner.forward" in names and any(n and n.startswith("aten::") for n in names)


@pytest.fixture(scope="module")
def http(tiny_llama):
    tm = TokenizerManager(ServerArgs(model_path=tiny_llama, max_total_tokens=512), threaded=True)
    yield TestClient(create_app(tm, "m"))
    tm.shutdown()


def test_profile_routes(http, tmp_path):
    assert http.post("/start_profile", json={"output_dir": str(tmp_path)}).status_code == 200
    assert http.post("/start_profile").status_code == 400  # already running
    assert http.post("/generate", json={"text": "Hi", "sampling_params": GREEDY}).status_code == 200
    r = http.post("/stop_profile")
    assert r.status_code == 200 and "ModelRunner.forward" in _span_names(r.json()["trace_path"])
    bad = http.post("/start_profile", json={"num_steps": 3})
    assert bad.status_code == 400 and "num_steps" in bad.json()["error"]["message"]


def test_server_info_and_model_info(http, tiny_llama):
    assert http.get("/server_info").json()["served_model_name"] == "m"
    info = http.get("/get_model_info").json()
    assert info["model_path"] == tiny_llama and info["is_generation"] is True


def test_model_path_as_given():
    # The default alias resolves to a cache folder; what was given is what /get_model_info reports.
    args = ServerArgs.__new__(ServerArgs)
    args.model_path, args.speculative_draft_model_path = "SmolLM2-135M-Instruct", None
    try:
        args._handle_model_paths()
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"the default model is not installed: {e}")
    assert args.model_path_as_given == "SmolLM2-135M-Instruct" and args.model_path != args.model_path_as_given


def test_responses_api_is_refused_by_name(http):
    r = http.post("/v1/responses", json={"model": "m", "input": "Hi"})
    assert r.status_code == 400 and "/v1/responses" in r.json()["error"]["message"]


def test_image_content_part_is_refused_readably(http):
    part = {"type": "image_url", "image_url": {"url": "http://x/a.png"}}
    r = http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400 and "does not support 'image_url' content parts" in r.json()["error"]["message"]


def test_grammar_backend_flag(tiny_llama):
    assert ServerArgs(model_path=tiny_llama, grammar_backend="xgrammar").grammar_backend == "xgrammar"
    with pytest.raises(ValueError, match="grammar_backend 'outlines' is not available"):
        ServerArgs(model_path=tiny_llama, grammar_backend="outlines")
    with pytest.raises(ValueError, match="grammar_backend 'llguidance'"):  # SGLang's flag parses, the value is named
        launch_main(["--model-path", tiny_llama, "--grammar-backend", "llguidance"])


def test_engine_after_shutdown_says_so(tiny_llama):
    engine = Engine(model_path=tiny_llama, max_total_tokens=256)
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate("Hi", GREEDY)
