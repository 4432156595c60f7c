"""Why a request ended: the finish reasons a Req carries and a response reports.

Mirrors the FINISH_* classes of python/sglang/srt/managers/schedule_batch.py, which keeps them at
the top of that file; minisgl keeps them here so that schedule_batch.py stays under 400 lines.
``to_json`` is the ``finish_reason`` of meta_info, as SGLang spells it. Omitted: SGLang's
FINISHED_MATCHED_REGEX (a stop regex ends with FINISH_MATCHED_STR, whose JSON is the same), the
``is_error`` flag, and FINISH_ABORT's ``status_code`` and ``err_type``.
"""

from __future__ import annotations

from typing import Any


class BaseFinishReason:
    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError


class _FinishMatched(BaseFinishReason):
    """A stop matched; OpenAI's finish_reason calls every kind "stop"."""

    def __init__(self, matched: int | str) -> None:
        self.matched = matched

    def to_json(self):
        return {"type": "stop", "matched": self.matched}


class FINISH_MATCHED_TOKEN(_FinishMatched):
    """A stop token, EOS or a grammar's last token was sampled; ``matched`` is its id."""


class FINISH_MATCHED_STR(_FinishMatched):
    """A stop string or stop regex matched the text; ``matched`` is it."""


class FINISH_LENGTH(BaseFinishReason):
    def __init__(self, length: int) -> None:
        self.length = length

    def to_json(self):
        return {"type": "length", "length": self.length}


class FINISH_ABORT(BaseFinishReason):
    def __init__(self, message: str = "aborted") -> None:
        self.message = message

    def to_json(self):
        return {"type": "abort", "message": self.message}
