"""The xgrammar backend: a GrammarMatcher per request, its token bitmask as the vocab mask.

Mirrors python/sglang/srt/constrained/xgrammar_backend.py (XGrammarGrammar,
XGrammarGrammarBackend, dispatch_json / dispatch_regex / dispatch_ebnf). The bitmask is
applied with xgrammar's own kernel (C++ on CPU, Triton or CUDA on GPU), where SGLang
brings its own Triton kernel for GPUs. Beyond SGLang, ``check_grammar`` parses a spec without the tokenizer
(fast, no compilation), so a bad one is refused at the front door with a ValueError
instead of ending its request later. Omitted: structural tags, jump-forward decoding,
tokenizers xgrammar cannot read (SGLang falls back to no grammar backend).
"""

from __future__ import annotations

import json
import re

import torch
import xgrammar as xgr

from minisgl import tracing
from minisgl.constrained.base_grammar_backend import BaseGrammarBackend, BaseGrammarObject, check_grammar_limits
from minisgl.kernels.cpu import is_available as cpu_kernels_available
from minisgl.sampling.sampling_params import GRAMMAR_KINDS

# xgrammar's C++ errors start with "[time] path/file.cc:line: "; the rest names the problem.
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")
_PARAM_OF_KIND = {kind: param for param, kind in GRAMMAR_KINDS.items()}


def _grammar_error(kind: str, error: Exception) -> ValueError:
    message = _CPP_PREFIX.sub("", str(error)).strip()
    return ValueError(f"invalid {_PARAM_OF_KIND[kind]}: {message}")


def check_grammar(kind: str, spec: str) -> None:
    """Raise a ValueError naming the problem if ``spec`` is not a valid grammar of ``kind``, or
    breaks one of the limits of base_grammar_backend.py."""
    try:
        schema = check_grammar_limits(kind, _PARAM_OF_KIND[kind], spec)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid json_schema: not JSON ({e})") from None
    try:
        if kind == "json":
            xgr.Grammar.from_json_schema(schema)
        elif kind == "regex":
            xgr.Grammar.from_regex(spec)
        else:
            xgr.Grammar.from_ebnf(spec)
    except (RuntimeError, TypeError, ValueError) as e:
        raise _grammar_error(kind, e) from None


class XGrammarGrammar(BaseGrammarObject):
    """One request's GrammarMatcher over a compiled grammar that all requests of its spec share."""

    _bitmask: torch.Tensor | None = None  # allocate_vocab_mask's buffer, shared by every grammar

    def __init__(self, matcher: xgr.GrammarMatcher, vocab_size: int, ctx: xgr.CompiledGrammar, key_string: str):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.ctx = ctx
        self.key_string = key_string

    def accept_token(self, token: int) -> bool:
        return self.matcher.accept_token(token)

    def rollback(self, k: int) -> None:
        self.matcher.rollback(k)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: str) -> torch.Tensor:
        """[bs, ceil(vocab / 32)] int32, all bits set (every token allowed), in a buffer reused from
        step to step and grown to the largest batch seen: a fresh tensor each step is a new
        allocation, page faults included, for a mask that lives a few milliseconds. One buffer for
        every grammar of the process is enough, since a step fills and applies its mask before the
        next step asks for one (the copy to an accelerator, move_vocab_mask, is its own tensor)."""
        words = xgr.get_bitmask_shape(1, vocab_size)[1]
        buf = XGrammarGrammar._bitmask
        if buf is None or buf.shape[0] < batch_size or buf.shape[1] != words:
            buf = XGrammarGrammar._bitmask = xgr.allocate_token_bitmask(batch_size, vocab_size)
        mask = buf[:batch_size]
        xgr.reset_token_bitmask(mask)
        return mask

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        self.matcher.fill_next_token_bitmask(vocab_mask, idx)

    @staticmethod
    def move_vocab_mask(vocab_mask: torch.Tensor, device: str) -> torch.Tensor:
        return vocab_mask.to(device, non_blocking=True)

    @staticmethod
    def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
        with tracing.span("XGrammarGrammar.apply_vocab_mask", batch_size=logits.shape[0]):
            # Bit j of word w allows token 32 * w + j; a cleared bit sets that logit to -inf. One
            # fused pass: unpacking the bits with torch ops took 5-100x longer at batch 32 (measured).
            # On CPU, minisgl's kernel (kernels/cpu/sampling.cpp), which skips the words that
            # allow all 32 tokens; measured against xgrammar's in docs/performance.md.
            if logits.is_cpu and cpu_kernels_available():
                torch.ops.minisgl_kernel.apply_token_bitmask_cpu(logits, vocab_mask)
            else:
                xgr.apply_token_bitmask_inplace(logits, vocab_mask)

    def copy(self) -> "XGrammarGrammar":
        return XGrammarGrammar(xgr.GrammarMatcher(self.ctx), self.vocab_size, self.ctx, self.key_string)


class XGrammarGrammarBackend(BaseGrammarBackend):
    """Compiles JSON schemas, regexes and EBNF against the model's tokenizer with xgrammar."""

    def __init__(self, tokenizer, vocab_size: int, model_eos_token_ids: list[int]) -> None:
        super().__init__()
        # The model's EOS ids are the grammar's stop tokens: a grammar ends by accepting one.
        tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=model_eos_token_ids
        )
        self.grammar_compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=1)
        self.vocab_size = vocab_size

    def _from_context(self, ctx: xgr.CompiledGrammar, key_string: str) -> XGrammarGrammar:
        return XGrammarGrammar(xgr.GrammarMatcher(ctx), self.vocab_size, ctx, key_string)

    def _compile(self, kind: str, spec: str, compile_fn) -> XGrammarGrammar:
        try:
            return self._from_context(compile_fn(spec), spec)
        except (RuntimeError, TypeError, ValueError) as e:
            raise _grammar_error(kind, e) from None

    def dispatch_json(self, spec: str) -> XGrammarGrammar:
        return self._compile("json", spec, self.grammar_compiler.compile_json_schema)

    def dispatch_regex(self, spec: str) -> XGrammarGrammar:
        return self._compile("regex", spec, self.grammar_compiler.compile_regex)

    def dispatch_ebnf(self, spec: str) -> XGrammarGrammar:
        return self._compile("ebnf", spec, self.grammar_compiler.compile_grammar)
