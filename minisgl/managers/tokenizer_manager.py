"""TokenizerManager: the asyncio front of the engine: text in, text out, one scheduler thread behind.

Mirrors python/sglang/srt/managers/tokenizer_manager.py (generate_request,
_tokenize_one_request, _validate_one_request, _send_one_request,
_wait_one_response, abort_request, flush_cache, the expert-distribution calls)
and folds in python/sglang/srt/managers/detokenizer_manager.py (DecodeStatus,
trim_matched_stop). SGLang runs the tokenizer manager, the scheduler and the
detokenizer as three processes joined by ZMQ; minisgl runs the Scheduler in
one background thread, the only thread that ever touches it, fed through a
queue.Queue, and detokenizes in the event loop. Omitted: multimodal inputs,
LoRA, sessions, metrics, weight updates, pause/continue generation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import uuid
from typing import Any, AsyncIterator, Callable, Optional, Union

from minisgl.hf_transformers_utils import get_tokenizer
from minisgl.managers.io_struct import AbortReq, ReqOutput, TokenizedGenerateReqInput
from minisgl.managers.scheduler import Scheduler
from minisgl.sampling.sampling_params import SamplingParams
from minisgl.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Samples per prompt. OpenAI allows 128; every sample holds its own KV, and a small pool
# would spend itself on one request.
MAX_N = 16
# How often a non-streaming request with no new output checks that its client is still there (SGLang: 4 s).
_DISCONNECT_POLL_S = 1.0


@dataclasses.dataclass
class GenerateReqInput:
    """A /generate request as the client sent it: one prompt or a batch, text or ids.

    SGLang keeps this class in io_struct.py; it lives here beside its only reader.
    """

    text: Optional[Union[str, list[str]]] = None
    input_ids: Optional[Union[list[int], list[list[int]]]] = None
    sampling_params: Optional[dict[str, Any]] = None
    rid: Optional[str] = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[list[int]] = None
    return_hidden_states: bool = False
    return_routed_experts: bool = False


class DecodeStatus:
    """Incremental detokenization of one request, with its stop strings cut out.

    Mirrors DecodeStatus and the loop of DetokenizerManager._decode_batch_token_id_output.
    ``decode_ids[surr_offset:read_offset]`` is text already confirmed, decoded again only
    as context, because some tokenizers (SentencePiece's leading space) render a token
    differently at the start of a string. The text after ``read_offset`` is confirmed once
    it no longer ends in U+FFFD, the mark of a UTF-8 character cut between tokens. Beyond
    SGLang, ``update`` withholds a tail that could still grow into a stop string, so a
    stream never shows text that a stop string would later take back.
    """

    def __init__(self, tokenizer, stop_strs: list[str] = (), skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.stop_strs = list(stop_strs)
        self.skip_special_tokens = skip_special_tokens
        self.decode_ids: list[int] = []
        self.decoded_text = ""  # the text of decode_ids[:read_offset]
        self.surr_offset = 0
        self.read_offset = 0
        self.sent_offset = 0  # characters of the output text already returned by update()
        self.matched_stop: Optional[str] = None  # the stop string that ended the text, once found

    def update(self, new_ids: list[int], finish_reason: Optional[dict] = None) -> str:
        """Take the request's newest tokens; return the text that may be sent now."""
        self.decode_ids.extend(new_ids)
        finished = finish_reason is not None
        read_ids = self.decode_ids[self.surr_offset :]
        if finished and isinstance(finish_reason.get("matched"), int):
            # A stop token ends the output but is not part of its text (SGLang's trim_matched_stop).
            read_ids = read_ids[:-1]
        surr_text = self._decode(self.decode_ids[self.surr_offset : self.read_offset])
        new_text = self._decode(read_ids)[len(surr_text) :]
        if not finished:
            if new_text and not new_text.endswith("\ufffd"):
                self.decoded_text += new_text
                self.surr_offset, self.read_offset = self.read_offset, len(self.decode_ids)
            new_text = ""
        text = self.decoded_text + new_text

        # A stop string cannot start inside text already sent: that text never ends with
        # the beginning of one (see below), so the search starts at sent_offset.
        hits = [(pos, s) for s in self.stop_strs if (pos := text.find(s, self.sent_offset)) >= 0]
        if hits:
            stop_pos, self.matched_stop = min(hits)
            text = text[:stop_pos]
        elif not finished:
            text = text[: len(text) - _stop_prefix_len(text, self.stop_strs)]
        delta = text[self.sent_offset :]
        self.sent_offset = len(text)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)


def _stop_prefix_len(text: str, stop_strs: list[str]) -> int:
    """Length of the longest end of ``text`` that is the beginning of a stop string."""
    longest = 0
    for stop in stop_strs:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


