"""TokenizerManager: the one front door. Every request, from the Engine or the server, comes through here.

Mirrors python/sglang/srt/managers/tokenizer_manager.py (generate_request,
_tokenize_one_request, _validate_one_request, _send_one_request,
_wait_one_response, abort_request) and the control calls of
tokenizer_communicator_mixin.py (flush_cache, the expert-distribution calls,
get_internal_state). Here a request is validated, tokenized, expanded into its
``n`` samples, sent to the scheduler, and its outputs detokenized
(GenerateRun) and assembled into SGLang's result dicts.

SGLang runs tokenizer manager, scheduler and detokenizer as three processes joined
by ZMQ. minisgl holds one *scheduler handle*: the in-process Scheduler, or with
tensor parallelism the SchedulerClient of rank 0's process; both take the same
calls. Who steps it is the one difference between the two front ends:
- the Engine steps it inline, in the caller's thread, whenever a request waits for
  an output (a reader can follow ``generate`` into ``Scheduler.step`` in a debugger);
- the server starts a scheduler thread, the only thread that touches the handle,
  which runs SGLang's event_loop_normal (take messages, run one step) forever.
Either way messages reach the scheduler through one queue and are applied between
steps. Omitted: multimodal inputs, LoRA, sessions, metrics, weight updates.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import queue
import threading
from typing import Any, AsyncIterator, Callable, Optional, Union

from minisgl.hf_transformers_utils import get_tokenizer
from minisgl.managers.generate_run import GenerateRun
from minisgl.managers.io_struct import (
    AbortReq,
    ExpertDistributionReq,
    FlushCacheReqInput,
    GenerateReqInput,
    GetInternalStateReq,
    ProfileReq,
    ReqOutput,
    TokenizedGenerateReqInput,
)
from minisgl.managers.request_validator import RequestValidator
from minisgl.server_args import ServerArgs

logger = logging.getLogger(__name__)

# How often a non-streaming request with no new output checks that its client is still there (SGLang: 4 s).
_DISCONNECT_POLL_S = 1.0


class ReqState:
    """Where one generate call's outputs wait. Filled by whoever steps the scheduler: the
    caller itself (inline), or the scheduler thread, through the caller's event loop."""

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop]) -> None:
        self.items: collections.deque = collections.deque()
        self.loop = loop
        self.event = asyncio.Event() if loop is not None else None

    def put(self, item: Union[ReqOutput, BaseException]) -> None:
        if self.loop is None:
            self.items.append(item)
            return
        try:
            self.loop.call_soon_threadsafe(self._put_in_loop, item)
        except RuntimeError:
            pass  # the loop has closed: nobody waits for this request any more

    def _put_in_loop(self, item) -> None:
        self.items.append(item)
        self.event.set()


@dataclasses.dataclass
class _GenerateMsg:
    req: TokenizedGenerateReqInput


@dataclasses.dataclass
class _ControlMsg:
    """A control request (io_struct) and where its reply goes."""

    req: Any
    future: concurrent.futures.Future


_SHUTDOWN = object()  # the last message the scheduler thread reads


def _make_scheduler(server_args: ServerArgs):
    """The scheduler handle: the Scheduler itself, or with tensor parallelism the client of its processes."""
    # Imported here: the scheduler modules pull in torch and the model code, which a
    # process that only parses arguments or serves HTTP errors has no need of.
    from minisgl.managers.scheduler import Scheduler
    from minisgl.managers.scheduler_client import SchedulerClient

    return SchedulerClient(server_args) if server_args.tp_size > 1 else Scheduler(server_args)


