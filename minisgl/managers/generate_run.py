"""GenerateRun: one generate call's requests, their detokenizers, and the chunks and results built from them.

Mirrors the output half of python/sglang/srt/managers/tokenizer_manager.py
(_handle_batch_output, convert_logprob_style, detokenize_logprob_tokens) with the
detokenizer's per-request DecodeStatus. A streamed chunk carries, as SGLang 0.5.9's do
(tokenizer_manager.py:1550-1566 in its wheel), the text and logprobs so far, and the
output ids so far, or only the new ids when the server runs with --stream-output. The
OpenAI routes ask for deltas of everything (``deltas=True``), which they stream as they
are. ``return_text_in_logprobs`` fills the text slot of every logprob tuple.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Union

from minisgl import tracing
from minisgl.managers.detokenizer_manager import DecodeStatus
from minisgl.managers.io_struct import GenerateReqInput, ReqOutput, TokenizedGenerateReqInput

_OUTPUT_LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")
_INPUT_LOGPROB_KEYS = ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs")


class GenerateRun:
    """What has come back so far for each request of one generate call. ``metrics`` is the
    server's MetricsCollectors (None when off); ``abort`` ends a request its stop string ended."""

    def __init__(
        self,
        tokenizer: Any,
        obj: GenerateReqInput,
        reqs: list[TokenizedGenerateReqInput],
        deltas: bool,
        id_deltas: bool,
        metrics: Optional[Any],
        abort: Callable[[str], None],
    ) -> None:
        self.tokenizer = tokenizer
        self.abort = abort
        self.reqs = reqs
        self.single = obj.is_single
        self.stream = obj.stream
        self.deltas = deltas  # text, ids and logprobs: only the new part (the OpenAI routes)
        self.id_deltas = id_deltas  # the ids alone (SGLang's --stream-output)
        self.text_in_logprobs = obj.return_text_in_logprobs
        self.created = time.time()  # SGLang's e2e_latency counts from here, the front door
        self.pending = {r.rid: i for i, r in enumerate(reqs)}
        self.statuses = [
            DecodeStatus(
                tokenizer,
                r.sampling_params.stop_strs,
                r.sampling_params.skip_special_tokens,
                r.sampling_params.spaces_between_special_tokens,
                r.sampling_params.no_stop_trim,
            )
            for r in reqs
        ]
        self.texts = [""] * len(reqs)
        self.output_ids: list[list[int]] = [[] for _ in reqs]
        self.metas: list[Optional[dict]] = [None] * len(reqs)
        # A streamed request's logprobs so far, accumulated from the scheduler's per-step ones.
        self.logprobs: list[dict[str, list]] = [{} for _ in reqs]
        # Per-request latency timers for --enable-metrics (metrics_collector.py); None when off.
        self.timers = [metrics.tokenizer.new_request_timer() for _ in reqs] if metrics is not None else None

    @tracing.traced(attrs=lambda self, out: {"tokens": len(out.new_output_ids)})
    def on_output(self, out: ReqOutput) -> Optional[dict]:
        """Take one scheduler output; return the chunk to stream, if streaming."""
        i = self.pending.get(out.rid)
        if i is None:
            return None  # a late output of a request its stop string already ended
        text, meta = self._process_output(self.reqs[i], self.statuses[i], out)
        if meta["finish_reason"] is not None:
            del self.pending[out.rid]
            meta["e2e_latency"] = time.time() - self.created
        self.texts[i] += text
        self.output_ids[i] += out.new_output_ids
        new_logprobs = self._take_logprobs(i, meta)
        self.metas[i] = meta
        if self.timers is not None:
            self.timers[i].on_output(len(out.new_output_ids), meta)
        if not self.stream:
            return None
        if self.deltas:
            chunk = {"text": text, "output_ids": list(out.new_output_ids), "meta_info": {**meta, **new_logprobs}}
        else:
            ids = out.new_output_ids if self.id_deltas else self.output_ids[i]
            chunk = {"text": self.texts[i], "output_ids": list(ids), "meta_info": dict(meta)}
        if not self.single:
            chunk["index"] = i
        return chunk

    def result(self) -> Union[dict, list[dict]]:
        results = [
            {"text": t, "output_ids": ids, "meta_info": m} for t, ids, m in zip(self.texts, self.output_ids, self.metas)
        ]
        if self.single:
            return results[0]
        for i, result in enumerate(results):
            result["index"] = i
        return results

    def _take_logprobs(self, i: int, meta: dict) -> dict[str, list]:
        """Fold this output's logprobs into request i's; put the lists so far into ``meta`` and
        return the new entries alone (what a --stream-output chunk carries)."""
        if not self.reqs[i].return_logprob:
            return {}
        seen = self.logprobs[i]
        new = {}
        for key in _OUTPUT_LOGPROB_KEYS + _INPUT_LOGPROB_KEYS:
            if key not in meta:
                continue
            values = self._with_text(meta[key])
            if meta["finish_reason"] is not None:
                # A finished request's meta_info holds the whole lists: the new part is past what was seen.
                new[key] = values[len(seen.get(key, [])) :]
                seen[key] = values
            else:
                new[key] = values
                seen[key] = seen.get(key, []) + values
        meta.update(seen)
        return new

    def _with_text(self, entries: list) -> list:
        if not self.text_in_logprobs:
            return entries
        return [self._tuples_with_text(e) if isinstance(e, list) else e for e in self._tuples_with_text(entries)]

    def _tuples_with_text(self, entries: list) -> list:
        """(logprob, token_id, None) -> (logprob, token_id, the token's text); SGLang's detokenize_logprob_tokens."""
        if not entries or not isinstance(entries[0], tuple):
            return entries
        texts = self.tokenizer.batch_decode([[t] for _, t, _ in entries])
        return [(lp, t, text) for (lp, t, _), text in zip(entries, texts)]

    def _process_output(self, req: TokenizedGenerateReqInput, status: DecodeStatus, out: ReqOutput) -> tuple[str, dict]:
        finish_reason = out.meta_info["finish_reason"] if out.finished else None
        text = status.update(out.new_output_ids, finish_reason)
        meta = (
            dict(out.meta_info)
            if out.finished
            else {
                "id": req.rid,
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(status.decode_ids),
                "finish_reason": None,
                **(out.meta_info or {}),  # a streamed request's per-step logprobs
            }
        )
        if status.matched_stop is not None and (meta["finish_reason"] or {}).get("matched") != status.matched_stop:
            # The scheduler checks stop strings on a window of trailing tokens, which a
            # multi-byte stop string can outrun; the text has one, so the request ends here.
            meta["finish_reason"] = {"type": "stop", "matched": status.matched_stop}
            if not out.finished:
                self.abort(req.rid)
        return text, meta
