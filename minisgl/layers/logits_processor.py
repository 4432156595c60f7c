"""From the last hidden states to logits, keeping what side outputs need.

Mirrors python/sglang/srt/layers/logits_processor.py (LogitsProcessor.forward,
_get_pruned_states, _get_hidden_states_to_store, _get_logits,
LogitsProcessorOutput). In an extend batch only each request's last position
predicts a token, so the states are pruned to those rows before the LM head,
unless the batch asked for prompt logprobs. Hidden states are kept only as the
batch's CaptureHiddenMode says: that is the whole cost of the side output.
SGLang also handles multi-item scoring, dLLM and DP-attention gathers; omitted.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import nn

from minisgl import tracing
from minisgl.distributed.parallel_state import tensor_model_parallel_all_gather
from minisgl.layers.linear import apply_linear


@dataclasses.dataclass
class LogitsProcessorOutput:
    # [bs, vocab]: the logits each request samples its next token from
    next_token_logits: torch.Tensor
    # Input to the LM head, per CaptureHiddenMode: [bs, hidden] (LAST) or [num_tokens, hidden] (FULL)
    hidden_states: Optional[torch.Tensor] = None

    # Filled by the Sampler when the batch returns logprobs.
    next_token_logprobs: Optional[torch.Tensor] = None  # [bs]
    next_token_top_logprobs_val: Optional[list[list[float]]] = None
    next_token_top_logprobs_idx: Optional[list[list[int]]] = None
    next_token_token_ids_logprobs_val: Optional[list[list[float]]] = None
    next_token_token_ids_logprobs_idx: Optional[list[list[int]]] = None

    # Prompt logprobs (extend batches only), one list per request, aligned with
    # the prompt positions [logprob_start_len, prompt_len) of this chunk.
    input_token_logprobs: Optional[list[list[float]]] = None
    input_top_logprobs_val: Optional[list[list[list[float]]]] = None
    input_top_logprobs_idx: Optional[list[list[list[int]]]] = None
    input_token_ids_logprobs_val: Optional[list[list[list[float]]]] = None
    input_token_ids_logprobs_idx: Optional[list[list[list[int]]]] = None


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(
        self, input_ids, hidden_states, lm_head, forward_batch, aux_hidden_states=None
    ) -> LogitsProcessorOutput:
        # hidden_states: [num_tokens, hidden], already final-normed (the LM head's input)
        mode = forward_batch.forward_mode
        if mode.is_decode() or mode.is_target_verify():
            # Verification scores every drafted position, not only each request's last.
            pruned = hidden_states
            last_index = None
        else:
            # Each request's last token; from where its run starts, not a running sum, because
            # an EAGLE head's compiled draft extend gives every request the same rows, its tokens
            # first (graph_runner.py).
            last_index = forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1
            pruned = hidden_states[last_index]
        output = LogitsProcessorOutput(next_token_logits=self._get_logits(pruned, lm_head))

        capture = forward_batch.capture_hidden_mode
        if capture.need_capture():
            tracing.point("LogitsProcessor.capture_hidden_states", mode=capture.name)
            output.hidden_states = hidden_states if capture.is_full() else pruned
            if aux_hidden_states is not None:
                # EAGLE3: the draft reads the target's layer inputs instead (aux_hidden_states.py).
                aux = torch.cat(aux_hidden_states, dim=-1)
                output.hidden_states = aux if capture.is_full() or last_index is None else aux[last_index]

        if forward_batch.return_logprob and mode.is_extend():
            self._process_input_logprobs(output, input_ids, hidden_states, lm_head, forward_batch)
        return output

    def _get_logits(self, hidden_states: torch.Tensor, lm_head) -> torch.Tensor:
        if lm_head.quant_method is not None:  # as SGLang: a quantized head multiplies its own way
            logits = lm_head.quant_method.apply(lm_head, hidden_states)
        else:
            logits = apply_linear(hidden_states, lm_head.gemm_weight)
        logits = tensor_model_parallel_all_gather(logits)
        return logits[:, : self.vocab_size]

    def _process_input_logprobs(self, output, input_ids, hidden_states, lm_head, forward_batch) -> None:
        """Logprob of each prompt token given the tokens before it (position 0 has none)."""
        per_req = {k: [] for k in ("tok", "top_val", "top_idx", "ids_val", "ids_idx")}
        start = 0
        for i, extend_len in enumerate(forward_batch.extend_seq_lens_cpu):
            prefix_len = forward_batch.extend_prefix_lens_cpu[i]
            logprob_start = max(forward_batch.extend_logprob_start_lens_cpu[i], prefix_len)
            # Prompt position p is predicted by the state at p - 1. Rows p-1 outside this
            # chunk (p = prefix_len) come from the previous chunk, which predicted p there.
            first = max(logprob_start, prefix_len + 1)
            # A chunk that ends before logprob_start has no row to score (an empty range, not a reversed one).
            last = max(first - 1, prefix_len + extend_len - 1)
            rows = torch.arange(first - 1, last) - prefix_len + start
            targets = input_ids[rows + 1]
            logprobs = torch.log_softmax(self._get_logits(hidden_states[rows], lm_head).float(), dim=-1)
            lead = [None] * (first - logprob_start)  # position 0 of the prompt has no logprob
            per_req["tok"].append(lead + logprobs[torch.arange(len(rows)), targets].tolist())
            k = forward_batch.top_logprobs_nums[i]
            if k > 0:
                vals, idx = logprobs.topk(k, dim=-1)
                per_req["top_val"].append(lead + vals.tolist())
                per_req["top_idx"].append(lead + idx.tolist())
            else:
                per_req["top_val"].append(None)
                per_req["top_idx"].append(None)
            ids = forward_batch.token_ids_logprobs[i]
            if ids:
                per_req["ids_val"].append(lead + logprobs[:, ids].tolist())
                per_req["ids_idx"].append(lead + [list(ids)] * len(rows))
            else:
                per_req["ids_val"].append(None)
                per_req["ids_idx"].append(None)
            start += extend_len
        output.input_token_logprobs = per_req["tok"]
        output.input_top_logprobs_val = per_req["top_val"]
        output.input_top_logprobs_idx = per_req["top_idx"]
        output.input_token_ids_logprobs_val = per_req["ids_val"]
        output.input_token_ids_logprobs_idx = per_req["ids_idx"]