class TokenizerManager:
    """The front door (see the module docstring). ``threaded`` selects the server's scheduler thread."""

    def __init__(self, server_args: ServerArgs, threaded: bool = False) -> None:
        self._routes: dict[str, ReqState] = {}  # rid -> its caller, until the scheduler reports it finished
        self._recv_queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # guards _routes and _closed
        self._closed = False
        self.error: Optional[BaseException] = None
        self.on_fatal_error: Optional[Callable[[], None]] = None
        self._thread = None
        if threaded:
            # The scheduler thread builds the scheduler itself (the caller waits, and gets its
            # error), so that it is the only thread that ever runs a parallel torch op. OpenMP
            # (libgomp) gives every thread that does its own pool of workers; with more of them
            # than cores it stops spinning between parallel regions and puts the workers to
            # sleep instead, and every op then waits for a wake-up: a model built by the caller
            # and run by this thread measured 20% slower, with 80,000 context switches per run.
            built: concurrent.futures.Future = concurrent.futures.Future()
            self._thread = threading.Thread(
                target=self._scheduler_loop, args=(server_args, built), name="minisgl-scheduler", daemon=True
            )
            self._thread.start()
            built.result()  # sets self.scheduler, or raises what stopped the thread building it
        else:
            self.scheduler = _make_scheduler(server_args)
        self.server_args = server_args = self.scheduler.server_args
        self.worker_info = self.scheduler.worker_info  # fixed at start-up, safe to read anywhere
        self.model_config = self.scheduler.model_config
        self.context_len = self.worker_info.max_req_len
        self.tokenizer = get_tokenizer(server_args.tokenizer_path or self.model_config.model_path)
        self.validator = RequestValidator(server_args, self.worker_info, self.model_config.is_moe)
        self.num_aborted_reqs = 0
        # metrics_collector.MetricsCollectors, set by the server under --enable-metrics; None costs nothing.
        self.metrics = None

        self._encode = self.tokenizer.encode
        if threaded:
            # Tokenizing a long prompt takes seconds; it must not stall the event loop. An HF fast
            # tokenizer cannot encode in one thread while it decodes in another ("Already
            # borrowed"), so the tokenizing thread gets a tokenizer of its own.
            self._encode = get_tokenizer(server_args.tokenizer_path or self.model_config.model_path).encode
            self._tokenize_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="minisgl-tokenize")

    # ---- driving the scheduler: the same two calls, from the thread or inline ------------------

    def _process_inbox(self, block: bool) -> bool:
        """Apply every message that has arrived (SGLang's recv_requests + process_input_requests);
        False once the shutdown message is read."""
        msgs = [self._recv_queue.get()] if block and self.scheduler.is_idle() else []
        while True:
            try:
                msgs.append(self._recv_queue.get_nowait())
            except queue.Empty:
                break
        for msg in msgs:
            if msg is _SHUTDOWN:
                return False
            if isinstance(msg, _GenerateMsg):
                try:
                    self.scheduler.handle_generate_request(msg.req)
                except Exception as e:  # this request's fault (validation should have caught it): it alone fails
                    logger.exception("request %s could not be queued", msg.req.rid)
                    with self._lock:
                        state = self._routes.pop(msg.req.rid, None)
                    if state is not None:
                        state.put(RuntimeError(f"the request could not be queued: {e!r}"))
            elif isinstance(msg, AbortReq):
                self.scheduler.abort_request(msg.rid)
            else:
                try:
                    msg.future.set_result(self.scheduler.handle_control_request(msg.req))
                except Exception as e:  # the caller's mistake (e.g. the recorder is off)
                    msg.future.set_exception(e)
        return True

    def _step(self) -> None:
        for out in self.scheduler.step():
            with self._lock:
                state = self._routes.pop(out.rid, None) if out.finished else self._routes.get(out.rid)
            if state is not None:
                state.put(out)

    def _scheduler_loop(self, server_args: ServerArgs, built: concurrent.futures.Future) -> None:
        """The server's scheduler thread: SGLang's Scheduler.event_loop_normal."""
        try:
            self.scheduler = _make_scheduler(server_args)
            built.set_result(None)
        except BaseException as e:  # a bad model: the constructor, waiting on `built`, raises it
            built.set_exception(e)
            return
        try:
            while self._process_inbox(block=True):
                self._step()
        except Exception as e:
            self._fail(e)
            if self.on_fatal_error is not None:
                self.on_fatal_error()
        finally:
            self._fail_everything_left()

    def _step_inline(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the scheduler has stopped after an error: {self.error!r}")
        try:
            self._process_inbox(block=False)
            self._step()
        except Exception as e:
            self._fail(e)
            self._fail_everything_left()
            raise

    def _fail(self, error: BaseException) -> None:
        # Only what the scheduler could not pin on one request reaches here (see Scheduler.step).
        logger.exception("the scheduler failed")
        self.error = error

    def _fail_everything_left(self) -> None:
        with self._lock:
            self._closed = True
            left = []
            while not self._recv_queue.empty():
                left.append(self._recv_queue.get_nowait())
            routes, self._routes = self._routes, {}
        detail = f" after an error: {self.error!r}" if self.error else ""
        error = RuntimeError("the scheduler has stopped" + detail)
        for msg in left:
            if isinstance(msg, _ControlMsg):
                msg.future.set_exception(error)
        for state in routes.values():
            state.put(error)

    def _send(self, msg, state: Optional[ReqState] = None) -> None:
        # One lock makes "not closed, rid free, then put" one step: a message can never land in
        # the queue after the thread's last look at it, and two callers cannot share a rid.
        with self._lock:
            if self._closed:
                raise RuntimeError("the scheduler has stopped")
            if state is not None:
                self._routes[msg.req.rid] = state
            self._recv_queue.put(msg)

    # ---- generation ----------------------------------------------------------------------------

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
        state = ReqState(asyncio.get_running_loop() if self._thread is not None else None)
        self._claim_rids(reqs)  # before the try: a refused rid must not abort its owner's request
        run = GenerateRun(self, obj, reqs, stream_deltas)
        try:
            for req in reqs:
                self._send(_GenerateMsg(req), state)
            while run.pending:
                chunk = run.on_output(await self._wait_one_output(state, obj, request))
                if chunk is not None:
                    yield chunk
        finally:
            for rid in run.pending:
                self.abort_request(rid)
                if self.metrics is not None:
                    self.metrics.tokenizer.observe_one_aborted_request()
            if state.loop is None and not self._closed:
                self._process_inbox(block=False)  # inline: free an aborted request's KV now
        if not obj.stream:
            yield run.result()

    async def _tokenize(self, obj: GenerateReqInput) -> list[TokenizedGenerateReqInput]:
        if self._thread is None:
            return self.tokenize_and_validate(obj)
        if self._closed:
            raise RuntimeError("the scheduler has stopped")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, self.tokenize_and_validate, obj)

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
                    encoded[prompt_index] = self._encode(text)
                ids = encoded[prompt_index]
            else:
                ids = list(prompt)
            reqs.append(self.validator.make_tokenized_request(spec, text, ids, obj.stream))
        return reqs

    def _claim_rids(self, reqs: list[TokenizedGenerateReqInput]) -> None:
        rids = [r.rid for r in reqs]
        with self._lock:
            # A rid is taken until the scheduler has reported it finished, aborted ones included.
            taken = [rid for rid in rids if rid in self._routes]
        if taken or len(set(rids)) < len(rids):
            raise ValueError(f"request id {(taken or rids)[0]!r} is already in use")

    async def _wait_one_output(self, state: ReqState, obj: GenerateReqInput, request) -> ReqOutput:
        while not state.items:
            if state.loop is None:
                self._step_inline()
                # Let the other coroutines stepping this scheduler take their outputs.
                await asyncio.sleep(0)
            elif request is None or obj.stream:
                await state.event.wait()
                state.event.clear()
            else:
                # Look for the client after every output and, while none comes (a queued request),
                # every _DISCONNECT_POLL_S; raising unwinds generate_request, which aborts.
                try:
                    await asyncio.wait_for(state.event.wait(), _DISCONNECT_POLL_S)
                    state.event.clear()
                except asyncio.TimeoutError:
                    pass
                if await request.is_disconnected():
                    raise ValueError("the client disconnected; the request is aborted")
        item = state.items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def in_flight_rids(self) -> list[str]:
        with self._lock:
            return list(self._routes)

    def abort_request(self, rid: str) -> None:
        """End a request wherever it is; the scheduler frees its KV at its next step."""
        self.num_aborted_reqs += 1
        try:
            self._send(AbortReq(rid))
        except RuntimeError:
            pass  # a stopped scheduler holds no KV to free

    # ---- control calls: one io_struct message each, answered between steps ---------------------

    async def _call(self, req) -> Any:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._send(_ControlMsg(req, future))
        if self._thread is None:
            self._process_inbox(block=False)  # inline: answered now
            return future.result()
        return await asyncio.wrap_future(future)

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
        return not self._closed

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the scheduler after its current step; requests still waiting get an error."""
        from minisgl.managers.scheduler_client import SchedulerClient

        if self._thread is not None:
            try:
                self._send(_SHUTDOWN)
            except (RuntimeError, AttributeError):
                pass  # already stopped
            self._thread.join(timeout)
            self._tokenize_pool.shutdown(wait=False)
        else:
            self._fail_everything_left()
        if isinstance(self.scheduler, SchedulerClient):
            self.scheduler.shutdown()
