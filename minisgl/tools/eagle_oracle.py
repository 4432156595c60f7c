"""An oracle draft for EAGLE: plant the target's true next tokens along one branch of each tree.

A random head (make_eagle_head) almost never drafts a token the target accepts, so a test or a
trace of it shows only rejections. plant_oracle wraps a worker's draft(): after the head has
drafted its tree, the tokens along one root-to-leaf branch (the last child at each level, so
not the first-drafted path) are replaced by the target's greedy continuation, known from a
plain run. Verify is untouched: what it accepts is still decided by the target alone, so the
output must stay the target's, while the accept walk, the slot moves and the draft extend run
on real acceptances through non-contiguous nodes.
"""

from __future__ import annotations


def plant_oracle(worker, expected: dict[tuple, list[int]], depth: int = 2) -> None:
    """expected: prompt (as a tuple) -> the target's greedy output ids; depth: levels planted."""
    draft = worker.draft

    def oracle_draft(batch, model_worker_batch):
        spec = draft(batch, model_worker_batch)
        tokens = spec.draft_token.view(len(batch.reqs), -1)
        for b, req in enumerate(batch.reqs):
            truth, node = expected[tuple(req.origin_input_ids)][len(req.output_ids) :], 0
            for token in truth[:depth]:
                children = (spec.parents[b] == node).nonzero().flatten().tolist()
                if not children:
                    break
                node = children[-1]
                tokens[b, node] = token
        return spec

    worker.draft = oracle_draft
