"""DecodeStatus and GenerateRun: incremental detokenization, with stop strings cut out, and result assembly.

Mirrors DecodeStatus and the per-request loop of
python/sglang/srt/managers/detokenizer_manager.py (_decode_batch_token_id_output,
trim_matched_stop). SGLang runs the detokenizer as its own process between the
scheduler and the tokenizer manager; minisgl's TokenizerManager hands each
scheduler output to a GenerateRun, which detokenizes it here and assembles the
result dicts.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

from minisgl.managers.io_struct import GenerateReqInput, ReqOutput, TokenizedGenerateReqInput


class DecodeStatus:
    """Incremental detokenization of one request, with its stop strings cut out.

    Mirrors DecodeStatus and the loop of DetokenizerManager._decode_batch_token_id_output.
    ``decode_ids[surr_offset:read_offset]`` is text already confirmed, decoded again only
    as context, because some tokenizers (SentencePiece's leading space) render a token
    differently at the start of a string. The text after ``read_offset`` is confirmed once
    it no longer ends in U+FFFD, the mark of a UTF-8 character cut between tokens. Beyond
    SGLang, ``update`` withholds a tail that could still grow into a stop string, so a
    stream never shows text that a stop string would later take back.
    """

    def __init__(self, tokenizer, stop_strs: list[str] = (), skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.stop_strs = list(stop_strs)
        self.skip_special_tokens = skip_special_tokens
        self.decode_ids: list[int] = []
        self.decoded_text = ""  # the text of decode_ids[:read_offset]
        self.surr_offset = 0
        self.read_offset = 0
        self.sent_offset = 0  # characters of the output text already returned by update()
        self.matched_stop: Optional[str] = None  # the stop string that ended the text, once found

    def update(self, new_ids: list[int], finish_reason: Optional[dict] = None) -> str:
        """Take the request's newest tokens; return the text that may be sent now."""
        self.decode_ids.extend(new_ids)
        finished = finish_reason is not None
        read_ids = self.decode_ids[self.surr_offset :]
        if finished and isinstance(finish_reason.get("matched"), int):
            # A stop token ends the output but is not part of its text (SGLang's trim_matched_stop).
            read_ids = read_ids[:-1]
        surr_text = self._decode(self.decode_ids[self.surr_offset : self.read_offset])
        new_text = self._decode(read_ids)[len(surr_text) :]
        if not finished:
            if new_text and not new_text.endswith("\ufffd"):
                self.decoded_text += new_text
                self.surr_offset, self.read_offset = self.read_offset, len(self.decode_ids)
            new_text = ""
        text = self.decoded_text + new_text

        # A stop string cannot start inside text already sent: that text never ends with
        # the beginning of one (see below), so the search starts at sent_offset.
        hits = [(pos, s) for s in self.stop_strs if (pos := text.find(s, self.sent_offset)) >= 0]
        if hits:
            stop_pos, self.matched_stop = min(hits)
            text = text[:stop_pos]
        elif not finished:
            text = text[: len(text) - _stop_prefix_len(text, self.stop_strs)]
        delta = text[self.sent_offset :]
        self.sent_offset = len(text)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)


def _stop_prefix_len(text: str, stop_strs: list[str]) -> int:
    """Length of the longest end of ``text`` that is the beginning of a stop string."""
    longest = 0
    for stop in stop_strs:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


class GenerateRun:
    """One generate call: its requests, their detokenizers, and what has come back so far.

    The result assembly of SGLang's TokenizerManager (_handle_batch_output, _wait_one_response):
    each scheduler output becomes a chunk with the new text, and a non-streaming call gets the
    whole text, ids and meta_info of every request at the end."""

    def __init__(
        self,
        tokenizer,
        obj: GenerateReqInput,
        reqs: list[TokenizedGenerateReqInput],
        abort_request: Callable[[str], None],
    ) -> None:
        self.abort_request = abort_request
        self.reqs = reqs
        self.single = obj.is_single
        self.stream = obj.stream
        self.pending = {r.rid: i for i, r in enumerate(reqs)}
        self.statuses = [
            DecodeStatus(tokenizer, r.sampling_params.stop_strs, r.sampling_params.skip_special_tokens)
            for r in reqs
        ]
        self.texts = [""] * len(reqs)
        self.output_ids: list[list[int]] = [[] for _ in reqs]
        self.metas: list[Optional[dict]] = [None] * len(reqs)

    def on_output(self, out: ReqOutput) -> Optional[dict]:
        """Take one scheduler output; return the chunk to stream, if streaming."""
        i = self.pending.get(out.rid)
        if i is None:
            return None  # a late output of a request its stop string already ended
        chunk = self._process_output(self.reqs[i], self.statuses[i], out)
        if chunk["meta_info"]["finish_reason"] is not None:
            del self.pending[out.rid]
        self.texts[i] += chunk["text"]
        self.output_ids[i] += chunk["output_ids"]
        self.metas[i] = chunk["meta_info"]
        if not self.single:
            chunk["index"] = i
        return chunk if self.stream else None

    def result(self) -> Union[dict, list[dict]]:
        results = [{"text": t, "output_ids": ids, "meta_info": m} for t, ids, m in zip(self.texts, self.output_ids, self.metas)]
        if self.single:
            return results[0]
        for i, result in enumerate(results):
            result["index"] = i
        return results

    def _process_output(self, req: TokenizedGenerateReqInput, status: DecodeStatus, out: ReqOutput) -> dict:
        finish_reason = out.meta_info["finish_reason"] if out.finished else None
        text = status.update(out.new_output_ids, finish_reason)
        meta = out.meta_info if out.finished else {
            "id": req.rid,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(status.decode_ids),
            "finish_reason": None,
        }
        if status.matched_stop is not None and (meta["finish_reason"] or {}).get("matched") != status.matched_stop:
            # The scheduler checks stop strings on a window of trailing tokens, which a
            # multi-byte stop string can outrun; the text has one, so the request ends here.
            meta = {**meta, "finish_reason": {"type": "stop", "matched": status.matched_stop}}
            if not out.finished:
                self.abort_request(req.rid)
        return {"text": text, "output_ids": list(out.new_output_ids), "meta_info": meta}
