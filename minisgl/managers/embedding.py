"""Embeddings: a prompt's final hidden states, pooled (last token, mean or first token) and normalized.

Mirrors python/sglang/srt/layers/pooler.py (Pooler: PoolingType LAST and CLS, normalize)
and the embedding path of tokenizer_manager.py (EmbeddingReqInput in, ``embedding`` and
``meta_info`` out). How to pool is read as sentence-transformers saves it with a model
(modules.json, 1_Pooling/config.json, a Normalize module); a decoder without that file
gets SGLang's choice for one (gte-Qwen2, Llama embeddings): the last token, normalized.
SGLang runs embedding models through a forward mode of their own, which stops at the
final norm; minisgl runs the prompt as a one-token generation with its hidden states
captured (the LM head's input, already final-normed) and pools those, so one throwaway
token is sampled per prompt. Mean pooling is minisgl's addition (SGLang 0.5.9 has LAST
and CLS); ``dimensions`` (Matryoshka truncation) is omitted.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import TYPE_CHECKING, Union

import torch

from minisgl.managers.io_struct import GenerateReqInput

if TYPE_CHECKING:
    from minisgl.managers.tokenizer_manager import TokenizerManager

POOLING_TYPES = ("last", "mean", "cls")


@dataclasses.dataclass(frozen=True)
class PoolingConfig:
    pooling_type: str = "last"
    normalize: bool = True

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def from_model_path(model_path: str) -> "PoolingConfig":
        root = pathlib.Path(model_path)
        modules_file = root / "modules.json"
        if not modules_file.is_file():
            return PoolingConfig()
        modules = json.loads(modules_file.read_text())
        normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
        pooling = next((m for m in modules if m.get("type", "").endswith("Pooling")), None)
        if pooling is None:
            return PoolingConfig(normalize=normalize)
        config = json.loads((root / pooling.get("path", "1_Pooling") / "config.json").read_text())
        chosen = [kind for kind, key in _POOLING_KEYS.items() if config.get(key)]
        if len(chosen) != 1:
            modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode") and v)
            raise ValueError(f"the model's pooling config asks for {modes}; minisgl pools one of {POOLING_TYPES}")
        return PoolingConfig(chosen[0], normalize)

    def pool(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[prompt_len, hidden] -> [hidden]."""
        if self.pooling_type == "last":
            pooled = hidden_states[-1]
        elif self.pooling_type == "cls":
            pooled = hidden_states[0]
        else:
            pooled = hidden_states.mean(dim=0)
        return torch.nn.functional.normalize(pooled, p=2, dim=-1) if self.normalize else pooled


_POOLING_KEYS = {"last": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}


async def encode(tm: "TokenizerManager", prompt: Union[str, list[str], list[int], list[list[int]]]) -> list[dict]:
    """One ``{"embedding": [...], "meta_info": {...}}`` per prompt (text, or token ids), in order."""
    if not tm.server_args.is_embedding:
        raise ValueError("embeddings need the server (or Engine) started with --is-embedding")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("input must be a string, a list of strings, a list of token ids, or a list of those")
    texts = [p for p in prompt if isinstance(p, str)]
    if texts and len(texts) != len(prompt):
        raise ValueError("input must be all strings or all token-id lists")
    # max_new_tokens 1: the prompt's one forward pass; the token it samples is thrown away.
    params = {"max_new_tokens": 1, "temperature": 0.0}
    obj = GenerateReqInput(
        text=prompt if texts else None,
        input_ids=None if texts else prompt,
        sampling_params=params,
        return_hidden_states=True,
    )
    results = await anext(tm.generate_request(obj))
    config = PoolingConfig.from_model_path(tm.model_config.model_path)
    out = []
    for result in results if isinstance(results, list) else [results]:
        meta = result["meta_info"]
        hidden = torch.tensor(meta.pop("hidden_states")[: meta["prompt_tokens"]], dtype=torch.float32)
        meta["completion_tokens"] = 0  # the throwaway token is no output
        out.append({"embedding": config.pool(hidden).tolist(), "meta_info": meta})
    return out
