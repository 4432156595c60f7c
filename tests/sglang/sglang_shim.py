"""The few sglang.test / sglang.srt helpers that SGLang's vendored server tests import, for minisgl.

Mirrors python/sglang/test/test_utils.py (popen_launch_server, CustomTestCase, the DEFAULT_*
constants), sglang/test/ci/ci_register.py and sglang.srt.utils.kill_process_tree. The one real
change is the launch: ``popen_launch_server`` starts ``python -m minisgl.launch_server`` on the
real SmolLM2-135M-Instruct (SGLang tests Llama-3.2-1B on a GPU), and leaves out flags that only
size GPU memory. ``run_logprob_check`` is SGLang's, copied unchanged (Apache-2.0).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import unittest

import requests

from minisgl.hf_transformers_utils import get_tokenizer  # noqa: F401  (re-exported for the tests)
from minisgl.sampling.custom_logit_processor import CustomLogitProcessor  # noqa: F401
from tests._models import smollm2_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEFAULT_SMALL_MODEL_NAME_FOR_TEST = smollm2_dir()
DEFAULT_SMALL_CROSS_ENCODER_MODEL_NAME_FOR_TEST = "cross-encoder (minisgl serves no rerank models)"
DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH = 300
DEFAULT_URL_FOR_TEST = f"http://127.0.0.1:{_free_port()}"
TEST_RERANK_QUERY_DOCS: list = []
# KV tokens for a test server on the CPU (SGLang sizes the pool by --mem-fraction-static of GPU memory).
_MAX_TOTAL_TOKENS = "32768"
_GPU_MEMORY_FLAGS = {"--mem-fraction-static"}

CustomTestCase = unittest.TestCase


def register_cuda_ci(**kwargs) -> None:
    """SGLang's CI registration; nothing to register here."""


register_amd_ci = register_cuda_ci


def popen_launch_server(model, base_url, timeout, api_key=None, other_args=(), env=None) -> subprocess.Popen:
    host, port = base_url.rsplit(":", 1)
    args = list(other_args)
    for flag in _GPU_MEMORY_FLAGS:
        if flag in args:
            i = args.index(flag)
            del args[i : i + 2]
    cmd = [sys.executable, "-m", "minisgl.launch_server", "--model-path", model, "--port", port,
           "--host", host.removeprefix("http://"), "--max-total-tokens", _MAX_TOTAL_TOKENS, *args]  # fmt: skip
    if api_key:
        cmd += ["--api-key", api_key]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # The server imports the tests' logit-processor classes when it loads them (dill by reference).
    env["PYTHONPATH"] = os.pathsep.join([repo_root, env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(cmd, env=env, cwd=repo_root)
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the minisgl server exited with {proc.returncode}")
        try:
            if requests.get(f"{base_url}/health_generate", headers=headers, timeout=5).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(0.5)
    kill_process_tree(proc.pid)
    raise TimeoutError("the minisgl server did not come up")


def kill_process_tree(pid: int) -> None:
    """SGLang kills the server and its children; minisgl's server is one process (TP 1)."""
    try:
        os.kill(pid, 15)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


# Copied from python/sglang/test/test_utils.py at 64bca5315 (Apache-2.0), unchanged.
def run_logprob_check(self: unittest.TestCase, arg: tuple):
    (
        input_len,
        output_len,
        temperature,
        logprob_start_len,
        return_logprob,
        top_logprobs_num,
    ) = arg
    input_ids = list(range(input_len))

    response = requests.post(
        self.base_url + "/generate",
        json={
            "input_ids": input_ids,
            "sampling_params": {
                "temperature": temperature,
                "max_new_tokens": output_len,
                "ignore_eos": True,
            },
            "return_logprob": return_logprob,
            "logprob_start_len": logprob_start_len,
            "top_logprobs_num": top_logprobs_num,
        },
    )
    response_json = response.json()

    res = response_json
    self.assertEqual(res["meta_info"]["prompt_tokens"], input_len)
    self.assertEqual(res["meta_info"]["completion_tokens"], output_len)

    # Test the number of tokens are correct
    if return_logprob:
        self.assertEqual(
            len(res["meta_info"]["input_token_logprobs"]) + logprob_start_len,
            res["meta_info"]["prompt_tokens"],
        )
        self.assertEqual(len(res["meta_info"]["output_token_logprobs"]), output_len)

        if top_logprobs_num:
            self.assertEqual(
                len(res["meta_info"]["input_top_logprobs"]) + logprob_start_len,
                res["meta_info"]["prompt_tokens"],
            )
            self.assertEqual(len(res["meta_info"]["output_top_logprobs"]), output_len)

            for i in range(output_len):
                self.assertEqual(
                    len(res["meta_info"]["output_top_logprobs"][i]),
                    top_logprobs_num,
                )

                # Test the top-1 tokens are the same as output tokens if temperature == 0
                if temperature == 0:
                    rank = 0
                    while rank < len(res["meta_info"]["output_top_logprobs"][i]):
                        try:
                            self.assertListEqual(
                                res["meta_info"]["output_token_logprobs"][i],
                                res["meta_info"]["output_top_logprobs"][i][rank],
                            )
                            break
                        except AssertionError:
                            # There's a tie. Allow the second item in this case.
                            if (
                                res["meta_info"]["output_top_logprobs"][i][rank][0]
                                == res["meta_info"]["output_top_logprobs"][i][rank + 1][0]
                            ):
                                rank += 1
                            else:
                                raise
