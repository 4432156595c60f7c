"""EAGLE's draft tree in plain torch: growing it, choosing the nodes to verify, its attention
mask and positions, and the walk that accepts a path through it.

Mirrors python/sglang/srt/speculative/spec_utils.py (select_top_k_tokens) and
eagle_utils.py (organize_draft_results, build_tree_kernel_efficient, and the accept walk
of verify_tree_greedy / tree_speculative_sampling_target_only in sgl-kernel). SGLang
builds the tree and walks it in CUDA kernels that return retrive_index /
retrive_next_token / retrive_next_sibling; here the same tree is a parent index per node,
built and walked in Python loops over the batch, which a reader can step through.

The tree of one round, for a request whose last verified token t0 sits at position L:
  step 0     the top-k tokens of the draft's last distribution: k candidates, all kept
  step i>0   each kept node's top-k children, scored by the product of the probabilities
             along the path: k * k candidates, the k best kept (they are drafted from next)
  select     the num_draft_tokens - 1 best candidates of all steps, in drafting order;
             a child never scores above its parent, so the chosen nodes form a tree
  verify     t0 and the chosen nodes in one TARGET_VERIFY forward; node j sits at position
             L + depth(j) and sees the prefix, its ancestors and itself (the custom mask)
  accept     from t0, move to the child whose token is the target's next token while there
             is one; the target's token at the last node reached is the bonus token
"""

from __future__ import annotations

from typing import Optional

import torch


def select_top_k_tokens(
    i: int,
    topk_p: torch.Tensor,  # [bs * lanes, topk] the last step's top-k probabilities per lane
    topk_index: torch.Tensor,  # [bs * lanes, topk] and their (target) token ids
    hidden_states: torch.Tensor,  # [bs * lanes, H] the feature each lane drafts from
    scores: Optional[torch.Tensor],  # [bs, topk] path scores of the kept nodes (None at step 0)
    topk: int,
):
    """Step i's candidates and the topk nodes kept for drafting (SGLang's select_top_k_tokens).

    Returns the kept nodes' tokens [bs * topk] and features, their scores, the step's tree
    info (candidate scores, candidate tokens, global ids of the kept nodes: every candidate
    of the round has an id, step 0's 0 .. topk-1, step i's topk + topk^2 (i - 1) + ...), and
    for i > 0 the lane of each kept node's parent [bs, topk]."""
    if i == 0:
        bs = topk_p.shape[0]
        input_ids = topk_index.flatten()
        hidden_states = hidden_states.repeat_interleave(topk, dim=0)
        parents = torch.arange(-1, topk, device=topk_p.device).unsqueeze(0).repeat(bs, 1)
        return input_ids, hidden_states, topk_p, (topk_p.unsqueeze(1), topk_index, parents), None
    bs = topk_p.shape[0] // topk
    expand_scores = scores.unsqueeze(2) * topk_p.view(bs, topk, topk)  # [bs, parent lane, child]
    scores, cs_index = expand_scores.flatten(start_dim=1).topk(topk, dim=-1)
    topk_index = topk_index.view(bs, topk * topk)
    input_ids = topk_index.gather(1, cs_index).flatten()
    parent_lanes = cs_index // topk
    rows = parent_lanes + torch.arange(0, bs * topk, topk, device=cs_index.device).unsqueeze(1)
    hidden_states = hidden_states[rows.flatten()]
    kept_ids = cs_index + (topk * topk * (i - 1) + topk)
    return input_ids, hidden_states, scores, (expand_scores, topk_index, kept_ids), parent_lanes


def organize_draft_results(score_list, token_list, parents_list, num_draft_token: int):
    """The num_draft_token - 1 best candidates of the round, in drafting order (SGLang's name)."""
    scores = torch.cat(score_list, dim=1).flatten(1)
    tokens = torch.cat(token_list, dim=1)
    top_scores_index = scores.topk(num_draft_token - 1, dim=-1).indices.sort().values
    draft_tokens = tokens.gather(1, top_scores_index)
    bs = scores.shape[0]
    parent_list = torch.cat(parents_list[:-1], dim=1) if len(parents_list) > 1 else torch.empty(bs, 0)
    return parent_list, top_scores_index, draft_tokens


