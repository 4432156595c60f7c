"""Choose the next token of every request, and say how likely it was.

Mirrors python/sglang/srt/layers/sampler.py (Sampler.forward, top_k_top_p_min_p
filtering, _attach_logprobs_to_output). SGLang samples all rows in one kernel
with a per-row seed hash; minisgl gives each request its own torch.Generator,
so a request's random draws do not depend on which batch it shares: one
uniform per row, turned into a token by inverse CDF. The top-k / top-p / min-p
cut sorts only the head of each row, which holds every token a cut can keep.

Logprobs are those of the distribution the token was drawn from after
temperature scaling and before top-k/top-p/min-p truncation (SGLang's default);
for greedy requests that is log_softmax of the raw logits.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl import tracing
from minisgl.kernels.cpu import is_available as cpu_kernels_available
from minisgl.layers.logits_processor import LogitsProcessorOutput


class Sampler(nn.Module):
    @tracing.traced
    def forward(
        self,
        logits_output: LogitsProcessorOutput,
        sampling_info,
        return_logprob: bool,
        top_logprobs_nums: list[int],
        token_ids_logprobs: list[list[int] | None],
    ) -> torch.Tensor:
        logits = logits_output.next_token_logits.float()  # [bs, vocab]
        if sampling_info.is_all_greedy:
            next_token_ids = argmax_rows(logits)
            logprobs = torch.log_softmax(logits, dim=-1) if return_logprob else None
        else:
            logits = logits / sampling_info.temperatures
            probs = torch.softmax(logits, dim=-1)
            logprobs = torch.log_softmax(logits, dim=-1) if return_logprob else None
            next_token_ids = top_k_top_p_min_p_sample(probs, sampling_info)
        if return_logprob:
            _attach_logprobs_to_output(logits_output, logprobs, next_token_ids, top_logprobs_nums, token_ids_logprobs)
        return next_token_ids


def top_k_top_p_min_p_candidates(probs: torch.Tensor, top_ks, top_ps, min_ps) -> tuple[torch.Tensor, torch.Tensor]:
    """The head of each row of probs [bs, vocab], most likely first, with the tokens top-k /
    top-p / min-p drop set to 0: (probs [bs, k], token ids [bs, k]), not renormalized.

    SGLang's torch fallback sorts whole rows (top_k_top_p_min_p_sampling_from_probs_torch); at
    256 rows of a 49,152-token vocabulary that took 427 ms on 2 cores. Each rule drops every
    token after the first one it drops, so a topk of k tokens is enough once every row drops
    its k-th: k starts at 64 and grows 4x until it is (a whole sort past vocab / 4), and the
    tokens kept are those of a full sort. A row with no cut never drops its k-th, so its
    batch pays a whole sort: the sampler gives such rows their whole row instead.
    """
    vocab = probs.shape[-1]
    k = min(vocab, 64)
    while True:
        if k < vocab:
            sorted_probs, sorted_idx = probs.topk(k, dim=-1)  # sorted, most likely first
        else:
            sorted_probs, sorted_idx = probs.sort(dim=-1, descending=True)
        rank = torch.arange(k, device=probs.device)
        drop = rank[None, :] >= top_ks[:, None]
        # top-p keeps the smallest prefix whose mass reaches p: drop a token if the mass before it already does.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop |= mass_before > top_ps[:, None]
        drop |= sorted_probs < sorted_probs[:, :1] * min_ps[:, None]
        drop[:, 0] = False  # the most likely token always survives
        if k == vocab or bool(drop[:, -1].all()):
            return sorted_probs.masked_fill(drop, 0.0), sorted_idx
        k = 4 * k if 4 * k <= vocab // 4 else vocab  # past that, one sort costs less than a larger topk


def top_k_top_p_min_p_renorm(probs: torch.Tensor, info) -> torch.Tensor:
    """probs [bs, vocab] cut to each row's top-k / top-p / min-p set and renormalized (what
    speculative verification compares draft and target distributions on)."""
    if not (info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling):
        return probs
    kept, ids = top_k_top_p_min_p_candidates(probs, info.top_ks, info.top_ps, info.min_ps)
    filtered = torch.zeros_like(probs).scatter_(-1, ids, kept)
    return filtered / filtered.sum(dim=-1, keepdim=True)


def top_k_top_p_min_p_sample(probs: torch.Tensor, info) -> torch.Tensor:
    """One token per row of probs [bs, vocab]: rows with a top-k / top-p / min-p cut (greedy
    rows too, whose top_k is 1) draw among the cut's candidates alone; rows without one
    draw from their whole row. No renormalized [bs, vocab] copy is built."""
    cut = (info.top_ks < probs.shape[-1]) | (info.top_ps < 1) | (info.min_ps > 0)
    out = torch.empty(len(probs), dtype=torch.int64, device=probs.device)

    def rows_of(mask):  # the rows, their probabilities (no copy when it is all of them), their generators
        rows = torch.nonzero(mask).flatten()
        return rows, probs if len(rows) == len(probs) else probs[rows], [info.generators[i] for i in rows.tolist()]

    rows, part, generators = rows_of(~cut)
    if len(rows):
        out[rows] = sample_per_request(part, generators)
    rows, part, generators = rows_of(cut)
    if len(rows):
        kept, ids = top_k_top_p_min_p_candidates(part, info.top_ks[rows], info.top_ps[rows], info.min_ps[rows])
        out[rows] = ids.gather(1, sample_per_request(kept, generators)[:, None])[:, 0]
    return out


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) of [rows, vocab] float32 scores: on CPU, minisgl's kernel (sampling.cpp),
    since ATen's argmax along the last dimension is not vectorized (2.9 ms against 0.6 ms for 48
    rows of a 49,152-token vocabulary on a 2-core AMD EPYC). Same result, ties and NaN included."""
    kernel_takes_it = x.dim() == 2 and x.dtype == torch.float32 and x.shape[1] > 0 and x.stride(1) == 1
    if x.is_cpu and kernel_takes_it and cpu_kernels_available():
        return torch.ops.minisgl_kernel.argmax_cpu(x)
    return torch.argmax(x, dim=-1)


