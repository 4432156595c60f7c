"""Scheduler drivers: who steps the scheduler, and how the front door's messages reach it.

SGLang runs the scheduler in its own process, its event_loop_normal (scheduler.py) taking
requests from a ZMQ socket (recv_requests), applying them (process_input_requests) and
running one step, forever. minisgl keeps that loop and lets the front door choose who
runs it, behind one interface:
- InlineDriver (the Engine): the caller's thread. A message is applied at once, and a
  caller waiting for an output runs one step (a reader can follow ``generate`` into
  ``Scheduler.step`` in a debugger). No queue and no lock: one thread does everything.
- ThreadedDriver (the server): a scheduler thread, the only thread that touches the
  scheduler, runs event_loop_normal; callers queue messages and wait on their event loop.
Both apply messages through the one ``process_input_requests`` every TP rank runs, which
isolates each request: one the scheduler cannot queue fails alone.

The driver also routes outputs: a rid maps to the ReqState its caller waits on, until the
scheduler reports the request finished.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Union

from minisgl.managers.io_struct import AbortReq, ReqOutput, TokenizedGenerateReqInput
from minisgl.server_args import ServerArgs

if TYPE_CHECKING:
    from minisgl.configs.model_config import ModelConfig
    from minisgl.managers.tp_worker import WorkerInfo

logger = logging.getLogger(__name__)


class SchedulerStoppedError(RuntimeError):
    """The scheduler has stopped (a drain's end, or a fatal error): the server answers 503."""


class SchedulerHandle(Protocol):
    """What a driver needs of a scheduler: the in-process Scheduler, or the SchedulerClient of
    rank 0's process under tensor parallelism."""

    server_args: ServerArgs
    worker_info: "WorkerInfo"
    model_config: "ModelConfig"

    def process_input_requests(self, recv_reqs: list) -> list:
        """Apply generate, abort and control requests in order; return the control replies."""

    def step(self) -> list[ReqOutput]: ...

    def is_idle(self) -> bool: ...

    def shutdown(self) -> None:
        """Release what the handle holds (a SchedulerClient reaps its rank processes)."""


def make_scheduler(server_args: ServerArgs) -> SchedulerHandle:
    """The Scheduler itself, or with tensor parallelism the client of its processes."""
    # Imported here: the scheduler modules pull in torch and the model code, which a process
    # that only parses arguments or serves HTTP errors has no need of.
    from minisgl.managers.scheduler import Scheduler
    from minisgl.managers.scheduler_client import SchedulerClient

    return SchedulerClient(server_args) if server_args.tp_size * server_args.pp_size > 1 else Scheduler(server_args)


class ReqState:
    """Where one generate call's outputs wait. Filled by whoever steps the scheduler: the caller
    itself (inline), or the scheduler thread, through the caller's event loop."""

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


class _Driver:
    """What both drivers share: the routes from rid to caller, and failing them all at the end."""

    scheduler: SchedulerHandle

    def __init__(self) -> None:
        self.routes: dict[str, ReqState] = {}  # rid -> its caller, until the scheduler reports it finished
        self.error: Optional[BaseException] = None
        self.closed = False

    def _claim(self, reqs: list[TokenizedGenerateReqInput], state: ReqState) -> None:
        if self.closed:
            raise SchedulerStoppedError("the scheduler has stopped")
        rids = [r.rid for r in reqs]
        # A rid is taken until the scheduler has reported it finished, aborted ones included.
        taken = [rid for rid in rids if rid in self.routes]
        if taken or len(set(rids)) < len(rids):
            raise ValueError(f"request id {(taken or rids)[0]!r} is already in use")
        self.routes.update((rid, state) for rid in rids)

    def _route(self, outputs: list[ReqOutput]) -> None:
        for out in outputs:
            state = self.routes.pop(out.rid, None) if out.finished else self.routes.get(out.rid)
            if state is not None:
                state.put(out)

    def _fail_routes(self) -> list[ReqState]:
        """Close, and return the callers still waiting."""
        self.closed = True
        states, self.routes = list(self.routes.values()), {}
        return states

    def _stopped_error(self) -> SchedulerStoppedError:
        detail = f" after an error: {self.error!r}" if self.error else ""
        return SchedulerStoppedError("the scheduler has stopped" + detail)

    def in_flight_rids(self) -> list[str]:
        return list(self.routes)


class InlineDriver(_Driver):
    """The Engine's driver: the caller steps the scheduler (see the module docstring)."""

    def __init__(self, server_args: ServerArgs) -> None:
        super().__init__()
        self.scheduler = make_scheduler(server_args)

    def new_state(self) -> ReqState:
        return ReqState(None)

    def send(self, reqs: list[TokenizedGenerateReqInput], state: ReqState) -> None:
        self._claim(reqs, state)
        self._apply(reqs)

    def abort(self, rid: str) -> None:
        if not self.closed:
            self._apply([AbortReq(rid)])  # frees its KV now

    async def call(self, req) -> Any:
        if self.closed:
            raise self._stopped_error()
        (reply,) = self._apply([req])
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def wait(self, state: ReqState, timeout: Optional[float]) -> None:
        """Run one step (SGLang's event_loop_normal, one iteration), then let the other coroutines
        stepping this scheduler take their outputs."""
        if self.error is not None:
            raise SchedulerStoppedError(f"the scheduler has stopped after an error: {self.error!r}")
        self._route(self._guarded(self.scheduler.step))
        await asyncio.sleep(0)

    def _apply(self, msgs: list) -> list:
        return self._guarded(self.scheduler.process_input_requests, msgs)

    def _guarded(self, fn: Callable, *args):
        try:
            return fn(*args)
        except Exception as e:  # only what the scheduler could not pin on one request (see Scheduler.step)
            logger.exception("the scheduler failed")
            self.error = e
            for state in self._fail_routes():
                state.put(self._stopped_error())
            raise

    def shutdown(self, timeout: float = 30.0) -> None:
        for state in self._fail_routes():
            state.put(self._stopped_error())
        self.scheduler.shutdown()


class _ControlMsg:
    """A control request (io_struct) and where its reply goes."""

    def __init__(self, req: Any) -> None:
        self.req = req
        self.future: concurrent.futures.Future = concurrent.futures.Future()


_SHUTDOWN = object()  # the last message the scheduler thread reads


class ThreadedDriver(_Driver):
    """The server's driver: a scheduler thread runs event_loop_normal (see the module docstring)."""

    def __init__(self, server_args: ServerArgs) -> None:
        super().__init__()
        self.inbox: queue.Queue = queue.Queue()
        self.lock = threading.Lock()  # makes "not closed, rid free, then put" one step; guards routes
        self.on_fatal_error: Optional[Callable[[], None]] = None
        # The scheduler thread builds the scheduler itself (the caller waits, and gets its error),
        # so that it is the only thread that ever runs a parallel torch op: a second thread with an
        # OpenMP pool puts every pool's workers to sleep between ops (minisgl/openmp_pool.py). A
        # model built by the caller and run by this thread measured 20% slower, with 80,000 context
        # switches per run.
        built: concurrent.futures.Future = concurrent.futures.Future()
        self.thread = threading.Thread(
            target=self._event_loop, args=(server_args, built), name="minisgl-scheduler", daemon=True
        )
        self.thread.start()
        built.result()  # sets self.scheduler, or raises what stopped the thread building it

    def new_state(self) -> ReqState:
        return ReqState(asyncio.get_running_loop())

    def send(self, reqs: list[TokenizedGenerateReqInput], state: ReqState) -> None:
        with self.lock:
            self._claim(reqs, state)
            for req in reqs:
                self.inbox.put(req)

    def abort(self, rid: str) -> None:
        with self.lock:
            if not self.closed:  # a stopped scheduler holds no KV to free
                self.inbox.put(AbortReq(rid))

    async def call(self, req) -> Any:
        msg = _ControlMsg(req)
        with self.lock:
            if self.closed:
                raise self._stopped_error()
            self.inbox.put(msg)
        return await asyncio.wrap_future(msg.future)

    async def wait(self, state: ReqState, timeout: Optional[float]) -> None:
        """Until an output arrives, or ``timeout`` passes."""
        try:
            await asyncio.wait_for(state.event.wait(), timeout)
            state.event.clear()
        except asyncio.TimeoutError:
            pass

    def _event_loop(self, server_args: ServerArgs, built: concurrent.futures.Future) -> None:
        """SGLang's Scheduler.event_loop_normal, run by the scheduler thread."""
        try:
            self.scheduler = make_scheduler(server_args)
            built.set_result(None)
        except BaseException as e:  # a bad model: the constructor, waiting on `built`, raises it
            built.set_exception(e)
            return
        try:
            while self._process_inbox():
                outputs = self.scheduler.step()
                with self.lock:
                    self._route(outputs)
        except Exception as e:
            logger.exception("the scheduler failed")
            self.error = e
            if self.on_fatal_error is not None:
                self.on_fatal_error()
        finally:
            self._fail_everything_left()
            # Here, not in shutdown(): this thread is the only one that submits forwards, and a
            # shutdown whose join timed out would end the overlap loop's forward thread under the
            # step still running (its submit failed, and its requests were aborted).
            self.scheduler.shutdown()

    def _process_inbox(self) -> bool:
        """SGLang's recv_requests + process_input_requests; False once the shutdown message is read."""
        msgs = [self.inbox.get()] if self.scheduler.is_idle() else []  # an idle scheduler sleeps here
        while not self.inbox.empty():
            msgs.append(self.inbox.get_nowait())
        stop = _SHUTDOWN in msgs
        msgs = msgs[: msgs.index(_SHUTDOWN)] if stop else msgs
        controls = [m for m in msgs if isinstance(m, _ControlMsg)]
        replies = self.scheduler.process_input_requests([m.req if isinstance(m, _ControlMsg) else m for m in msgs])
        for msg, reply in zip(controls, replies):
            if isinstance(reply, Exception):
                msg.future.set_exception(reply)  # the caller's mistake (e.g. the recorder is off)
            else:
                msg.future.set_result(reply)
        return not stop

    def _fail_everything_left(self) -> None:
        with self.lock:
            states = self._fail_routes()
            left = []
            while not self.inbox.empty():
                left.append(self.inbox.get_nowait())
        error = self._stopped_error()
        for msg in left:
            if isinstance(msg, _ControlMsg):
                msg.future.set_exception(error)
        for state in states:
            state.put(error)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the scheduler after its current step; requests still waiting get an error. The
        scheduler thread ends the scheduler's own threads as it exits (_event_loop), also when that
        comes after `timeout`."""
        with self.lock:
            if not self.closed:
                self.inbox.put(_SHUTDOWN)
        self.thread.join(timeout)
        if self.thread.is_alive():
            logger.warning("the scheduler thread is still in a step after %.0f s; it stops when the step ends", timeout)
