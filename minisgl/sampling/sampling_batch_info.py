"""The batch's sampling parameters as tensors, plus the logit edits made before sampling.

Mirrors python/sglang/srt/sampling/sampling_batch_info.py (SamplingBatchInfo,
from_schedule_batch, apply_logits_bias) and, folded in, the penalizers of
python/sglang/srt/sampling/penaltylib/, with SGLang's grammar vocab mask
(update_regex_vocab_mask). SGLang keeps running penalty state on device; minisgl
recounts penalties from the requests' token lists each step, which is simpler and exact.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from minisgl import tracing

if TYPE_CHECKING:
    from minisgl.constrained.base_grammar_backend import BaseGrammarObject
    from minisgl.managers.schedule_batch import Req


@dataclasses.dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # [bs, 1]
    top_ps: torch.Tensor  # [bs]
    top_ks: torch.Tensor  # [bs]
    min_ps: torch.Tensor  # [bs]
    is_all_greedy: bool
    need_top_p_sampling: bool
    need_top_k_sampling: bool
    need_min_p_sampling: bool
    generators: list[Optional[torch.Generator]]  # None for greedy rows
    vocab_size: int
    logit_bias: Optional[torch.Tensor] = None  # [bs, vocab]
    # Penalties, present only when some request in the batch asked for one.
    frequency_penalties: Optional[torch.Tensor] = None  # [bs, 1]
    presence_penalties: Optional[torch.Tensor] = None  # [bs, 1]
    repetition_penalties: Optional[torch.Tensor] = None  # [bs, 1]
    output_token_counts: Optional[torch.Tensor] = None  # [bs, vocab]
    seen_tokens: Optional[torch.Tensor] = None  # [bs, vocab] bool: prompt or output
    # Constrained decoding, present only when some request in the batch has a grammar:
    # one entry per request (None for a free one), and the mask built from them each step.
    grammars: Optional[list[Optional["BaseGrammarObject"]]] = None
    vocab_mask: Optional[torch.Tensor] = None  # [bs, ceil(vocab / 32)] int32 bitmask
    apply_mask_func: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None
    device: str = "cpu"
    # min_new_tokens (SGLang's MinNewTokensPenalizer): -inf on the stop tokens of rows still short.
    min_new_tokens_mask: Optional[torch.Tensor] = None  # [bs, vocab]
    min_new_tokens_left: Optional[torch.Tensor] = None  # [bs] tokens each row still owes (0 once free)
    # Custom logit processors: (processor, its rows, their custom_params) per distinct processor.
    custom_logit_processors: Optional[list[tuple[Any, torch.Tensor, list]]] = None

    @classmethod
    def from_reqs(cls, reqs: list["Req"], vocab_size: int, device: str) -> "SamplingBatchInfo":
        params = [r.sampling_params for r in reqs]

        def col(name, dtype=torch.float32):
            return torch.tensor([getattr(p, name) for p in params], dtype=dtype, device=device)

        top_ks = col("top_k", torch.int64).clamp(max=vocab_size)
        info = cls(
            temperatures=col("temperature").unsqueeze(1),
            top_ps=col("top_p"),
            top_ks=top_ks,
            min_ps=col("min_p"),
            is_all_greedy=all(p.is_greedy for p in params),
            need_top_p_sampling=any(p.top_p != 1.0 for p in params),
            need_top_k_sampling=any(p.top_k < vocab_size for p in params),
            need_min_p_sampling=any(p.min_p > 0 for p in params),
            # A chunk's row samples no token (it is dropped): it draws nothing from its request's
            # generator, so a seeded request's tokens do not depend on how its prompt was chunked.
            generators=[None if p.is_greedy or r.is_chunked else r.generator for p, r in zip(params, reqs)],
            vocab_size=vocab_size,
            device=device,
        )
        if any(r.grammar is not None for r in reqs):
            info.grammars = [r.grammar for r in reqs]
        if any(p.logit_bias for p in params):
            info.logit_bias = torch.zeros(len(reqs), vocab_size, device=device)
            for i, p in enumerate(params):
                for token_id, bias in p.logit_bias.items():
                    info.logit_bias[i, token_id] = bias
        if any(p.frequency_penalty or p.presence_penalty or p.repetition_penalty != 1.0 for p in params):
            info._init_penalties(reqs, device)
        short = [i for i, r in enumerate(reqs) if len(r.output_ids) < r.sampling_params.min_new_tokens]
        if short:
            info.min_new_tokens_mask = torch.zeros(len(reqs), vocab_size, device=device)
            info.min_new_tokens_left = torch.tensor(
                [max(r.sampling_params.min_new_tokens - len(r.output_ids), 0) for r in reqs], device=device
            )
            for i in short:
                stops = set(reqs[i].sampling_params.stop_token_ids) | set(reqs[i].eos_token_ids)
                info.min_new_tokens_mask[i, sorted(stops)] = -float("inf")
        if any(r.custom_logit_processor for r in reqs):
            info._init_custom_logit_processors(reqs, device)
        return info

    def for_positions(self, n: int, offsets: Optional[torch.Tensor] = None) -> "SamplingBatchInfo":
        """What a verify of n positions a request applies to its logits: repeat_rows, except that a
        greedy batch that edits no logits is returned as it is, since its argmax reads no field
        (copying them once per position cost 0.17-0.18 ms a round at one request). Only
        apply_logits_bias and is_all_greedy may then be read from it, not per-row fields."""
        if self.is_all_greedy and not self.edits_logits:
            return self
        return self.repeat_rows(n, offsets)

    def repeat_rows(self, n: int, offsets: Optional[torch.Tensor] = None) -> "SamplingBatchInfo":
        """Each request's row repeated n times, for n consecutive positions of that request (a
        verify round scores k + 1 of them). Like SGLang's filter_batch/merge_batch, it lives beside
        the fields so that a new field cannot be missed; the one per-position fact is
        min_new_tokens, whose mask frees position j of a row once j tokens cover what it owes.
        offsets: each new row's distance from its request's first position (0 .. n-1 by default;
        an EAGLE tree's node depths, where siblings share one)."""
        rows = torch.arange(len(self.generators) * n, device=self.device)
        pos = rows % n if offsets is None else offsets.to(self.device)

        def rep(value):
            if isinstance(value, torch.Tensor):
                return value.repeat_interleave(n, dim=0)
            if isinstance(value, list):
                return [v for v in value for _ in range(n)]
            return value

        repeated = {f.name: rep(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "vocab_size"}
        if self.min_new_tokens_mask is not None:
            still_short = (pos < repeated["min_new_tokens_left"]).unsqueeze(1)
            repeated["min_new_tokens_mask"] = torch.where(still_short, repeated["min_new_tokens_mask"], 0.0)
            repeated["min_new_tokens_left"] = (repeated["min_new_tokens_left"] - pos).clamp(min=0)
        if self.custom_logit_processors is not None:
            repeated["custom_logit_processors"] = [
                (processor, (idx[:, None] * n + torch.arange(n, device=self.device)).flatten(), rep(params))
                for processor, idx, params in self.custom_logit_processors
            ]
        return dataclasses.replace(self, **repeated)

    def _init_custom_logit_processors(self, reqs: list["Req"], device: str) -> None:
        from minisgl.sampling.custom_logit_processor import CustomLogitProcessor

        rows: dict[str, list[int]] = {}
        for i, r in enumerate(reqs):
            if r.custom_logit_processor:
                rows.setdefault(r.custom_logit_processor, []).append(i)
        self.custom_logit_processors = [
            (
                CustomLogitProcessor.from_str(s),
                torch.tensor(idx, dtype=torch.int64, device=device),
                [reqs[i].sampling_params.custom_params for i in idx],
            )
            for s, idx in rows.items()
        ]

    def _init_penalties(self, reqs: list["Req"], device: str) -> None:
        params = [r.sampling_params for r in reqs]
        bs = len(reqs)
        self.frequency_penalties = torch.tensor([[p.frequency_penalty] for p in params], device=device)
        self.presence_penalties = torch.tensor([[p.presence_penalty] for p in params], device=device)
        self.repetition_penalties = torch.tensor([[p.repetition_penalty] for p in params], device=device)
        self.output_token_counts = torch.zeros(bs, self.vocab_size, device=device)
        self.seen_tokens = torch.zeros(bs, self.vocab_size, dtype=torch.bool, device=device)
        for i, r in enumerate(reqs):
            out = torch.tensor(r.output_ids, dtype=torch.int64, device=device)
            self.output_token_counts[i].index_add_(0, out, torch.ones(len(out), device=device))
            self.seen_tokens[i, torch.tensor(r.origin_input_ids, dtype=torch.int64, device=device)] = True
            self.seen_tokens[i, out] = True

    def update_regex_vocab_mask(self) -> None:
        """Build this step's vocab mask from the grammars: each constrained row allows only
        what its grammar allows next; free rows (and a terminated grammar's) allow everything."""
        if not self.grammars:
            return
        first_grammar = next(g for g in self.grammars if g is not None)
        bs, num_grammars = len(self.grammars), sum(g is not None for g in self.grammars)
        with tracing.span("SamplingBatchInfo.update_regex_vocab_mask", batch_size=bs, num_grammars=num_grammars):
            self.vocab_mask = first_grammar.allocate_vocab_mask(self.vocab_size, bs, self.device)
            self.apply_mask_func = first_grammar.apply_vocab_mask  # a static method: one call for all rows
            for i, grammar in enumerate(self.grammars):
                if grammar is not None and not grammar.is_terminated():
                    grammar.fill_vocab_mask(self.vocab_mask, i)
            self.vocab_mask = first_grammar.move_vocab_mask(self.vocab_mask, self.device)

    @property
    def edits_logits(self) -> bool:
        """Whether apply_logits_bias changes anything (it leaves a batch without penalties, grammar,
        logit_bias, min_new_tokens or custom processors as it is)."""
        edits = (self.output_token_counts, self.vocab_mask, self.logit_bias, self.min_new_tokens_mask)
        return any(x is not None for x in edits) or bool(self.custom_logit_processors)

    def apply_logits_bias(self, logits: torch.Tensor) -> None:
        """Edit logits in place: penalties, the vocab mask, then additive logit_bias (SGLang's order).
        The mask's -inf survives the bias: no bias can revive a token the grammar forbids."""
        if self.output_token_counts is not None:
            # OpenAI-style: subtract frequency * count and presence * [count > 0].
            logits -= self.frequency_penalties * self.output_token_counts
            logits -= self.presence_penalties * (self.output_token_counts > 0)
            # CTRL/HF-style repetition penalty over prompt and output tokens.
            rp = torch.where(logits > 0, 1.0 / self.repetition_penalties, self.repetition_penalties)
            logits.copy_(torch.where(self.seen_tokens, logits * rp, logits))
        if self.vocab_mask is not None:
            self.apply_mask_func(logits, self.vocab_mask)
        if self.logit_bias is not None:
            logits += self.logit_bias
        if self.min_new_tokens_mask is not None:
            logits += self.min_new_tokens_mask
        for processor, rows, params in self.custom_logit_processors or []:
            logits[rows] = processor(logits[rows], params)
