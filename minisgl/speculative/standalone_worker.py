"""StandaloneWorker: speculative decoding with a separate small draft model.

Mirrors python/sglang/srt/speculative/standalone_worker.py with the chain (topk 1)
path of eagle_worker.py (forward_batch_generation, forward_target_extend, draft,
verify, forward_draft_extend_after_decode) and of eagle_info.py
(EagleVerifyInput.verify). The worker *is* the draft TpModelWorker
(is_draft_worker=True), built on the target's req_to_token_pool and allocator
from get_memory_pool(): one slot handed out indexes both models' KV pools
(claim C12). Speculation is a layer of the shell around two workers; the
Sampler is untouched.

One decode round, for a request whose last token t0 sits at position L (k = num_steps):
  draft    k DECODE forwards of the draft: t0, d1 .. d(k-1) in, d1 .. dk out
  verify   one TARGET_VERIFY forward of the target over [t0, d1 .. dk] at L .. L+k,
           with logits at every position
  accept   greedy: the drafts that equal the target's argmax, then the target's next token;
           sampled: rejection sampling (keep d_i with probability min(1, p/q), else draw
           from max(p - q, 0)), so tokens follow the target's distribution exactly
  free     the slots of rejected positions go back to the allocator
  catch up when all k drafts were accepted the draft never saw dk: a DRAFT_EXTEND writes it
Between rounds both models hold KV for the same positions, 0 .. kv_len-1, so a prefix
shared through the radix cache is valid for both. A prefill runs the target, then the
draft (DRAFT_EXTEND) over the same tokens and slots.

A round's logprobs are read off the verify's logits (spec_utils.attach_verified_logprobs).
SGLang also drafts trees (topk > 1; minisgl's EAGLEWorker does), drives EAGLE drafts with
the target's hidden states, captures CUDA graphs for draft and verify (minisgl's CPU
graph runner compiles both: model_executor/graph_runner.py), overlaps scheduling, and
keeps penalties and grammars under speculation; omitted.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import torch

from minisgl import tracing
from minisgl.layers.sampler import argmax_rows, sample_per_request
from minisgl.managers.schedule_batch import ModelWorkerBatch
from minisgl.managers.tp_worker import GenerationBatchResult, TpModelWorker
from minisgl.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from minisgl.sampling.sampling_batch_info import SamplingBatchInfo
from minisgl.server_args import ServerArgs
from minisgl.speculative.spec_utils import (
    DraftTpModelWorker,
    attach_verified_logprobs,
    plain_batch,
    release_kv,
    sampling_probs,
)

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import ScheduleBatch


class StandaloneWorker(DraftTpModelWorker):
    """The draft TpModelWorker, and the draft-verify loop around it and the target worker."""

    def __init__(self, server_args: ServerArgs, tp_rank: int, target_worker: TpModelWorker) -> None:
        self.speculative_num_steps = server_args.speculative_num_steps
        self.speculative_num_draft_tokens = server_args.speculative_num_draft_tokens
        with tracing.span("StandaloneWorker.__init__", num_steps=self.speculative_num_steps):
            super().__init__(server_args, tp_rank, target_worker)
        draft, target = self.model_config, target_worker.model_config
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"the draft's vocabulary ({draft.vocab_size}) is not the target's ({target.vocab_size})")
        if draft.context_len < target.context_len:
            raise ValueError(
                f"the draft's context ({draft.context_len}) is shorter than the target's ({target.context_len})"
            )

    def forward_batch_generation(self, batch: "ScheduleBatch") -> GenerationBatchResult:
        """A prefill runs both models; a decode runs one draft-verify round."""
        if batch.forward_mode.is_extend():
            return self.forward_target_extend(batch)
        model_worker_batch = batch.get_model_worker_batch()
        drafts, draft_probs = self.draft(model_worker_batch)
        return self.verify(batch, model_worker_batch, drafts, draft_probs)

    def forward_target_extend(self, batch: "ScheduleBatch") -> GenerationBatchResult:
        model_worker_batch = batch.get_model_worker_batch()
        result = self.target_worker.forward_batch_generation(model_worker_batch)
        self.forward_draft_extend(dataclasses.replace(model_worker_batch, forward_mode=ForwardMode.DRAFT_EXTEND))
        return result

    @tracing.traced(attrs=lambda self, batch: {"batch_size": len(batch.seq_lens)})
    def forward_draft_extend(self, model_worker_batch: ModelWorkerBatch) -> None:
        """Write the draft's KV for tokens the target already has (its logits are not needed)."""
        self._draft_logits(model_worker_batch)

    def _draft_logits(self, model_worker_batch: ModelWorkerBatch) -> torch.Tensor:
        forward_batch = ForwardBatch.init_new(model_worker_batch, self.model_runner)
        return self.model_runner.forward(forward_batch).logits_output.next_token_logits

    # ---- draft ---------------------------------------------------------------------------

    @tracing.traced(attrs=lambda self, batch: {"num_steps": self.speculative_num_steps})
    def draft(self, batch: ModelWorkerBatch) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """k draft tokens per request, [bs, k], and the distributions they were drawn from,
        [bs, k, vocab] (None when every request is greedy)."""
        k = self.speculative_num_steps
        bs = len(batch.seq_lens)
        # prepare_for_decode gave each request k + 1 slots: positions L .. L+k.
        slots = batch.out_cache_loc.view(bs, k + 1)
        start = [s - (k + 1) for s in batch.seq_lens]
        info = batch.sampling_info
        tokens = list(batch.input_ids)
        drafts, probs = [], []
        for step in range(k):
            step_batch = plain_batch(
                batch,
                forward_mode=ForwardMode.DECODE,
                input_ids=tokens,
                seq_lens=[p + step + 1 for p in start],
                out_cache_loc=slots[:, step].contiguous(),
            )
            logits = self._draft_logits(step_batch).float()
            info.apply_logits_bias(logits)
            if info.is_all_greedy:
                next_ids = argmax_rows(logits)
            else:
                q = sampling_probs(logits, info)
                next_ids = sample_per_request(q, info.generators)
                probs.append(q)
            drafts.append(next_ids)
            tokens = next_ids.tolist()
        return torch.stack(drafts, dim=1), (torch.stack(probs, dim=1) if probs else None)

    # ---- verify --------------------------------------------------------------------------

    def verify(
        self,
        batch: "ScheduleBatch",
        model_worker_batch: ModelWorkerBatch,
        drafts: torch.Tensor,
        draft_probs: Optional[torch.Tensor],
    ) -> GenerationBatchResult:
        k = self.speculative_num_steps
        bs = len(model_worker_batch.seq_lens)
        start = [s - (k + 1) for s in model_worker_batch.seq_lens]
        last = torch.tensor(model_worker_batch.input_ids, dtype=drafts.dtype, device=drafts.device)
        verify_ids = torch.cat([last[:, None], drafts], dim=1)  # [bs, k + 1]
        verify_batch = plain_batch(
            model_worker_batch,
            forward_mode=ForwardMode.TARGET_VERIFY,
            input_ids=verify_ids.flatten().tolist(),
            extend_seq_lens=[k + 1] * bs,
            extend_prefix_lens=start,
            extend_logprob_start_lens=list(model_worker_batch.seq_lens),
        )
        with tracing.span("StandaloneWorker.verify"):
            result = self.target_worker.forward_batch_generation(verify_batch, is_verify=True)
            logits = result.logits_output.next_token_logits.float()  # [bs * (k + 1), vocab]
            info = model_worker_batch.sampling_info
            row_info = info.for_positions(k + 1)
            row_info.apply_logits_bias(logits)
            accepted = _accept(drafts, draft_probs, logits, row_info, info.generators, k)
            for req, tokens in zip(batch.reqs, accepted):
                # The tokens before the last accepted one have KV; the rest of the round's slots go back.
                release_kv(
                    self.req_to_token_pool, self.token_to_kv_pool_allocator, req, req.kv_len - (k + 1) + len(tokens)
                )
            num_accepted = [len(t) - 1 for t in accepted]
            tracing.point(
                "StandaloneWorker.verify.accepted",
                accept_lengths=num_accepted,
                freed_slots=sum(k - n for n in num_accepted),
            )
        next_token_ids = torch.tensor([t for tokens in accepted for t in tokens], dtype=torch.int64)
        rows = [[b * (k + 1) + j for j in range(len(tokens))] for b, tokens in enumerate(accepted)]
        attach_verified_logprobs(result.logits_output, logits, rows, next_token_ids, model_worker_batch)
        self.forward_draft_extend_after_decode(model_worker_batch, verify_ids, num_accepted)
        return GenerationBatchResult(
            logits_output=result.logits_output, next_token_ids=next_token_ids, accept_length_per_req_cpu=num_accepted
        )

    def forward_draft_extend_after_decode(
        self, batch: ModelWorkerBatch, verify_ids: torch.Tensor, num_accepted: list[int]
    ) -> None:
        """Where all k drafts were accepted, the draft has no KV for dk (position L+k): write it.
        SGLang's EAGLE runs this after every verify, over all accepted tokens, to refresh the
        draft's hidden states; a standalone draft only ever misses dk."""
        k = self.speculative_num_steps
        rows = [i for i, n in enumerate(num_accepted) if n == k]
        if not rows:
            return
        slots = batch.out_cache_loc.view(len(batch.seq_lens), k + 1)
        seq_lens = [batch.seq_lens[i] for i in rows]
        self.forward_draft_extend(
            ModelWorkerBatch(
                forward_mode=ForwardMode.DRAFT_EXTEND,
                input_ids=verify_ids[rows, k].tolist(),
                req_pool_indices=[batch.req_pool_indices[i] for i in rows],
                seq_lens=seq_lens,
                out_cache_loc=slots[rows, k].contiguous(),
                sampling_info=None,  # no token is drawn
                return_logprob=False,
                top_logprobs_nums=[0] * len(rows),
                token_ids_logprobs=[None] * len(rows),
                capture_hidden_mode=CaptureHiddenMode.NULL,
                extend_seq_lens=[1] * len(rows),
                extend_prefix_lens=[s - 1 for s in seq_lens],
                extend_logprob_start_lens=seq_lens,
            )
        )


