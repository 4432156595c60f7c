"""FutureMap: the token ids of batches whose forward has not finished yet; StreamExecutor.

Mirrors python/sglang/srt/managers/overlap_utils.py (FutureMap, FutureIndices,
_resolve_future_token_ids). Under the overlap scheduler, batch N+1 is built before
batch N's tokens exist. Each request of N is given a slot in a circular buffer;
N+1's input id for that request is the slot's index, negated. The forward
stores N's sampled tokens in their slots, and resolves N+1's negative ids right
before N+1's forward, so the scheduler never waits for a token just to build a
batch. SGLang's version also carries speculative decoding's draft state and is
compiled with torch.compile; minisgl keeps token ids only (speculative decoding
runs with the normal loop). SGLang's FutureIndices holds the slots as a device
tensor too; here they are a host range: reading a device tensor back would make
the scheduler wait for the forward in flight on a GPU. StreamExecutor launches a
forward on a GPU the way SGLang's overlap loop does (a CPU uses a one-thread pool).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import torch


def _resolve_future_token_ids(input_ids: torch.Tensor, future_token_ids_map: torch.Tensor) -> None:
    """Replace every negative id -i by the token stored in slot i (in place)."""
    input_ids[:] = torch.where(input_ids < 0, future_token_ids_map[torch.clamp(-input_ids, min=0)], input_ids)


@dataclasses.dataclass
class FutureIndices:
    interval: slice  # the slots of one batch, in request order

    def placeholders(self) -> list[int]:
        """The input id that stands for each request's future token: its slot, negated."""
        return [-slot for slot in range(self.interval.start, self.interval.stop)]


class FutureMap:
    """A circular buffer of future token ids (SGLang's FutureMap, token ids only)."""

    def __init__(self, max_running_requests: int, device: str) -> None:
        # At most two batches are unresolved at once (the one running and the one queued
        # behind it), each of at most max_running_requests tokens, so a buffer of three
        # batches never hands out a slot whose token is still to be read. Slot 0 is unused:
        # -0 is not negative.
        self.future_limit = max_running_requests * 3
        self.future_ct = 0
        self.token_ids_buf = torch.zeros(self.future_limit + max_running_requests + 1, dtype=torch.int64, device=device)
        self.device = device

    def alloc_future_indices(self, bs: int) -> FutureIndices:
        start = self.future_ct + 1
        self.future_ct = (self.future_ct + bs) % self.future_limit
        return FutureIndices(interval=slice(start, start + bs))

    def resolve_future(self, input_ids: torch.Tensor) -> None:
        _resolve_future_token_ids(input_ids, self.token_ids_buf)

    def store_to_map(self, future_indices: FutureIndices, next_token_ids: torch.Tensor) -> None:
        self.token_ids_buf[future_indices.interval] = next_token_ids


class StreamExecutor:
    """The forward's executor on a GPU: SGLang's event_loop_overlap launches the forward from the
    scheduler thread on a stream of its own and goes on; this does the same, no second thread.

    Kernels run asynchronously, so the scheduler prepares N+1 and processes N-1 while the device
    runs N. The stream first waits for what the scheduler queued on the default stream (N's
    inputs). It needs a stream of its own because a copy from host memory synchronizes the
    stream it runs on: on one stream the scheduler's copies for N+1 would wait for N.
    """

    def __init__(self) -> None:
        self.stream = torch.cuda.Stream()

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future = _DeviceFuture(keep_alive=args)
        self.stream.wait_stream(torch.cuda.default_stream(self.stream.device))
        try:
            with torch.cuda.stream(self.stream):
                future.set_result(fn(*args))
        except Exception as e:
            future.set_exception(e)
        future.done_event.record(self.stream)
        return future


class _DeviceFuture(concurrent.futures.Future):
    """Done once launched; result() also waits for the device (SGLang's copy_done event), so the
    host reads finished tokens. The arguments are kept until then: the scheduler made them on the
    default stream, whose allocator would otherwise reuse their memory while the forward reads it."""

    def __init__(self, keep_alive: tuple) -> None:
        super().__init__()
        self.done_event = torch.cuda.Event()
        self.keep_alive = keep_alive

    def result(self, timeout=None):
        self.done_event.synchronize()
        self.keep_alive = ()
        return super().result(timeout)
