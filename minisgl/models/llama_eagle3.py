"""LlamaForCausalLMEagle3: the EAGLE3 draft head, reading three of the target's layers.

Mirrors python/sglang/srt/models/llama_eagle3.py (LlamaDecoderLayer with hidden_norm and a
2H-wide attention input, LlamaModel with fc and midlayer, LlamaForCausalLMEagle3 with d2t).
The feature at the first draft step is the concatenation of the hidden states entering
three target layers (layers/aux_hidden_states.py), 3H wide, which ``fc`` folds to H; at
later steps it is the draft's own residual stream (H wide, fc skipped). One layer:
x = [input_layernorm(embed(token)), hidden_norm(feature)] -> attention -> MLP, then the
final norm gives the LM head's input and the next step's feature. The head has its own,
smaller vocabulary: draft index i is target token i + d2t[i] (hot_token_id below). Only
the embedding is the target's (set_embed). SGLang also loads an LM head from the target
when the checkpoint has none; omitted.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from minisgl.layers.layernorm import RMSNorm
from minisgl.layers.linear import QKVParallelLinear, ReplicatedLinear
from minisgl.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from minisgl.layers.vocab_parallel_embedding import ParallelLMHead
from minisgl.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class LlamaDecoderLayerEagle3(LlamaDecoderLayer):
    def __init__(self, config, layer_id: int) -> None:
        super().__init__(config, layer_id)
        attn = self.self_attn
        # Attention reads [embedding, feature]: twice the hidden size.
        attn.qkv_proj = QKVParallelLinear(
            2 * config.hidden_size, attn.head_dim, attn.total_num_heads, attn.total_num_kv_heads
        )
        self.hidden_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, embeds, hidden_states, forward_batch) -> tuple[torch.Tensor, torch.Tensor]:
        residual = hidden_states
        hidden_states = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden_states)], dim=-1)
        hidden_states = self.self_attn(positions, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModelEagle3(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        target_hidden = getattr(config, "target_hidden_size", None) or config.hidden_size
        self.embed_tokens: nn.Module | None = None  # the target's (set_embed)
        self.fc = ReplicatedLinear(3 * target_hidden, config.hidden_size, bias=False)
        self.midlayer = LlamaDecoderLayerEagle3(config, 0)
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # One pipeline stage holds the whole head (speculation is refused with pp_size > 1).
        self.start_layer, self.end_layer = 0, 1
        self.is_first_rank = self.is_last_rank = True

    def forward(self, input_ids, positions, forward_batch) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = self.embed_tokens(input_ids)
        hidden_states = forward_batch.spec_info.hidden_states.to(embeds.dtype)
        if hidden_states.shape[-1] != embeds.shape[-1]:
            hidden_states = self.fc(hidden_states)  # the target's three layers, at the first step
        hidden_states, residual = self.midlayer(positions, embeds, hidden_states, forward_batch)
        to_logits, to_aux = self.norm(hidden_states, residual)
        return to_logits, to_aux


class LlamaForCausalLMEagle3(LlamaForCausalLM):
    def __init__(self, config) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.model = LlamaModelEagle3(config)
        draft_vocab = getattr(config, "draft_vocab_size", None) or config.vocab_size
        self.lm_head = ParallelLMHead(draft_vocab, config.hidden_size)
        self.logits_processor = LogitsProcessor(draft_vocab)
        # d2t[i]: target token of draft index i, minus i (the checkpoint's offsets).
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.int64), persistent=False)

    @property
    def hot_token_id(self) -> torch.Tensor:
        """Draft index -> target token id."""
        return self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch) -> LogitsProcessorOutput:
        to_logits, to_aux = self.model(input_ids, positions, forward_batch)
        # The stored hidden state (the next step's feature) is the residual stream, not the normed one.
        return self.logits_processor(input_ids, to_logits, self.lm_head, forward_batch, [to_aux])

    def set_embed(self, embed: nn.Module) -> None:
        self.model.embed_tokens = embed

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def renamed():
            for name, tensor in weights:
                if name == "d2t":
                    self.d2t.copy_(tensor)
                elif name == "t2d" or name.startswith("embed_tokens"):
                    continue  # t2d is d2t's inverse; the embedding is the target's
                else:
                    yield (name if name.startswith("lm_head") else f"model.{name}"), tensor

        return super().load_weights(renamed())


EntryClass = LlamaForCausalLMEagle3
