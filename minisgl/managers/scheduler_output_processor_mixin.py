"""SchedulerOutputProcessorMixin: what the scheduler does with a batch's result.

Mirrors python/sglang/srt/managers/scheduler_output_processor_mixin.py
(process_batch_result_prefill / _decode, the side-output bookkeeping, and the
meta_info that stream_output sends). For every request of the batch it appends the
new tokens (several after a speculative round), checks whether the request has
finished, records logprobs and hidden states, publishes prefilled KV to the radix
cache, and queues one ReqOutput. SGLang sends those to its detokenizer process;
minisgl's scheduler hands them to whoever stepped it. Omitted: embeddings,
disaggregation, the metrics collector.
"""

from __future__ import annotations

import itertools
from typing import Optional

from minisgl.managers.finish_reason import FINISH_ABORT, FINISH_LENGTH
from minisgl.managers.io_struct import ReqOutput
from minisgl.managers.schedule_batch import Req, ScheduleBatch
from minisgl.managers.tp_worker import GenerationBatchResult
from minisgl.speculative.spec_utils import release_kv

# Trailing tokens a stop_regex is matched against (SGLang bounds it by the pattern's longest match).
_STOP_REGEX_WINDOW = 64


class SchedulerOutputProcessorMixin:
    """Mixed into Scheduler; ``self`` is the Scheduler."""

    def process_batch_result(self, batch: ScheduleBatch, result: GenerationBatchResult) -> None:
        new_token_ids = _split_per_request(result)
        # The row of each request's first new token in the logprob fields: i, or after a
        # speculative round the tokens of the requests before it.
        first_rows = [0, *itertools.accumulate(len(ids) for ids in new_token_ids)]
        out = result.logits_output
        hidden_offset = 0
        still_running = []
        decoding = set(map(id, batch.decoding_reqs))  # a mixed batch's decode rows: no prompt to cache
        for i, req in enumerate(batch.reqs):
            if req.finished():
                continue  # overlap: it finished (or was aborted) after this batch was launched
            if batch.forward_mode.is_extend():
                # A mixed batch's decode rows too: one-token extends, their side outputs found alike.
                self._record_extend_side_outputs(req, out, i, hidden_offset, batch.prefix_lens[i], batch.seq_lens[i])
                hidden_offset += batch.extend_lens[i]
                if req.is_chunked:
                    # Not the whole prompt yet: no token; publish the chunk and come back first.
                    req.is_chunked = False
                    self.tree_cache.cache_unfinished_req(req)
                    self.waiting_queue.insert(0, req)
                    continue
            elif out.hidden_states is not None and req.return_hidden_states:
                req.hidden_states.append(out.hidden_states[i].tolist())
            new_ids = []
            if req.sampling_params.max_new_tokens == 0:
                req.finished_reason = FINISH_LENGTH(0)  # prefill only (e.g. to warm the cache)
            else:
                new_ids = self._append_output_ids(req, new_token_ids[i], out, first_rows[i])
            if result.accept_length_per_req_cpu is not None:
                self._account_spec_round(req, result.accept_length_per_req_cpu[i])
            if req.finished():
                self._finish(req, new_ids)
                continue
            if batch.forward_mode.is_extend() and id(req) not in decoding:
                self.tree_cache.cache_unfinished_req(req)
            self._emit(req, new_ids)
            still_running.append(req)
        batch.reqs = still_running

    def _append_output_ids(self, req: Req, token_ids: list[int], out, first_row: int) -> list[int]:
        """Append the step's tokens (several after a speculative round) up to the first that ends it."""
        appended = []
        for row, token_id in enumerate(token_ids, start=first_row):
            req.output_ids.append(token_id)
            appended.append(token_id)
            if req.grammar is not None and not req.grammar.accept_token(token_id):
                req.finished_reason = FINISH_ABORT(f"token {token_id} broke the request's grammar")
            if req.return_logprob:
                self._record_output_logprobs(req, out, row)
            req.check_finished(self._tail_text(req))
            if req.finished():
                break
        return appended

    def _account_spec_round(self, req: Req, num_accepted: int) -> None:
        req.spec_verify_ct += 1
        req.spec_accepted_tokens += num_accepted
        if req.kv_len > req.seqlen - 1:
            # It finished inside the accepted run: tokens it did not keep need no KV.
            release_kv(self.req_to_token_pool, self.token_to_kv_pool_allocator, req, req.seqlen - 1)

    def _record_extend_side_outputs(
        self, req: Req, out, i: int, row_offset: int, prefix_len: int, seq_len: int
    ) -> None:
        if req.return_logprob and out.input_token_logprobs is not None:
            req.input_token_logprobs += out.input_token_logprobs[i]
            if out.input_top_logprobs_val[i] is not None:
                req.input_top_logprobs_val += out.input_top_logprobs_val[i]
                req.input_top_logprobs_idx += out.input_top_logprobs_idx[i]
            if out.input_token_ids_logprobs_val[i] is not None:
                req.input_token_ids_logprobs_val += out.input_token_ids_logprobs_val[i]
                req.input_token_ids_logprobs_idx += out.input_token_ids_logprobs_idx[i]
        if req.return_hidden_states and out.hidden_states is not None:
            # Keep each position once: a retracted request re-prefills positions it already has.
            # (Not req.kv_len: under overlap the next decode has already taken a slot.)
            for pos in range(len(req.hidden_states), seq_len):
                req.hidden_states.append(out.hidden_states[row_offset + pos - prefix_len].tolist())

    @staticmethod
    def _record_output_logprobs(req: Req, out, row: int) -> None:
        req.output_token_logprobs.append(float(out.next_token_logprobs[row]))
        if out.next_token_top_logprobs_val is not None:
            req.output_top_logprobs_val.append(out.next_token_top_logprobs_val[row])
            req.output_top_logprobs_idx.append(out.next_token_top_logprobs_idx[row])
        if out.next_token_token_ids_logprobs_val is not None:
            req.output_token_ids_logprobs_val.append(out.next_token_token_ids_logprobs_val[row])
            req.output_token_ids_logprobs_idx.append(out.next_token_token_ids_logprobs_idx[row])

    def _tail_text(self, req: Req) -> Optional[str]:
        params = req.sampling_params
        stops = params.stop_strs
        if not (stops or params.stop_regex_strs) or self.tokenizer is None:
            return None
        # Enough trailing tokens to contain the longest stop string: a token is at least one
        # byte (byte-level BPE splits a multibyte character), so count bytes, not characters.
        # A regex has no length; it is matched on the last _STOP_REGEX_WINDOW tokens.
        n = max([len(s.encode()) + 1 for s in stops] + [_STOP_REGEX_WINDOW if params.stop_regex_strs else 0])
        return self.tokenizer.decode(req.output_ids[-n:])

    def _emit(self, req: Req, new_ids: list[int]) -> None:
        meta = self._build_meta_info(req) if req.finished() else None
        if meta is None and req.stream and req.return_logprob:
            # Before it finishes, a streamed request gets the logprobs of its new tokens (and, with
            # its first token, of the prompt); the front end accumulates them.
            first = len(new_ids) == len(req.output_ids)
            meta = _logprob_meta(req, len(req.output_ids) - len(new_ids), with_input=first)
        if meta is not None and req.spec_verify_ct > 0:
            meta.update(self._spec_meta_info(req))
        self.outputs.append(ReqOutput(req.rid, new_ids, req.finished(), meta))

    def _spec_meta_info(self, req: Req) -> dict:
        """SGLang's speculative metrics (its TokenizerManager computes them from the same counters)."""
        drafted = req.spec_verify_ct * self.server_args.speculative_num_steps
        return {
            "spec_verify_ct": req.spec_verify_ct,
            "spec_accept_token_num": req.spec_accepted_tokens,
            "spec_draft_token_num": drafted,
            "spec_accept_rate": req.spec_accepted_tokens / drafted,
            # Tokens per target forward (the first came from the prefill, as in SGLang).
            "spec_accept_length": len(req.output_ids) / req.spec_verify_ct,
        }

    @staticmethod
    def _build_meta_info(req: Req) -> dict:
        meta = {
            "id": req.rid,
            "prompt_tokens": len(req.origin_input_ids),
            "completion_tokens": len(req.output_ids),
            "finish_reason": req.finished_reason.to_json(),
            "cached_tokens": req.cached_tokens,
            "total_retractions": req.total_retractions,
        }
        if req.return_logprob:
            meta.update(_logprob_meta(req, 0, with_input=True))
        if req.return_hidden_states:
            meta["hidden_states"] = req.hidden_states
        if req.return_routed_experts and req.routed_experts is not None:
            meta["routed_experts"] = req.routed_experts
        return meta