@dataclasses.dataclass
class ReqState:
    """Where a request's outputs go: an asyncio queue, fed from the scheduler thread."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: Union[ReqOutput, BaseException]) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass  # the loop has closed: nobody waits for this request any more


@dataclasses.dataclass
class _GenerateMsg:
    req: TokenizedGenerateReqInput
    state: ReqState


@dataclasses.dataclass
class _SchedulerCall:
    """Run ``fn(scheduler)`` on the scheduler thread. SGLang sends one io_struct message per
    control call (FlushCacheReqInput, ExpertDistributionReq, ...); minisgl sends the call."""

    fn: Callable[[Scheduler], Any]
    future: concurrent.futures.Future


_SHUTDOWN = object()  # the last message the scheduler thread reads


class TokenizerManager:
    """Tokenizes and validates requests, feeds the scheduler thread, detokenizes its outputs.

    Mirrors TokenizerManager in tokenizer_manager.py; see the module docstring for what differs."""

    def __init__(self, server_args: ServerArgs) -> None:
        self.server_args = server_args
        # Built here so that a bad model fails the caller; from the thread's start on,
        # only the scheduler thread touches it.
        self.scheduler = Scheduler(server_args)
        self.worker_info = info = self.scheduler.worker_info  # fixed at start-up, safe to read anywhere
        self.context_len = info.max_req_len
        self.max_req_input_len = info.max_req_input_len
        self.max_total_num_tokens = info.max_total_num_tokens
        self.vocab_size = info.vocab_size
        # The event loop's own tokenizer: an HF fast tokenizer resets its truncation settings
        # inside encode, which fails ("Already borrowed") when two threads share one.
        self.tokenizer = get_tokenizer(server_args.tokenizer_path or self.scheduler.model_config.model_path)

        self.num_aborted_reqs = 0
        self._active_rids: set[str] = set()  # event-loop side
        self._routes: dict[str, ReqState] = {}  # scheduler-thread side
        self._recv_queue: queue.Queue = queue.Queue()
        self._send_lock = threading.Lock()
        self._closed = False
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._scheduler_loop, name="minisgl-scheduler", daemon=True)
        self._thread.start()

    # ---- the scheduler thread ------------------------------------------------------------

    def _scheduler_loop(self) -> None:
        """SGLang's Scheduler.event_loop_normal: receive, then run one step, forever."""
        try:
            while True:
                for msg in self._recv_requests():
                    if msg is _SHUTDOWN:
                        return
                    self._process_input_request(msg)
                # Also delivers the outputs of requests the scheduler refused on arrival.
                for out in self.scheduler.step():
                    self._route_output(out)
        except Exception as e:
            logger.exception("the scheduler thread failed")
            self._error = e
        finally:
            self._fail_everything_left()

    def _recv_requests(self) -> list:
        # Block only when there is nothing to run; otherwise take what has arrived and go on.
        msgs = [self._recv_queue.get()] if self.scheduler.is_idle() else []
        while True:
            try:
                msgs.append(self._recv_queue.get_nowait())
            except queue.Empty:
                return msgs

    def _process_input_request(self, msg) -> None:
        if isinstance(msg, _GenerateMsg):
            self._routes[msg.req.rid] = msg.state
            self.scheduler.handle_generate_request(msg.req)
        elif isinstance(msg, AbortReq):
            self.scheduler.abort_request(msg.rid)
        else:
            try:
                msg.future.set_result(msg.fn(self.scheduler))
            except Exception as e:
                msg.future.set_exception(e)

    def _route_output(self, out: ReqOutput) -> None:
        state = self._routes.pop(out.rid) if out.finished else self._routes.get(out.rid)
        if state is not None:
            state.put(out)

    def _fail_everything_left(self) -> None:
        with self._send_lock:
            self._closed = True
            left = []
            while not self._recv_queue.empty():
                left.append(self._recv_queue.get_nowait())
        error = RuntimeError("the scheduler has stopped" + (f" after an error: {self._error!r}" if self._error else ""))
        for msg in left:
            if isinstance(msg, _GenerateMsg):
                msg.state.put(error)
            elif isinstance(msg, _SchedulerCall):
                msg.future.set_exception(error)
        for state in self._routes.values():
            state.put(error)
        self._routes.clear()

    # ---- talking to the thread -----------------------------------------------------------

    def _send(self, msg) -> None:
        # The lock makes "not closed, then put" one step: a message can never land in the
        # queue after the thread's last look at it.
        with self._send_lock:
            if self._closed:
                raise RuntimeError("the scheduler has stopped")
            self._recv_queue.put(msg)

    async def _call_scheduler(self, fn: Callable[[Scheduler], Any]) -> Any:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._send(_SchedulerCall(fn, future))
        return await asyncio.wrap_future(future)

    # ---- generation ----------------------------------------------------------------------

    async def generate_request(self, obj: GenerateReqInput, request=None) -> AsyncIterator[Union[dict, list[dict]]]:
        """Stream: yield one chunk per scheduler output, with the new text and ids. Otherwise
        yield once: a dict, or a list of dicts when the request expands to several
        (a batch of prompts, or n > 1). ``request`` is the HTTP request, polled for a
        client that left; a streaming client that leaves closes this generator instead.
        Either way the request is aborted and its KV freed at once."""
        reqs = self._tokenize_and_validate(obj)
        multi = len(reqs) > 1
        state = ReqState(asyncio.get_running_loop(), asyncio.Queue())
        pending = {r.rid: (i, r) for i, r in enumerate(reqs)}
        statuses = [
            DecodeStatus(self.tokenizer, r.sampling_params.stop_strs, r.sampling_params.skip_special_tokens)
            for r in reqs
        ]
        texts, output_ids, metas = [""] * len(reqs), [[] for _ in reqs], [None] * len(reqs)
        self._active_rids.update(pending)
        try:
            for r in reqs:
                self._send(_GenerateMsg(r, state))
            while pending:
                out = await self._wait_one_output(state, obj, request)
                if out.rid not in pending:
                    continue  # a late output of a request its stop string already ended
                i, req = pending[out.rid]
                chunk = self._process_output(req, statuses[i], out)
                if chunk["meta_info"]["finish_reason"] is not None:
                    del pending[out.rid]
                if multi:
                    chunk["index"] = i
                if obj.stream:
                    yield chunk
                else:
                    texts[i] += chunk["text"]
                    output_ids[i] += chunk["output_ids"]
                    metas[i] = chunk["meta_info"]
        finally:
            for rid in pending:
                self.abort_request(rid)
            self._active_rids.difference_update(r.rid for r in reqs)
        if not obj.stream:
            results = [{"text": t, "output_ids": ids, "meta_info": m} for t, ids, m in zip(texts, output_ids, metas)]
            if multi:
                for i, result in enumerate(results):
                    result["index"] = i
            yield results if multi else results[0]

    async def _wait_one_output(self, state: ReqState, obj: GenerateReqInput, request) -> ReqOutput:
        if request is None or obj.stream:
            item = await state.queue.get()
        else:
            # Look for the client after every output and, while none comes (a queued request),
            # every _DISCONNECT_POLL_S; raising unwinds generate_request, which aborts.
            while True:
                try:
                    item = await asyncio.wait_for(state.queue.get(), _DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    item = None
                if await request.is_disconnected():
                    raise ValueError("the client disconnected; the request is aborted")
                if item is not None:
                    break
        if isinstance(item, BaseException):
            raise item
        return item

    def _process_output(self, req: TokenizedGenerateReqInput, status: DecodeStatus, out: ReqOutput) -> dict:
        finish_reason = out.meta_info["finish_reason"] if out.finished else None
        text = status.update(out.new_output_ids, finish_reason)
        meta = out.meta_info if out.finished else {
            "id": req.rid,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(status.decode_ids),
            "finish_reason": None,
        }
        if status.matched_stop is not None and (meta["finish_reason"] or {}).get("matched") != status.matched_stop:
            # The scheduler checks stop strings on a window of trailing tokens, which a
            # multi-byte stop string can outrun; the text has one, so the request ends here.
            meta = {**meta, "finish_reason": {"type": "stop", "matched": status.matched_stop}}
            if not out.finished:
                self.abort_request(req.rid)
        return {"text": text, "output_ids": list(out.new_output_ids), "meta_info": meta}

    def abort_request(self, rid: str) -> None:
        """End a request wherever it is; the scheduler frees its KV at its next step."""
        self.num_aborted_reqs += 1
        try:
            self._send(AbortReq(rid))
        except RuntimeError:
            pass  # a stopped scheduler holds no KV to free

    # ---- tokenize and validate (all errors are ValueError, raised before anything is sent) --

    def _tokenize_and_validate(self, obj: GenerateReqInput) -> list[TokenizedGenerateReqInput]:
        if (obj.text is None) == (obj.input_ids is None):
            raise ValueError("pass exactly one of text and input_ids")
        if obj.text is not None:
            texts = [obj.text] if isinstance(obj.text, str) else list(obj.text)
            prompts = [(t, self.tokenizer.encode(t)) for t in texts]
        else:
            single = not obj.input_ids or isinstance(obj.input_ids[0], int)
            prompts = [(None, list(ids)) for ids in ([obj.input_ids] if single else obj.input_ids)]
        if not prompts:
            raise ValueError("the batch of prompts is empty")
        if obj.return_hidden_states and not self.server_args.enable_return_hidden_states:
            raise ValueError("return_hidden_states needs the server started with --enable-return-hidden-states")
        if obj.return_routed_experts and not self.server_args.enable_return_routed_experts:
            raise ValueError("return_routed_experts needs the server started with --enable-return-routed-experts")
        params = dict(obj.sampling_params or {})
        n = params.pop("n", 1)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise ValueError(f"n must be an integer in [1, {MAX_N}], got {n!r}")

        base_rid = obj.rid or uuid.uuid4().hex
        reqs = []
        for i, (text, ids) in enumerate(prompts):
            self._validate_prompt(ids)
            for j in range(n):
                k = i * n + j
                reqs.append(
                    TokenizedGenerateReqInput(
                        rid=base_rid if len(prompts) * n == 1 else f"{base_rid}-{k}",
                        input_text=text,
                        input_ids=ids,
                        sampling_params=self._make_sampling_params(params, len(ids), j),
                        return_logprob=obj.return_logprob,
                        logprob_start_len=obj.logprob_start_len,
                        top_logprobs_num=obj.top_logprobs_num,
                        token_ids_logprob=obj.token_ids_logprob,
                        return_hidden_states=obj.return_hidden_states,
                        return_routed_experts=obj.return_routed_experts,
                        stream=obj.stream,
                    )
                )
        taken = [r.rid for r in reqs if r.rid in self._active_rids]
        if taken:
            raise ValueError(f"request id {taken[0]!r} is already in use")
        return reqs

    def _validate_prompt(self, ids: list) -> None:
        if not ids:
            raise ValueError("the prompt is empty")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"input ids must be integers in [0, {self.vocab_size})")
        if len(ids) > self.max_req_input_len:
            raise ValueError(
                f"The input ({len(ids)} tokens) is longer than the model's context length ({self.context_len} tokens)."
            )
        if len(ids) + 1 > self.max_total_num_tokens:
            raise ValueError(
                f"The input ({len(ids)} tokens) does not fit the KV cache ({self.max_total_num_tokens} tokens)."
            )

    def _make_sampling_params(self, params: dict, prompt_len: int, sample_index: int) -> SamplingParams:
        params = dict(params)
        user_max_new_tokens = params.get("max_new_tokens")
        if "max_new_tokens" in params and user_max_new_tokens is None:
            params["max_new_tokens"] = self.context_len - prompt_len  # SGLang: None means "to the context length"
        try:
            if params.get("seed") is not None:
                # The n samples of one prompt must differ, yet repeat under the same seed.
                params["seed"] += sample_index
            sampling = SamplingParams.from_dict(params)
            sampling.verify(self.vocab_size)
        except TypeError as e:
            raise ValueError(f"bad sampling_params: {e}") from None
        if any(not isinstance(s, str) or not s for s in sampling.stop_strs):
            raise ValueError("stop must be a non-empty string or a list of them")
        if user_max_new_tokens is not None and prompt_len + sampling.max_new_tokens > self.context_len:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {self.context_len} "
                f"tokens. You requested a total of {prompt_len + sampling.max_new_tokens} tokens: {prompt_len} "
                f"tokens from the input messages and {sampling.max_new_tokens} tokens for the completion."
            )
        return sampling

    # ---- control calls -------------------------------------------------------------------

    async def flush_cache(self) -> bool:
        """Empty the radix cache; False while requests are in flight (SGLang's rule)."""
        return await self._call_scheduler(Scheduler.flush_cache)

    async def start_expert_distribution_record(self) -> None:
        await self._call_scheduler(lambda s: s.expert_distribution_handle("start"))

    async def stop_expert_distribution_record(self) -> None:
        await self._call_scheduler(lambda s: s.expert_distribution_handle("stop"))

    async def dump_expert_distribution_record(self) -> dict:
        return await self._call_scheduler(lambda s: s.expert_distribution_handle("dump"))

    async def get_internal_state(self) -> dict:
        """KV-pool, radix-cache and queue accounting, read on the scheduler thread between steps."""
        return await self._call_scheduler(_internal_state)

    def is_healthy(self) -> bool:
        return not self._closed

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the scheduler thread after its current step; waiting requests get an error."""
        try:
            self._send(_SHUTDOWN)
        except RuntimeError:
            pass  # already stopped
        self._thread.join(timeout)


def _internal_state(scheduler: Scheduler) -> dict:
    # Finished requests leave their KV in the radix cache (evictable_tokens): the pool is
    # whole again, available_kv_tokens == max_total_num_tokens, only after flush_cache.
    return {
        **scheduler.get_cache_stats(),
        "num_running_reqs": len(scheduler.running_batch.reqs),
        "num_waiting_reqs": len(scheduler.waiting_queue),
        "num_retracted_reqs": scheduler.num_retracted_reqs,
        "is_idle": scheduler.is_idle(),
    }