def sample_per_request(probs: torch.Tensor, generators: list) -> torch.Tensor:
    """One index per row of probs [bs, n] (not necessarily normalized): the argmax where the
    generator is None (greedy rows), else a draw by inverse CDF with one uniform from that
    row's generator, so a request's draws do not depend on its batch.

    torch.multinomial per row took 0.85 ms on a 49,152-token row; one cumsum over the sampled
    rows and a searchsorted take about a sixth of that. An index of probability 0 is never
    drawn: the CDF does not rise there (float32 sums of non-negative terms never fall).
    """
    out = argmax_rows(probs)
    rows = [i for i, gen in enumerate(generators) if gen is not None]
    if rows:
        cdf = probs[rows].cumsum(dim=-1)
        uniforms = torch.cat([torch.rand(1, generator=generators[i], device=probs.device) for i in rows])
        total = cdf[:, -1:].contiguous()
        picked = torch.searchsorted(cdf, uniforms[:, None] * total, right=True)
        # u * total can round up to total itself; the last index with mass is where the CDF first reaches it.
        picked = torch.minimum(picked, torch.searchsorted(cdf, total))
        out[rows] = picked[:, 0].to(out.dtype)
    return out


def _attach_logprobs_to_output(output, logprobs, next_token_ids, top_logprobs_nums, token_ids_logprobs) -> None:
    rows = torch.arange(len(next_token_ids), device=next_token_ids.device)
    output.next_token_logprobs = logprobs[rows, next_token_ids]
    max_k = max(top_logprobs_nums, default=0)
    if max_k > 0:
        vals, idx = logprobs.topk(max_k, dim=-1)
        vals, idx = vals.tolist(), idx.tolist()
        output.next_token_top_logprobs_val = [v[:k] for v, k in zip(vals, top_logprobs_nums)]
        output.next_token_top_logprobs_idx = [v[:k] for v, k in zip(idx, top_logprobs_nums)]
    if any(token_ids_logprobs):
        output.next_token_token_ids_logprobs_val = [
            logprobs[i, ids].tolist() if ids else [] for i, ids in enumerate(token_ids_logprobs)
        ]
        output.next_token_token_ids_logprobs_idx = [list(ids) if ids else [] for ids in token_ids_logprobs]
