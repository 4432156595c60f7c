"""What a grammar backend offers: grammar objects, compiled once per spec, off the decode loop.

Mirrors python/sglang/srt/constrained/base_grammar_backend.py (BaseGrammarObject,
BaseGrammarBackend, get_cached_or_future_value, set_cache). SGLang caches the compiled
grammar when the scheduler collects it; minisgl caches the future itself, so requests
that arrive while the same spec is still compiling share one compilation. Beyond SGLang,
whose cache grows with every distinct spec and whose compile pool any request can fill:
the cache is an LRU of ``MAX_CACHED_GRAMMARS`` entries, and large specs compile in a lane
of their own, so two slow compilations cannot hold every small one behind them. Omitted:
jump-forward decoding, reasoning-aware grammars, structural tags, grammar statistics.
"""

from __future__ import annotations

import collections
import json
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import torch

from minisgl.json_limits import json_depth

# Compilation is C++ that releases the GIL; two threads keep it off the decode loop without
# taking every core from the forward pass: one for specs under LARGE_GRAMMAR_BYTES, one for the
# rest (a 2,000-property schema of ~100 kB compiled for 32 s on an idle machine).
LARGE_GRAMMAR_BYTES = 4096
# Compiled grammars kept; the least recently used goes first. A compiled JSON grammar holds
# its token masks (kilobytes to megabytes), so an unbounded cache grew with every distinct spec.
MAX_CACHED_GRAMMARS = 256
# What a request's spec may be, checked at the front door (check_grammar_limits) so a spec that
# would compile for minutes, or recurse past Python's limit, is a 400 naming the limit.
MAX_GRAMMAR_BYTES = 64 * 1024
MAX_JSON_SCHEMA_DEPTH = 32
MAX_JSON_SCHEMA_NODES = 1000  # objects and arrays; 500 string properties compiled in 1.0 s, 2,000 in 32 s


def check_grammar_limits(kind: str, param: str, spec: str) -> Optional[object]:
    """Raise a ValueError naming the limit ``spec`` breaks; return a JSON schema parsed (or None)."""
    size = len(spec.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        raise ValueError(f"{param} is {size} bytes; the limit is MAX_GRAMMAR_BYTES = {MAX_GRAMMAR_BYTES}")
    if kind != "json":
        return None
    depth = json_depth(spec)  # before json.loads, which recurses once per level
    if depth > MAX_JSON_SCHEMA_DEPTH:
        raise ValueError(
            f"{param} nests {depth} levels deep; the limit is MAX_JSON_SCHEMA_DEPTH = {MAX_JSON_SCHEMA_DEPTH}"
        )
    schema = json.loads(spec)
    nodes, stack = 0, [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)):
            nodes += 1
            stack.extend(node.values() if isinstance(node, dict) else node)
    if nodes > MAX_JSON_SCHEMA_NODES:
        raise ValueError(
            f"{param} has {nodes} objects and arrays; the limit is MAX_JSON_SCHEMA_NODES = {MAX_JSON_SCHEMA_NODES}"
        )
    return schema


class BaseGrammarObject:
    """One request's grammar state: which tokens may come next, advanced token by token."""

    def accept_token(self, token: int) -> bool:
        """Advance past ``token``; False (and no change) if the grammar does not allow it."""
        raise NotImplementedError

    def rollback(self, k: int) -> None:
        """Forget the last ``k`` accepted tokens (SGLang's speculative verify uses it)."""
        raise NotImplementedError

    def is_terminated(self) -> bool:
        raise NotImplementedError

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: str) -> torch.Tensor:
        """A mask for the whole batch that allows every token until a grammar fills its row."""
        raise NotImplementedError

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        """Write row ``idx``: the tokens this grammar allows next."""
        raise NotImplementedError

    @staticmethod
    def move_vocab_mask(vocab_mask: torch.Tensor, device: str) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
        """Set the logits of disallowed tokens to -inf, in place."""
        raise NotImplementedError

    def copy(self) -> "BaseGrammarObject":
        """A fresh grammar state over the same compiled grammar (one per request)."""
        raise NotImplementedError


class BaseGrammarBackend:
    """Compiles (kind, spec) keys into grammar objects on a thread pool, each key once."""

    def __init__(self, max_cached: int = MAX_CACHED_GRAMMARS) -> None:
        self.executors = {
            lane: ThreadPoolExecutor(1, thread_name_prefix=f"minisgl-grammar-{lane}") for lane in ("small", "large")
        }
        # (kind, spec) -> the compilation's future, least recently used first; its result is a
        # template that requests copy.
        self.cache: collections.OrderedDict[tuple[str, str], Future] = collections.OrderedDict()
        self.max_cached = max_cached

    def get_cached_or_future_value(self, key: tuple[str, str]) -> Future:
        """The future of ``key``'s compiled grammar; done already when the cache has it."""
        future = self.cache.get(key)
        if future is not None:
            self.cache.move_to_end(key)
            return future
        lane = "large" if len(key[1]) >= LARGE_GRAMMAR_BYTES else "small"
        future = self.cache[key] = self.executors[lane].submit(self._init_value_dispatch, key)
        while len(self.cache) > self.max_cached:
            self.cache.popitem(last=False)  # a pending one evicted still ends; its requests hold it
        return future

    def cancel(self, key: tuple[str, str], future: Future) -> None:
        """Nobody waits for ``future`` any more: drop it, unstarted, and forget it. A compilation
        already running cannot be stopped (xgrammar's C++ has no cancel); it ends and is cached."""
        if future.cancel() and self.cache.get(key) is future:
            del self.cache[key]

    def set_failed(self, key: tuple[str, str], error: Exception) -> None:
        """Remember that ``key`` failed (it timed out), so that the next request of it fails at
        once instead of compiling again: SGLang's INVALID_GRAMMAR_OBJ."""
        failed: Future = Future()
        failed.set_exception(error)
        self.cache[key] = failed

    def _init_value_dispatch(self, key: tuple[str, str]) -> BaseGrammarObject:
        kind, spec = key
        if kind == "json":
            return self.dispatch_json(spec)
        if kind == "regex":
            return self.dispatch_regex(spec)
        if kind == "ebnf":
            return self.dispatch_ebnf(spec)
        raise ValueError(f"unknown grammar kind {kind!r}")

    def dispatch_json(self, spec: str) -> BaseGrammarObject:
        raise NotImplementedError

    def dispatch_regex(self, spec: str) -> BaseGrammarObject:
        raise NotImplementedError

    def dispatch_ebnf(self, spec: str) -> BaseGrammarObject:
        raise NotImplementedError