def build_tree_kernel_efficient(
    verified_id: torch.Tensor,  # [bs] t0
    parent_list: torch.Tensor,  # [bs, topk + 1 + (steps - 2) * topk] global id of each kept node
    top_scores_index: torch.Tensor,  # [bs, N - 1] chosen candidates' global ids, ascending
    draft_tokens: torch.Tensor,  # [bs, N - 1]
    prefix_lens: list[int],
    topk: int,
    num_draft_token: int,
) -> dict[str, torch.Tensor]:
    """The verify tree (SGLang's build_tree_kernel_efficient, as a parent index per node).

    Node 0 is t0, node k + 1 the k-th chosen candidate. Returns draft_token [bs * N],
    parents [bs, N] (-1 for t0 and for a node whose parent a tie left out: never reached),
    depths [bs, N], positions [bs * N] and custom_mask: per request [N, L + N] (all of the
    prefix, then ancestors-or-self), flattened and concatenated."""
    bs, n = len(prefix_lens), num_draft_token
    chosen, kept = top_scores_index.tolist(), parent_list.long().tolist()
    # Built in Python lists, one tensor each at the end: element-wise writes into tensors cost a
    # torch call apiece, about a quarter of a millisecond a round for a tree of 10.
    parents, depths, tree_mask = [[-1] * n for _ in range(bs)], [[0] * n for _ in range(bs)], []
    for b in range(bs):
        rows = [[j == k for j in range(n)] for k in range(n)]  # node k's ancestors-or-self
        node_of = {-1: 0}  # global candidate id -> node index (-1: the root t0)
        for k, g in enumerate(chosen[b]):
            node_of[g] = k + 1
            # A step-0 candidate hangs from t0; a later one from the kept node of its lane.
            p = node_of.get(-1 if g < topk else kept[b][g // topk])
            if p is None:
                continue
            parents[b][k + 1], depths[b][k + 1] = p, depths[b][p] + 1
            rows[k + 1] = [mine or above for mine, above in zip(rows[k + 1], rows[p])]
        tree_mask.append(rows)
    parents, depths = torch.tensor(parents, dtype=torch.int64), torch.tensor(depths, dtype=torch.int64)
    tree_mask = torch.tensor(tree_mask, dtype=torch.bool)  # [bs, n, n]
    masks = [
        torch.cat([torch.ones(n, L, dtype=torch.bool), tree_mask[b]], dim=1).flatten()
        for b, L in enumerate(prefix_lens)
    ]
    device = verified_id.device
    return dict(
        draft_token=torch.cat([verified_id[:, None], draft_tokens], dim=1).flatten(),
        parents=parents,
        depths=depths,
        positions=(torch.tensor(prefix_lens)[:, None] + depths).flatten().to(device),
        custom_mask=torch.cat(masks).to(device),
    )


def draft_step_mask(paths: torch.Tensor, prefix_lens: list[int], i: int, topk: int) -> torch.Tensor:
    """Draft forward i's custom mask: each lane is one new token on top of the prefix and the
    i * topk nodes drafted before it, of which it sees the prefix, its own ancestors
    (paths [bs, topk, i]: its ancestor's lane at each earlier step) and itself."""
    masks = []
    for b, L in enumerate(prefix_lens):
        drafted = []  # per lane, what it sees of the i * topk drafted nodes and itself
        for ancestor_lanes in paths[b].tolist():
            row = [False] * (i * topk) + [True]
            for j, ancestor_lane in enumerate(ancestor_lanes):
                row[j * topk + ancestor_lane] = True
            drafted.append(row)
        masks.append(torch.cat([torch.ones(topk, L, dtype=torch.bool), torch.tensor(drafted)], dim=1).flatten())
    return torch.cat(masks)


def accept_walk(parents: torch.Tensor, draft_token: torch.Tensor, target_next: torch.Tensor) -> list[list[int]]:
    """Per request, the accepted path's node indices, t0's first; its last node's target token
    is the bonus. target_next [bs, N]: the target's token after each node (argmax, or drawn
    from the request's distribution: a path then survives as long as the draws fall on drafted
    children, so every token emitted follows the target's distribution exactly)."""
    bs, n = parents.shape
    tokens, nexts, pars = draft_token.view(bs, n).tolist(), target_next.tolist(), parents.tolist()
    paths = []
    for b in range(bs):
        children: dict[int, list[int]] = {}
        for node in range(1, n):
            children.setdefault(pars[b][node], []).append(node)
        path = [0]
        while True:
            want = nexts[b][path[-1]]
            child = next((c for c in children.get(path[-1], []) if tokens[b][c] == want), None)
            if child is None:
                break
            path.append(child)
        paths.append(path)
    return paths