def _accept(
    drafts: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    logits: torch.Tensor,
    info: SamplingBatchInfo,
    generators: list[Optional[torch.Generator]],
    k: int,
) -> list[list[int]]:
    """Per request: the accepted drafts, then one token of the target's own (k + 1 at most).
    info has a row per position where the batch samples; generators, one per request."""
    bs = drafts.shape[0]
    logits = logits.view(bs, k + 1, -1)
    greedy_next = logits.argmax(dim=-1)  # [bs, k + 1]
    # Greedy: drafts are kept while each equals the target's argmax at its position.
    num_matching = (drafts == greedy_next[:, :k]).int().cumprod(dim=1).sum(dim=1).tolist()
    target_probs = None
    if not info.is_all_greedy:
        target_probs = sampling_probs(logits.view(bs * (k + 1), -1), info).view(bs, k + 1, -1)
    accepted = []
    for i, generator in enumerate(generators):
        if generator is None:
            n = num_matching[i]
            accepted.append(drafts[i, :n].tolist() + [int(greedy_next[i, n])])
        else:
            accepted.append(_rejection_sample(drafts[i].tolist(), draft_probs[i], target_probs[i], generator))
    return accepted


def _rejection_sample(drafts: list[int], q: torch.Tensor, p: torch.Tensor, generator: torch.Generator) -> list[int]:
    """Speculative sampling (Leviathan et al., 2023; Chen et al., 2023) for one request.

    q: [k, vocab] the draft's distributions, p: [k + 1, vocab] the target's. Draft d_i is
    kept with probability min(1, p_i(d_i) / q_i(d_i)); the first one refused is replaced
    by a draw from max(p_i - q_i, 0), renormalized; if none is refused, a bonus token is
    drawn from p_k. Each emitted token is then distributed exactly as p."""
    tokens = []
    for i, d in enumerate(drafts):
        u = torch.rand((), generator=generator, device=q.device)
        if u * q[i, d] < p[i, d]:
            tokens.append(d)
            continue
        residual = (p[i] - q[i]).clamp_(min=0)
        # All-zero only if p == q, where nothing is ever refused; guard against rounding.
        dist = residual if residual.sum() > 0 else p[i]
        tokens.append(int(torch.multinomial(dist, 1, generator=generator)))
        return tokens
    tokens.append(int(torch.multinomial(p[len(drafts)], 1, generator=generator)))
    return tokens