def _logprob_meta(req: Req, out_start: int, with_input: bool) -> dict:
    """The logprobs of output tokens out_start.. (and of the prompt if with_input), in SGLang's
    shape: (logprob, token_id, text); text is filled by the front end if asked."""
    meta = {
        "output_token_logprobs": [
            (lp, t, None) for lp, t in zip(req.output_token_logprobs[out_start:], req.output_ids[out_start:])
        ],
        "output_top_logprobs": _zip_top(
            req.output_top_logprobs_val[out_start:], req.output_top_logprobs_idx[out_start:]
        ),
        "output_token_ids_logprobs": _zip_top(
            req.output_token_ids_logprobs_val[out_start:], req.output_token_ids_logprobs_idx[out_start:]
        ),
    }
    if with_input:
        prompt_ids = req.origin_input_ids[req.logprob_start_len :]
        meta["input_token_logprobs"] = [(lp, t, None) for lp, t in zip(req.input_token_logprobs, prompt_ids)]
        meta["input_top_logprobs"] = _zip_top(req.input_top_logprobs_val, req.input_top_logprobs_idx)
        meta["input_token_ids_logprobs"] = _zip_top(req.input_token_ids_logprobs_val, req.input_token_ids_logprobs_idx)
    return meta


def _split_per_request(result: GenerationBatchResult) -> list[list[int]]:
    """The new tokens of each request: one, or after a speculative round n + 1 for n accepted drafts."""
    flat = result.next_token_ids.tolist()
    if result.accept_length_per_req_cpu is None:
        return [[t] for t in flat]
    out, start = [], 0
    for n in result.accept_length_per_req_cpu:
        out.append(flat[start : start + n + 1])
        start += n + 1
    return out


def _zip_top(vals: list, idxs: list) -> list:
    return [None if v is None else [(lp, t, None) for lp, t in zip(v, i)] for v, i in zip(vals, idxs)]
