"""EngineBackend: SGLang's frontend language (``sgl.function``) run on the offline minisgl Engine.

sglang.lang talks to a server through RuntimeEndpoint (python/sglang/lang/backend/
runtime_endpoint.py), which turns gen and select into /generate bodies. This backend is
that same class with the HTTP call replaced by Engine.generate on the same body, so a
program gives, under greedy sampling, what it gives against ``minisgl.launch_server``;
tests/test_sgl_frontend.py compares the two. Needs ``sglang`` (``pip install --no-deps
sglang``; see scripts/setup.sh). Omitted: streaming (generate_stream), images.
"""

from __future__ import annotations

import threading
from typing import Optional

from sglang.global_config import global_config
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint
from sglang.lang.chat_template import get_chat_template, get_chat_template_by_model_path

from minisgl.entrypoints.engine import Engine


class EngineBackend(RuntimeEndpoint):
    """RuntimeEndpoint over an in-process Engine instead of a URL."""

    def __init__(self, engine: Engine, chat_template_name: Optional[str] = None) -> None:
        # RuntimeEndpoint.__init__ reads /get_model_info; the Engine knows its model itself.
        self.support_concate_and_append = False
        self.engine = engine
        self.base_url = None
        model_path = engine.tokenizer_manager.server_args.model_path
        self.model_info = {"model_path": model_path}
        self.chat_template = (
            get_chat_template(chat_template_name) if chat_template_name else get_chat_template_by_model_path(model_path)
        )
        # The Engine steps its scheduler in the calling thread; run_batch calls from several.
        self._lock = threading.Lock()

    def _generate_http_request(self, s, data: dict):
        # The body is GenerateReqInput's fields, which Engine.generate takes (``text`` as ``prompt``);
        # return_text_in_logprobs is filled by the front door, as for the server.
        body = {("prompt" if k == "text" else k): v for k, v in data.items()}
        with self._lock:
            return self.engine.generate(**body)

    def generate(self, s, sampling_params):
        # RuntimeEndpoint.generate's body, sent to the Engine.
        self._handle_dtype_to_regex(sampling_params)
        data = {
            "text": s.text_,
            "sampling_params": {
                "skip_special_tokens": global_config.skip_special_tokens_in_output,
                "spaces_between_special_tokens": global_config.spaces_between_special_tokens_in_out,
                **sampling_params.to_srt_kwargs(),
            },
        }
        for item in ["return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs"]:
            value = getattr(sampling_params, item, None)
            if value is not None:
                data[item] = value
        obj = self._generate_http_request(s, data)
        return obj["text"], obj["meta_info"]

    def generate_stream(self, s, sampling_params):
        raise NotImplementedError("EngineBackend does not stream; use RuntimeEndpoint against the server")

    def cache_prefix(self, prefix_str: str) -> None:
        self._generate_http_request(None, {"text": prefix_str, "sampling_params": {"max_new_tokens": 0}})

    def commit_lazy_operations(self, s) -> None:
        self._generate_http_request(s, {"text": s.text_, "sampling_params": {"max_new_tokens": 0}})

    def flush_cache(self) -> None:
        with self._lock:
            self.engine.flush_cache()

    def get_server_info(self) -> dict:
        with self._lock:
            return self.engine.get_server_info()

    def shutdown(self) -> None:
        pass  # the Engine belongs to the caller
