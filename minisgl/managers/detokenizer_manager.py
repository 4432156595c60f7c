"""DecodeStatus: incremental detokenization of one request, with its stop strings cut out.

Mirrors DecodeStatus and the per-request loop of
python/sglang/srt/managers/detokenizer_manager.py (_decode_batch_token_id_output,
trim_matched_stop). SGLang runs the detokenizer as its own process between the
scheduler and the tokenizer manager; minisgl's GenerateRun (generate_run.py)
calls this class on each output as it arrives.
"""

from __future__ import annotations

from typing import Optional


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

    def __init__(
        self,
        tokenizer,
        stop_strs: list[str] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        no_stop_trim: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        # no_stop_trim keeps the stop string or token in the text (SGLang's trim_matched_stop).
        self.stop_strs = [] if no_stop_trim else list(stop_strs)
        self.no_stop_trim = no_stop_trim
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
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
        if finished and isinstance(finish_reason.get("matched"), int) and not self.no_stop_trim:
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
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )


def _stop_prefix_len(text: str, stop_strs: list[str]) -> int:
    """Length of the longest end of ``text`` that is the beginning of a stop string."""
    longest = 0
    for stop in stop_strs:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest
