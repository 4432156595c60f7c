"""MultiLayerEagleWorker: EAGLE with one draft ModelRunner per draft step (--enable-multi-layer-eagle).

Mirrors python/sglang/srt/speculative/multi_layer_eagle_worker.py (forward_draft_extend,
draft, mtp_model_runner) and the runner list of managers/tp_worker.py:349-373
(_init_multi_layer_eagle_model_runners). ``model_runner_list[k]`` drafts step k: each runner
has its own model, one layer of the draft checkpoint (``draft_model_idx``; a one-layer head
serves every step), and its own KV pool, while all of them, like the target, take their slots
from one req_to_token_pool and one allocator. This is how SGLang runs multi-token-prediction
heads (MiMo, Step3.5), whose k-th layer predicts k + 1 tokens ahead.

The round is a chain (topk 1) drafted inside the draft extend: runner k extends the verified
positions with the tokens shifted by k + 1 (runner k - 1's last prediction appended), so each
runner's KV covers every position and its last prediction is step k's draft; draft() then
only lays the chain out for verify. SGLang's v2 worker overlaps this with scheduling and
captures CUDA graphs; omitted.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from minisgl.managers.schedule_batch import ModelWorkerBatch
from minisgl.model_executor.model_runner import ModelRunner
from minisgl.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from minisgl.speculative.eagle_utils import build_tree_kernel_efficient
from minisgl.speculative.eagle_worker import EAGLEWorker

if TYPE_CHECKING:
    from minisgl.managers.schedule_batch import ScheduleBatch


class MultiLayerEagleWorker(EAGLEWorker):
    def _init_model_runner(self, req_to_token_pool, token_to_kv_pool_allocator) -> None:
        """SGLang's _init_multi_layer_eagle_model_runners: speculative_num_steps runners, one pool."""
        num_layers = self.model_config.num_hidden_layers
        self.model_runner_list = [
            ModelRunner(
                model_config=self.model_config,
                server_args=self.server_args,
                tp_rank=self.tp_rank,
                tp_size=self.tp_size,
                is_draft_worker=True,
                req_to_token_pool=req_to_token_pool,
                token_to_kv_pool_allocator=token_to_kv_pool_allocator,
                draft_model_idx=step % num_layers,
            )
            for step in range(self.server_args.speculative_num_steps)
        ]
        self._model_runner = self.model_runner_list[0]

    def draft_models(self) -> list:
        return [runner.model for runner in self.model_runner_list]

    def init_draft_extend_graph(self) -> None:
        """None: every runner's draft extend runs eagerly (run_draft_extend below)."""
        return None

    def mtp_model_runner(self, step: int) -> ModelRunner:
        return self.model_runner_list[step]

    def run_draft_extend(self, batch: ModelWorkerBatch) -> EagleDraftInput:
        """Every runner extends the verified positions; runner k's last top-1 is draft step k."""
        input_ids, topk_p, topk_index = list(batch.input_ids), [], []
        for step in range(self.speculative_num_steps):
            out = self._forward(self.mtp_model_runner(step), dataclasses.replace(batch, input_ids=input_ids))
            p, token = self.draft_topk(out)
            topk_p.append(p)
            topk_index.append(token)
            input_ids = _shift(input_ids, batch.extend_seq_lens, token[:, 0].tolist())
        return EagleDraftInput(
            hidden_states=out.hidden_states, topk_p=torch.cat(topk_p, dim=1), topk_index=torch.cat(topk_index, dim=1)
        )

    def draft(self, batch: "ScheduleBatch", model_worker_batch: ModelWorkerBatch) -> EagleVerifyInput:
        """The chain the last draft extend drafted, as a tree of one branch."""
        bs, k = len(batch.reqs), self.speculative_num_steps
        prefix_lens = [s - self.num_slots_per_round for s in model_worker_batch.seq_lens]
        drafts = EagleDraftInput.from_reqs(batch.reqs).topk_index  # [bs, k]
        verified_id = torch.as_tensor(model_worker_batch.input_ids, dtype=torch.int64, device=drafts.device)
        # Candidate j (step j) hangs from candidate j - 1: parent_list[j] = j - 1.
        chain = torch.arange(-1, k - 1).repeat(bs, 1)
        tree = build_tree_kernel_efficient(
            verified_id, chain, torch.arange(k).repeat(bs, 1), drafts, prefix_lens, 1, k + 1
        )
        tree["custom_mask"] = None
        return EagleVerifyInput(**tree, num_draft_tokens=k + 1)


def _shift(input_ids: list[int], extend_lens: list[int], appended: list[int]) -> list[int]:
    """Each request's tokens one further on: its first dropped, the new token appended."""
    out, start = [], 0
    for n, token in zip(extend_lens, appended):
        out += input_ids[start + 1 : start + n] + [token]
        start += n
    return out
