"""Tokenizer loading that never reaches for the network.

Mirrors get_tokenizer in python/sglang/srt/utils/hf_transformers_utils.py.
AutoTokenizer may pick a model-specific class from config.json's model_type
that expects files a converted or tiny checkpoint does not have; the folder's
tokenizer.json is the truth, so minisgl loads it as a PreTrainedTokenizerFast
when AutoTokenizer cannot.
"""

from __future__ import annotations

import os

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast


def get_tokenizer(tokenizer_path: str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True)
    except (ValueError, OSError, KeyError):
        if not os.path.exists(os.path.join(tokenizer_path, "tokenizer.json")):
            raise
        return PreTrainedTokenizerFast.from_pretrained(tokenizer_path, local_files_only=True)
