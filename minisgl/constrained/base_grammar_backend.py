"""What a grammar backend offers: grammar objects, compiled once per spec, off the decode loop.

Mirrors python/sglang/srt/constrained/base_grammar_backend.py (BaseGrammarObject,
BaseGrammarBackend, get_cached_or_future_value, set_cache). SGLang caches the compiled
grammar when the scheduler collects it; minisgl caches the future itself, so requests
that arrive while the same spec is still compiling share one compilation. Omitted:
jump-forward decoding, reasoning-aware grammars, structural tags, grammar statistics,
the compilation timeout.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

# Compilation is C++ that releases the GIL; two threads keep it off the decode loop
# without taking every core from the forward pass.
COMPILE_THREADS = 2


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

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="minisgl-grammar")
        # (kind, spec) -> the compilation's future; its result is a template that requests copy.
        self.cache: dict[tuple[str, str], Future] = {}

    def get_cached_or_future_value(self, key: tuple[str, str]) -> Future:
        """The future of ``key``'s compiled grammar; done already when the cache has it."""
        future = self.cache.get(key)
        if future is None:
            future = self.cache[key] = self.executor.submit(self._init_value_dispatch, key)
        return future

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
