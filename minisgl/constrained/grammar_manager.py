"""GrammarManager: the scheduler's grammar queue, where requests wait for their grammar to compile.

Mirrors python/sglang/srt/constrained/grammar_manager.py (process_req_with_grammar,
get_ready_grammar_requests, abort handling). A constrained request enters the grammar
queue instead of the waiting queue; once its compilation is done (at once, on a cache
hit) it gets its own grammar object and moves on. With tensor parallelism each rank
compiles for itself, and a request moves only when it is ready on every rank, so the
ranks keep scheduling the same batches. The backend is built on the first constrained
request: an engine that never sees one never imports xgrammar. A compilation that takes
longer than ``--grammar-compile-timeout`` ends its requests with an abort naming the flag
(SGLang: SGLANG_GRAMMAR_MAX_POLL_ITERATIONS polls in get_ready_grammar_requests,
python/sglang/srt/constrained/grammar_manager.py:107),
and the key is remembered as failed; one whose requests were all aborted is cancelled if it
has not started. SGLang also supports other backends; omitted.
"""

from __future__ import annotations

import concurrent.futures
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Optional

import torch.distributed as dist

from minisgl import tracing
from minisgl.constrained.base_grammar_backend import BaseGrammarBackend
from minisgl.distributed.parallel_state import get_world_group

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import Req

# How long an otherwise idle scheduler waits for a compilation before it looks for new requests.
GRAMMAR_POLL_INTERVAL_S = 0.05


class GrammarManager:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int], compile_timeout: float = 30.0) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.compile_timeout = compile_timeout
        self.grammar_backend: Optional[BaseGrammarBackend] = None
        # (request, its compilation, when it entered the queue)
        self.grammar_queue: list[tuple["Req", Future, float]] = []

    def has_waiting_grammars(self) -> bool:
        return bool(self.grammar_queue)

    def process_req_with_grammar(self, req: "Req") -> bool:
        """Start ``req``'s grammar; True if it now waits in the grammar queue, False if it has none."""
        key = req.sampling_params.grammar_key
        if key is None:
            return False
        try:
            future = self._get_backend().get_cached_or_future_value(key)
        except (ImportError, ValueError) as e:
            future = Future()  # no backend: the request leaves the queue at the next look, with the reason
            future.set_exception(ValueError(str(e)))
        self.grammar_queue.append((req, future, time.monotonic()))
        return True

    def _get_backend(self) -> BaseGrammarBackend:
        if self.grammar_backend is None:
            if self.tokenizer is None:
                raise ValueError("json_schema, regex and ebnf need the tokenizer (skip_tokenizer_init is set)")
            from minisgl.constrained.xgrammar_backend import XGrammarGrammarBackend

            self.grammar_backend = XGrammarGrammarBackend(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self.grammar_backend

    def get_ready_grammar_requests(self, block: bool = False) -> list["Req"]:
        """Requests whose compilation is over, in arrival order: each with its own grammar, or,
        if its spec failed to compile, finished with the reason. Requests aborted while they
        waited are dropped (the abort already answered them). ``block``: the scheduler has
        nothing else to run, so wait a little for the first compilation to end."""
        if not self.grammar_queue:
            return []
        if block:
            concurrent.futures.wait(
                [f for _, f, _ in self.grammar_queue], GRAMMAR_POLL_INTERVAL_S, concurrent.futures.FIRST_COMPLETED
            )
        now = time.monotonic()
        ready = {i for i, (req, future, _) in enumerate(self.grammar_queue) if req.finished() or future.done()}
        late = {
            i for i, (_, _, t) in enumerate(self.grammar_queue) if i not in ready and now - t > self.compile_timeout
        }
        ready, late = _ready_on_every_rank(ready, late)
        out = []
        for i in sorted(ready | late):
            req, future, _ = self.grammar_queue[i]
            if req.finished():
                continue
            if i in late:
                message = f"the grammar did not compile within --grammar-compile-timeout {self.compile_timeout} s"
                req.abort(message)
                self.grammar_backend.set_failed(req.sampling_params.grammar_key, ValueError(message))
                out.append(req)
                continue
            try:
                req.grammar = future.result().copy()
            except Exception as e:  # a spec that fails to compile ends its own request, not the scheduler
                req.abort(str(e))
            out.append(req)
        left = [entry for i, entry in enumerate(self.grammar_queue) if i not in ready | late]
        waited_for = {id(f) for _, f, _ in left}
        for i in ready | late:  # compilations nobody waits for any more: cancel those not started
            req, future, _ = self.grammar_queue[i]
            if id(future) not in waited_for and not future.done() and self.grammar_backend is not None:
                self.grammar_backend.cancel(req.sampling_params.grammar_key, future)
        self.grammar_queue = left
        if out:
            num_failed = sum(r.finished() for r in out)
            tracing.point(
                "GrammarManager.get_ready_grammar_requests", num_ready=len(out) - num_failed, num_failed=num_failed
            )
        return out


def _ready_on_every_rank(ready: set[int], late: set[int]) -> tuple[set[int], set[int]]:
    """The queue positions ready on all ranks (TP ranks and pipeline stages), and those late on any
    (SGLang's rule); their queues hold the same requests, in order, so every rank ends a late request alike."""
    world = get_world_group()
    if world is None or world.world_size == 1:
        return ready, late
    gathered: list[Optional[tuple[set[int], set[int]]]] = [None] * world.world_size
    dist.all_gather_object(gathered, (ready, late), group=world.cpu_group)
    late = set.union(*(g[1] for g in gathered))
    return set.intersection(*(g[0] for g in gathered)) - late, late
