"""EAGLEWorker: speculative decoding with an EAGLE / EAGLE3 draft head, as a chain or a tree.

Mirrors python/sglang/srt/speculative/eagle_worker.py (EAGLEWorker.__init__ with
set_embed_and_head / hot_token_id, forward_batch_generation, forward_target_extend,
forward_draft_extend, draft, draft_forward, verify, forward_draft_extend_after_decode).
Like StandaloneWorker the worker *is* the draft TpModelWorker, on the target's
req_to_token_pool and allocator; the head shares the target's embedding and LM head.

The draft at position i reads token i + 1 and a feature of position i: the target's hidden
state there (EAGLE: its final one; EAGLE3: three layers' inputs), or the draft's own output
when it drafts past the target. One decode round, for a request whose last verified token
t0 sits at position L (k = speculative_num_steps, N = speculative_num_draft_tokens):
  draft         the first step's top-k is already known (the last draft extend's); k - 1
                forwards of the draft grow the tree (eagle_utils.py), each lane a one-token
                extend that sees the prefix and its own ancestors (a custom mask)
  verify        one TARGET_VERIFY forward over t0 and the N - 1 best nodes, with the tree's
                mask and positions, keeping the target's hidden states; the accept walk
                follows the target's tokens down the tree
  free          the accepted path's slots become positions L .. L+n; the round's other
                slots go back to the allocator
  draft_extend  the draft reruns positions L .. L+n on the target's fresh features: it
                rewrites their KV and yields the next round's first top-k and feature
A prefill runs the target (keeping its hidden states), then a draft extend over the same
positions with the tokens shifted by one. The logprobs of a round's tokens are read off
the verify's logits (spec_utils.attach_verified_logprobs). With --enable-torch-compile the
draft steps replay a graph (model_executor/graph_runner.py), as SGLang's
EAGLEDraftCudaGraphRunner captures them, and so does the draft extend
(draft_extend_graph_runner, SGLang's cuda_graph_runner_for_draft_extend: an
EAGLEDraftExtendCudaGraphRunner, each request given k + 1 rows). SGLang also overlaps
scheduling with the round (eagle_worker_v2.py); omitted.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import torch

from minisgl import tracing
from minisgl.layers.linear import weight_rows
from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.layers.vocab_parallel_embedding import ParallelLMHead
from minisgl.managers.schedule_batch import ModelWorkerBatch
from minisgl.managers.tp_worker import GenerationBatchResult, TpModelWorker
from minisgl.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from minisgl.server_args import ServerArgs
from minisgl.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from minisgl.speculative.eagle_utils import (
    build_tree_kernel_efficient,
    draft_step_mask,
    organize_draft_results,
    select_top_k_tokens,
)
from minisgl.speculative.spec_info import SpeculativeAlgorithm
from minisgl.speculative.spec_utils import DraftTpModelWorker, attach_verified_logprobs, plain_batch, release_kv

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import ScheduleBatch
    from minisgl.model_executor.cpu_graph_runner import CPUGraphRunner
    from minisgl.model_executor.model_runner import ModelRunner

_HEADS = {"EAGLE": "LlamaForCausalLMEagle", "EAGLE3": "LlamaForCausalLMEagle3"}


class EAGLEWorker(DraftTpModelWorker):
    """The draft TpModelWorker of an EAGLE head, and the draft-verify loop around both workers."""

    def __init__(self, server_args: ServerArgs, tp_rank: int, target_worker: TpModelWorker) -> None:
        self.speculative_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
        self.speculative_num_steps = server_args.speculative_num_steps
        self.topk = server_args.speculative_eagle_topk
        self.speculative_num_draft_tokens = server_args.speculative_num_draft_tokens
        self.num_slots_per_round = server_args.speculative_num_slots_per_round()
        attrs = dict(
            num_steps=self.speculative_num_steps, topk=self.topk, num_draft_tokens=self.speculative_num_draft_tokens
        )
        with tracing.span("EAGLEWorker.__init__", algorithm=server_args.speculative_algorithm, **attrs):
            super().__init__(server_args, tp_rank, target_worker)
            self.hot_token_id = self.share_embed_and_head(server_args.speculative_token_map)
            if self.speculative_algorithm.is_eagle3():
                eagle_config = getattr(self.model_config.hf_config, "eagle_config", None) or {}
                layer_ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
                target_worker.model_runner.model.set_eagle3_layers_to_capture(layer_ids)
            self.draft_extend_graph_runner = self.init_draft_extend_graph()

    def init_draft_extend_graph(self) -> Optional["CPUGraphRunner"]:
        """The draft extend's graph, where the head compiles its draft steps (a CPU with
        --enable-torch-compile). Its tokens carry the target's features: the final hidden
        state (EAGLE) or the layers' inputs side by side (EAGLE3)."""
        from minisgl.model_executor.cpu_graph_runner import CPUGraphRunner

        if not isinstance(self.model_runner.graph_runner, CPUGraphRunner):
            return None
        target = self.target_worker.model_runner.model
        layers = len(target.model.layers_to_capture) if self.speculative_algorithm.is_eagle3() else 1
        return CPUGraphRunner(self.model_runner, extend_features=layers * self.target_worker.model_config.hidden_size)

    def _init_model_config(self) -> None:
        """The head must fit the target: refused here, before any weight is read."""
        super()._init_model_config()
        head, target = self.model_config, self.target_worker.model_config
        expected = _HEADS[self.server_args.speculative_algorithm]
        if expected not in head.architectures:
            raise ValueError(
                f"speculative_algorithm {self.server_args.speculative_algorithm} needs a {expected} head; "
                f"{head.model_path} is {head.architectures}"
            )
        head_reads = getattr(head.hf_config, "target_hidden_size", None) or head.hidden_size
        if head_reads != target.hidden_size or head.hidden_size != target.hidden_size:
            raise ValueError(
                f"the draft head's hidden size ({head.hidden_size}) does not match the target's ({target.hidden_size})"
            )
        if head.vocab_size != target.vocab_size:
            raise ValueError(
                f"the draft head's vocab_size ({head.vocab_size}) is not the target's ({target.vocab_size})"
            )
        head.dtype = target.dtype  # it reads the target's features and shares its embedding

    def share_embed_and_head(self, token_map: Optional[str]) -> Optional[torch.Tensor]:
        """Give the head the target's embedding (and LM head, cut to the hot tokens); return the
        map from a drafted index to a target token (None: the identity)."""
        embed, head = self.target_worker.model_runner.model.get_embed_and_head()
        for model in self.draft_models():
            if self.speculative_algorithm.is_eagle3():
                model.set_embed(embed)
            else:
                model.set_embed_and_head(embed, head if token_map is None else _cut_head(head, token_map))
        if self.speculative_algorithm.is_eagle3():
            return self.model_runner.model.hot_token_id
        return None if token_map is None else _load_token_map(token_map, head.org_vocab_size).to(embed.weight.device)

    def draft_models(self) -> list:
        return [self.model_runner.model]

    # ---- the round -----------------------------------------------------------------------

    def forward_batch_generation(self, batch: "ScheduleBatch") -> GenerationBatchResult:
        """A prefill runs the target, then the draft; a decode runs one draft-verify round."""
        if batch.forward_mode.is_extend():
            return self.forward_target_extend(batch)
        model_worker_batch = batch.get_model_worker_batch()
        spec_info = self.draft(batch, model_worker_batch)
        return self.verify(batch, model_worker_batch, spec_info)

    def forward_target_extend(self, batch: "ScheduleBatch") -> GenerationBatchResult:
        model_worker_batch = batch.get_model_worker_batch()
        full = dataclasses.replace(model_worker_batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        result = self.target_worker.forward_batch_generation(full)
        # The draft at position i reads token i + 1: the chunk's tokens shifted by one, then the
        # next prompt token (a chunk) or the token just sampled.
        input_ids = []
        for i, (req, next_id) in enumerate(zip(batch.reqs, result.next_token_ids.tolist())):
            seq_len = batch.seq_lens[i]
            following = (req.origin_input_ids + req.output_ids)[seq_len] if req.is_chunked else next_id
            input_ids += req.fill_ids[batch.prefix_lens[i] + 1 : seq_len] + [following]
        draft_batch = plain_batch(model_worker_batch, forward_mode=ForwardMode.DRAFT_EXTEND, input_ids=input_ids)
        state = self.forward_draft_extend(draft_batch, result.logits_output.hidden_states)
        state.store(batch.reqs)  # a chunk's is overwritten by its last chunk's
        return result

    @tracing.traced(attrs=lambda self, batch, hidden_states: {"batch_size": len(batch.seq_lens)})
    def forward_draft_extend(self, batch: ModelWorkerBatch, hidden_states: torch.Tensor) -> EagleDraftInput:
        """Draft KV for positions the target has verified, from the target's features there; the
        last position's top-k and output are the next round's first step."""
        batch = dataclasses.replace(
            batch, capture_hidden_mode=CaptureHiddenMode.LAST, spec_info=EagleDraftInput(hidden_states=hidden_states)
        )
        return self.run_draft_extend(batch)

    def run_draft_extend(self, batch: ModelWorkerBatch) -> EagleDraftInput:
        forward_batch = ForwardBatch.init_new(batch, self.model_runner)
        graph = self.draft_extend_graph_runner
        if graph is not None and graph.can_run(forward_batch):
            tracing.point("EAGLEWorker.run_draft_extend.dispatch", branch="graph_replay")
            out = graph.replay(forward_batch)
        else:
            out = self.model_runner.forward(forward_batch).logits_output
        topk_p, topk_index = self.draft_topk(out)
        return EagleDraftInput(hidden_states=out.hidden_states, topk_p=topk_p, topk_index=topk_index)

    @staticmethod
    def _forward(runner: "ModelRunner", batch: ModelWorkerBatch) -> LogitsProcessorOutput:
        return runner.forward(ForwardBatch.init_new(batch, runner)).logits_output

    def draft_topk(self, out: LogitsProcessorOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft's top-k, as probabilities and target token ids."""
        topk_p, topk_index = torch.softmax(out.next_token_logits.float(), dim=-1).topk(self.topk, dim=-1)
        return topk_p, (topk_index if self.hot_token_id is None else self.hot_token_id[topk_index])

    # ---- draft -----------------------------------------------------------------------------

    @tracing.traced(attrs=lambda self, batch, mwb: {"num_steps": self.speculative_num_steps, "topk": self.topk})
    def draft(self, batch: "ScheduleBatch", model_worker_batch: ModelWorkerBatch) -> EagleVerifyInput:
        """Grow the round's tree and choose the nodes to verify (SGLang's draft + draft_forward)."""
        bs, topk = len(batch.reqs), self.topk
        prefix_lens = [s - self.num_slots_per_round for s in model_worker_batch.seq_lens]
        slots = model_worker_batch.out_cache_loc.view(bs, self.num_slots_per_round)
        state = EagleDraftInput.from_reqs(batch.reqs)
        topk_p, topk_index, hidden_states, scores = state.topk_p, state.topk_index, state.hidden_states, None
        score_list, token_list, parents_list = [], [], []
        paths = torch.empty(bs, topk, 0, dtype=torch.int64, device=topk_p.device)  # each lane's ancestors' lanes
        for i in range(self.speculative_num_steps):
            input_ids, hidden_states, scores, tree_info, parent_lanes = select_top_k_tokens(
                i, topk_p, topk_index, hidden_states, scores, topk
            )
            score_list.append(tree_info[0])
            token_list.append(tree_info[1])
            parents_list.append(tree_info[2])
            if i == self.speculative_num_steps - 1:
                break
            if i > 0:
                inherited = paths.gather(1, parent_lanes[:, :, None].expand(-1, -1, i - 1))
                paths = torch.cat([inherited, parent_lanes[:, :, None]], dim=2)
            out = self.draft_forward(i, model_worker_batch, input_ids, hidden_states, paths, prefix_lens, slots)
            topk_p, topk_index = self.draft_topk(out)
            hidden_states = out.hidden_states
        parent_list, top_scores_index, draft_tokens = organize_draft_results(
            score_list, token_list, parents_list, self.speculative_num_draft_tokens
        )
        verified_id = torch.as_tensor(model_worker_batch.input_ids, dtype=torch.int64, device=draft_tokens.device)
        tree = build_tree_kernel_efficient(
            verified_id,
            parent_list,
            top_scores_index,
            draft_tokens,
            prefix_lens,
            topk,
            self.speculative_num_draft_tokens,
        )
        if topk == 1:
            tree["custom_mask"] = None  # a chain: the causal mask already is its tree mask
        return EagleVerifyInput(**tree, num_draft_tokens=self.speculative_num_draft_tokens)

    def draft_forward(self, i, batch: ModelWorkerBatch, input_ids, hidden_states, paths, prefix_lens, slots):
        """Draft forward i: each request's topk lanes as one-token extends on top of the prefix
        and the i * topk nodes drafted before (their slots follow the prefix in req_to_token)."""
        topk = self.topk
        lanes = len(prefix_lens) * topk
        prefix = [p + i * topk for p in prefix_lens for _ in range(topk)]
        device = hidden_states.device
        positions = torch.tensor([p + i for p in prefix_lens for _ in range(topk)], device=device)
        mask = draft_step_mask(paths, prefix_lens, i, topk).to(device) if topk > 1 else None
        step = _extend_batch(
            [r for r in batch.req_pool_indices for _ in range(topk)],
            input_ids.tolist(),
            prefix,
            [1] * lanes,
            # contiguous: with topk 1 the column is a strided view, which the CPU kernels refuse.
            slots[:, i * topk : (i + 1) * topk].flatten().contiguous(),
            EagleDraftInput(hidden_states=hidden_states, positions=positions, custom_mask=mask),
        )
        return self._forward(self.model_runner, step)

    # ---- verify ----------------------------------------------------------------------------

    def verify(
        self, batch: "ScheduleBatch", model_worker_batch: ModelWorkerBatch, spec_info: EagleVerifyInput
    ) -> GenerationBatchResult:
        n, r = self.speculative_num_draft_tokens, self.num_slots_per_round
        bs = len(batch.reqs)
        prefix_lens = [s - r for s in model_worker_batch.seq_lens]
        slots = model_worker_batch.out_cache_loc.view(bs, r)
        verify_batch = plain_batch(
            model_worker_batch,
            forward_mode=ForwardMode.TARGET_VERIFY,
            input_ids=spec_info.draft_token.tolist(),
            seq_lens=[p + n for p in prefix_lens],
            out_cache_loc=slots[:, :n].flatten().contiguous(),
            extend_seq_lens=[n] * bs,
            extend_prefix_lens=prefix_lens,
            extend_logprob_start_lens=[p + n for p in prefix_lens],
            capture_hidden_mode=CaptureHiddenMode.FULL,
            spec_info=spec_info,
        )
        with tracing.span("EAGLEWorker.verify"):
            tracing.point(
                "EAGLEWorker.verify.tree", parents=spec_info.parents.tolist(), tokens=spec_info.draft_token.tolist()
            )
            result = self.target_worker.forward_batch_generation(verify_batch, is_verify=True)
            logits = result.logits_output.next_token_logits.float()
            paths, emitted = spec_info.verify(logits, model_worker_batch.sampling_info)
            for b, (req, path) in enumerate(zip(batch.reqs, paths)):
                # The accepted path's slots become positions L .. L+n (KV is addressed by slot, so
                # nothing is copied); the round's other slots follow, and go back.
                rest = [j for j in range(r) if j not in set(path)]
                self.req_to_token_pool.write(
                    (req.req_pool_idx, slice(prefix_lens[b], prefix_lens[b] + r)), slots[b, path + rest]
                )
                release_kv(self.req_to_token_pool, self.token_to_kv_pool_allocator, req, prefix_lens[b] + len(path))
            num_accepted = [len(p) - 1 for p in paths]
            tracing.point(
                "EAGLEWorker.verify.accepted",
                accepted_nodes=paths,
                accept_lengths=num_accepted,
                freed_slots=sum(r - len(p) for p in paths),
            )
        rows = [[b * n + j for j in path] for b, path in enumerate(paths)]  # each emitted token's logits row
        next_token_ids = torch.tensor([t for tokens in emitted for t in tokens], dtype=torch.int64)
        attach_verified_logprobs(result.logits_output, logits, rows, next_token_ids, model_worker_batch)
        hidden = result.logits_output.hidden_states[[row for r in rows for row in r]]
        self.forward_draft_extend_after_decode(batch, model_worker_batch, prefix_lens, paths, emitted, hidden)
        return GenerationBatchResult(
            logits_output=result.logits_output, next_token_ids=next_token_ids, accept_length_per_req_cpu=num_accepted
        )

    def forward_draft_extend_after_decode(self, batch, model_worker_batch, prefix_lens, paths, emitted, hidden) -> None:
        """The draft reruns the accepted positions L .. L+n: tokens L+1 .. L+n+1 (the accepted
        drafts and the bonus) on the target's features, in the accepted path's slots."""
        req_to_token = self.req_to_token_pool.req_to_token
        slots = [
            req_to_token[idx, p : p + len(path)]
            for idx, p, path in zip(model_worker_batch.req_pool_indices, prefix_lens, paths)
        ]
        extend = _extend_batch(
            model_worker_batch.req_pool_indices,
            [t for tokens in emitted for t in tokens],
            prefix_lens,
            [len(path) for path in paths],
            torch.cat(slots).to(torch.int64),
            None,
        )
        self.forward_draft_extend(extend, hidden).store(batch.reqs)


def _extend_batch(req_pool_indices, input_ids, prefix_lens, extend_lens, out_cache_loc, spec_info) -> ModelWorkerBatch:
    """A DRAFT_EXTEND of the draft: no sampling, no side outputs but the hidden states."""
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    return ModelWorkerBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND,
        input_ids=input_ids,
        req_pool_indices=list(req_pool_indices),
        seq_lens=seq_lens,
        out_cache_loc=out_cache_loc,
        sampling_info=None,
        return_logprob=False,
        top_logprobs_nums=[0] * len(seq_lens),
        token_ids_logprobs=[None] * len(seq_lens),
        capture_hidden_mode=CaptureHiddenMode.LAST,
        extend_seq_lens=list(extend_lens),
        extend_prefix_lens=list(prefix_lens),
        extend_logprob_start_lens=seq_lens,
        spec_info=spec_info,
    )


def _load_token_map(path: str, vocab_size: int) -> torch.Tensor:
    hot = torch.load(path)
    hot = torch.as_tensor(hot, dtype=torch.int64)
    if hot.dim() != 1 or len(hot) == 0 or int(hot.min()) < 0 or int(hot.max()) >= vocab_size:
        raise ValueError(f"speculative_token_map {path}: expected a 1-D tensor of token ids below {vocab_size}")
    return hot


def _cut_head(head: ParallelLMHead, token_map: str) -> ParallelLMHead:
    """The target's LM head with only the hot tokens' rows (SGLang's head.data[hot_token_id])."""
    hot = _load_token_map(token_map, head.org_vocab_size).to(head.weight.device)
    rows = weight_rows(head.weight.data, hot)  # a new tensor, whether the weight is plain or packed
    cut = ParallelLMHead(len(hot), rows.shape[1])
    cut.weight = torch.nn.Parameter(rows, requires_grad=False)
    cut.process_weights_after_loading()
    return cut
