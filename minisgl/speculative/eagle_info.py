"""EagleDraftInput and EagleVerifyInput: what one EAGLE round hands its forwards.

Mirrors python/sglang/srt/speculative/eagle_info.py. Either rides in
``ForwardBatch.spec_info``: the draft model reads ``hidden_states`` (its feature rows),
the attention backend ``custom_mask``, ForwardBatch.init_new ``positions``. SGLang's
classes also prepare the batches themselves (prepare_for_verify, prepare_extend_after_decode)
with Triton kernels, and keep the state between rounds on the ScheduleBatch, filtered and
merged with it; minisgl's worker builds the batches (eagle_worker.py) and keeps each
request's state on the request (Req.eagle_draft_state), which retraction and batch changes
then cannot lose.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import torch

from minisgl.layers.sampler import argmax_rows, sample_per_request
from minisgl.speculative.eagle_utils import accept_walk
from minisgl.speculative.spec_utils import sampling_probs

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import Req
    from minisgl.sampling.sampling_batch_info import SamplingBatchInfo


@dataclasses.dataclass
class EagleDraftInput:
    hidden_states: torch.Tensor  # [rows, H'] the feature of each row the draft forward runs
    positions: Optional[torch.Tensor] = None  # a draft tree step: each lane's position
    custom_mask: Optional[torch.Tensor] = None  # and what it may see (eagle_utils.draft_step_mask)
    # Between rounds, per request: the first draft step's top-k (target token ids) and its feature.
    topk_p: Optional[torch.Tensor] = None  # [bs, topk]
    topk_index: Optional[torch.Tensor] = None  # [bs, topk]

    def store(self, reqs: list["Req"]) -> None:
        """Row i becomes request i's state for its next round."""
        for i, req in enumerate(reqs):
            req.eagle_draft_state = (self.hidden_states[i], self.topk_p[i], self.topk_index[i])

    @classmethod
    def from_reqs(cls, reqs: list["Req"]) -> "EagleDraftInput":
        hidden, topk_p, topk_index = (torch.stack(t) for t in zip(*(r.eagle_draft_state for r in reqs)))
        return cls(hidden_states=hidden, topk_p=topk_p, topk_index=topk_index)


@dataclasses.dataclass
class EagleVerifyInput:
    draft_token: torch.Tensor  # [bs * N] t0, then the chosen draft nodes, per request
    parents: torch.Tensor  # [bs, N] each node's parent (-1: t0, or never reached)
    depths: torch.Tensor  # [bs, N]
    positions: torch.Tensor  # [bs * N] L + depth
    custom_mask: Optional[torch.Tensor]  # None for a chain, which the causal mask already is
    num_draft_tokens: int

    def verify(self, logits: torch.Tensor, info: "SamplingBatchInfo") -> tuple[list[list[int]], list[list[int]]]:
        """The target's logits at every node [bs * N, vocab] -> per request the accepted path's
        node indices (t0 first) and the tokens it emits (the accepted drafts, then the bonus)."""
        n = self.num_draft_tokens
        bs = self.parents.shape[0]
        # A node's logits get its depth's biases (min_new_tokens frees a position, not a node).
        node_info = info.for_positions(n, offsets=self.depths.flatten())
        node_info.apply_logits_bias(logits)
        if node_info.is_all_greedy:
            target_next = argmax_rows(logits)
        else:
            target_next = sample_per_request(sampling_probs(logits, node_info), node_info.generators)
        target_next = target_next.view(bs, n)
        paths = accept_walk(self.parents, self.draft_token, target_next)
        tokens = self.draft_token.view(bs, n)
        emitted = [tokens[b, path[1:]].tolist() + [int(target_next[b, path[-1]])] for b, path in enumerate(paths)]
        return paths, emitted
