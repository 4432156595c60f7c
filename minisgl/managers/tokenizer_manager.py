"""TokenizerManager: the one front door. Every request, from the Engine or the server, comes through here.

Mirrors python/sglang/srt/managers/tokenizer_manager.py (generate_request,
_tokenize_one_request, _validate_one_request, _send_one_request,
_wait_one_response, abort_request) and the control calls of
tokenizer_communicator_mixin.py (flush_cache, the expert-distribution calls,
get_internal_state). Here a request is validated, tokenized, expanded into its
``n`` samples, sent to the scheduler, and its outputs detokenized
(GenerateRun) and assembled into SGLang's result dicts.

SGLang runs tokenizer manager, scheduler and detokenizer as three processes joined
by ZMQ. Here the TokenizerManager keeps one job (tokenize, send, wait, detokenize);
who steps the scheduler, and how messages reach it, is its driver's
(scheduler_driver.py): inline in the caller's thread for the Engine, a scheduler
thread for the server. Omitted: multimodal inputs, LoRA, sessions, weight updates.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from typing import Any, AsyncIterator, Callable, Optional, Union

from minisgl import tracing
from minisgl.hf_transformers_utils import get_tokenizer
from minisgl.malloc_trim import TRIM_AFTER_CHARS, malloc_trim
from minisgl.managers.generate_run import GenerateRun
from minisgl.managers.io_struct import (
    ExpertDistributionReq,
    FlushCacheReqInput,
    GenerateReqInput,
    GetInternalStateReq,
    ProfileReq,
    ReqOutput,
    TokenizedGenerateReqInput,
    check_text,
)
from minisgl.managers.request_validator import RequestValidator
from minisgl.managers.scheduler_driver import InlineDriver, ReqState, SchedulerStoppedError, ThreadedDriver
from minisgl.server_args import ServerArgs

logger = logging.getLogger(__name__)

# How often a non-streaming request with no new output checks that its client is still there (SGLang: 4 s).
_DISCONNECT_POLL_S = 1.0


class TokenizerManager:
    """The front door (see the module docstring). ``threaded`` selects the server's scheduler thread."""

    def __init__(self, server_args: ServerArgs, threaded: bool = False) -> None:
        self.driver = ThreadedDriver(server_args) if threaded else InlineDriver(server_args)
        self.scheduler = self.driver.scheduler
        self.server_args = server_args = self.scheduler.server_args
        self.worker_info = self.scheduler.worker_info  # fixed at start-up, safe to read anywhere
        self.model_config = self.scheduler.model_config
        self.context_len = self.worker_info.max_req_len
        # Inline, the scheduler runs on this thread and its tokenizer can serve both (one copy fewer:
        # 13 MB and 0.1 s for SmolLM2's); the server's scheduler thread keeps its own, since an HF
        # fast tokenizer used from two threads at once fails ("Already borrowed"), and so does a
        # scheduler in other processes (TP, PP: the driver holds a client, with no tokenizer).
        shared = None if threaded else getattr(self.scheduler, "tokenizer", None)
        if shared is None:
            shared = get_tokenizer(server_args.tokenizer_path or self.model_config.model_path)
        self.tokenizer = shared
        self.validator = RequestValidator(server_args, self.worker_info, self.model_config.is_moe)
        self.num_aborted_reqs = 0
        # metrics_collector.MetricsCollectors, set by the server under --enable-metrics; None costs nothing.
        self.metrics = None

        self._tokenizing_tokenizer = self.tokenizer
        self._tokenize_pool = None
        if threaded:
            # Tokenizing a long prompt takes seconds; it must not stall the event loop. An HF fast
            # tokenizer cannot encode in one thread while it decodes in another ("Already
            # borrowed"), so the tokenizing thread gets a tokenizer of its own.
            self._tokenizing_tokenizer = get_tokenizer(server_args.tokenizer_path or self.model_config.model_path)
            self._tokenize_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="minisgl-tokenize")
        self._encode = self._tokenizing_tokenizer.encode
        self._max_token_chars = max(map(len, self.tokenizer.get_vocab()), default=1)

    @property
    def error(self) -> Optional[BaseException]:
        """What stopped the scheduler, if anything did."""
        return self.driver.error

    # ---- generation ----------------------------------------------------------------------------

    @tracing.traced
    async def generate_request(
        self, obj: GenerateReqInput, request=None, stream_deltas: Optional[bool] = None
    ) -> AsyncIterator[Union[dict, list[dict]]]:
        """Stream: yield one chunk per scheduler output, with the text and ids so far (the ids
        alone as deltas under --stream-output, SGLang's rule), or only the new part of each
        with ``stream_deltas`` (the OpenAI layer's). Otherwise yield once: a dict, or a list of dicts for a
        batch (several prompts, or n > 1). ``request`` is the HTTP request, polled for a client
        that left; a streaming client that leaves closes this generator instead. Either way
        what has not finished is aborted and its KV freed."""
        reqs = await self._tokenize(obj)
        state = self.driver.new_state()
        self.driver.send(reqs, state)  # a rid in use is refused here, before the try aborts it
        # SGLang 0.5.9: text and logprobs so far; the ids alone become deltas under --stream-output.
        deltas = bool(stream_deltas)
        id_deltas = deltas or (stream_deltas is None and self.server_args.stream_output)
        run = GenerateRun(self.tokenizer, obj, reqs, deltas, id_deltas, self.metrics, self.abort_request)
        try:
            while run.pending:
                chunk = run.on_output(await self._wait_one_output(state, obj, request))
                if chunk is not None:
                    yield chunk
        finally:
            for rid in run.pending:
                self.abort_request(rid)
                if self.metrics is not None:
                    self.metrics.tokenizer.observe_one_aborted_request()
        if not obj.stream:
            yield run.result()

    async def _tokenize(self, obj: GenerateReqInput) -> list[TokenizedGenerateReqInput]:
        if self.driver.closed:
            raise SchedulerStoppedError("the scheduler has stopped")
        texts = obj.text if isinstance(obj.text, list) else [obj.text]  # not validated yet: any JSON
        size = sum(len(t) for t in texts if isinstance(t, str))
        return await self._off_loop(self.tokenize_and_validate, obj, size=size)

    async def _off_loop(self, fn: Callable, arg: Any, size: int) -> Any:
        """Run ``fn`` in the tokenizing thread (inline for the Engine); after a large request,
        hand the memory it freed back to the OS."""
        try:
            if self._tokenize_pool is None:
                return fn(arg)
            return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, fn, arg)
        finally:
            if size > TRIM_AFTER_CHARS:  # cheap next to tokenizing that much
                malloc_trim()

    async def encode_texts(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        """/tokenize: the same checks and the same thread as a prompt of /generate."""
        for text in texts:
            check_text("prompt", text)
            self.validator.check_text_length("prompt", text, self._max_token_chars)
        encode = self._tokenizing_tokenizer.encode
        run = lambda ts: [encode(t, add_special_tokens=add_special_tokens) for t in ts]  # noqa: E731
        return await self._off_loop(run, texts, size=sum(map(len, texts)))

    async def decode_ids(self, seqs: list[list[int]], skip_special_tokens: bool) -> list[str]:
        """/detokenize, off the event loop."""
        decode = self._tokenizing_tokenizer.decode
        run = lambda ss: [decode(s, skip_special_tokens=skip_special_tokens) for s in ss]  # noqa: E731
        return await self._off_loop(run, seqs, size=sum(map(len, seqs)))

    @tracing.traced
    def tokenize_and_validate(self, obj: GenerateReqInput) -> list[TokenizedGenerateReqInput]:
        """Normalize, tokenize and check every request of ``obj``; any error is a ValueError,
        raised before anything reaches the scheduler."""
        obj.normalize_batch_and_arguments()
        encoded: dict[int, list[int]] = {}  # the n samples of a prompt share its tokenization
        reqs = []
        for i in range(len(obj)):
            spec = obj[i]
            prompt = spec["prompt"]
            text = prompt if isinstance(prompt, str) else None
            if text is not None:
                prompt_index = i // obj.parallel_sample_num
                if prompt_index not in encoded:
                    self.validator.check_text_length("text", text, self._max_token_chars)
                    encoded[prompt_index] = self._encode(text)
                ids = encoded[prompt_index]
            else:
                ids = list(prompt)
            reqs.append(self.validator.make_tokenized_request(spec, text, ids, obj.stream))
        return reqs

    async def _wait_one_output(self, state: ReqState, obj: GenerateReqInput, request) -> ReqOutput:
        # A non-streaming HTTP request looks for its client after every output and, while none
        # comes (a queued request), every _DISCONNECT_POLL_S; raising unwinds generate_request,
        # which aborts. (A streaming client that leaves closes the generator instead.)
        poll = request is not None and not obj.stream
        while not state.items:
            await self.driver.wait(state, _DISCONNECT_POLL_S if poll else None)
            if poll and await request.is_disconnected():
                raise ValueError("the client disconnected; the request is aborted")
        item = state.items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def in_flight_rids(self) -> list[str]:
        return self.driver.in_flight_rids()

    def abort_request(self, rid: str) -> None:
        """End a request wherever it is; the scheduler frees its KV when it applies the abort. Only a
        rid in flight counts as aborted (num_aborted_requests, /metrics)."""
        if rid not in self.driver.in_flight_rids():
            return
        self.num_aborted_reqs += 1
        self.driver.abort(rid)

    # ---- control calls: one io_struct message each, answered between steps ---------------------

    async def _call(self, req) -> Any:
        return await self.driver.call(req)

    async def flush_cache(self) -> bool:
        """Empty the radix cache; False while requests are in flight (SGLang's rule)."""
        return await self._call(FlushCacheReqInput())

    async def start_expert_distribution_record(self) -> None:
        await self._call(ExpertDistributionReq("start"))

    async def stop_expert_distribution_record(self) -> None:
        await self._call(ExpertDistributionReq("stop"))

    async def dump_expert_distribution_record(self, output_path: Optional[str] = None) -> dict:
        return await self._call(ExpertDistributionReq("dump", output_path))

    async def start_profile(self, output_dir: Optional[str] = None, activities: Optional[list[str]] = None) -> None:
        await self._call(ProfileReq("start", output_dir, activities))

    async def stop_profile(self) -> Optional[str]:
        """Stop the torch profiler; the path of rank 0's Chrome trace."""
        return await self._call(ProfileReq("stop"))

    async def get_internal_state(self) -> dict:
        """KV-pool, radix-cache and queue accounting, read by the scheduler between steps."""
        return await self._call(GetInternalStateReq())

    async def get_server_info(self) -> dict:
        from minisgl import __version__

        return {
            **dataclasses.asdict(self.server_args),
            **dataclasses.asdict(self.worker_info),
            **await self.get_internal_state(),
            "num_aborted_requests": self.num_aborted_reqs,
            "version": __version__,
        }

    def is_healthy(self) -> bool:
        return not self.driver.closed

    def health_problem(self) -> Optional[str]:
        """Why /health should fail, or None: the scheduler stopped, or (tensor parallel) a rank
        process died. An idle group notices a dead rank only at its next request; this does not wait."""
        if self.driver.closed:
            return f"the scheduler failed: {self.error!r}" if self.error else "the scheduler has stopped"
        dead = getattr(self.driver.scheduler, "dead_ranks", lambda: [])()
        return f"scheduler process {dead[0]} has exited" if dead else None

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the scheduler after its current step; requests still waiting get an error."""
        self.driver.shutdown(timeout)
        if self._tokenize_pool is not None:
            self._tokenize_pool.shutdown(wait=False)
