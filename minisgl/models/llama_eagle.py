"""LlamaForCausalLMEagle: the EAGLE (EAGLE-1/2) draft head of a Llama-family target.

Mirrors python/sglang/srt/models/llama_eagle.py (LlamaDecoderLayer without the first
input_layernorm, LlamaModel with ``fc``, LlamaForCausalLMEagle with set_embed_and_head).
One position: h = fc([embed(token), feature]); the decoder layers over the draft's own KV;
the output is hidden + residual, with no final norm, and the target's LM head reads it.
The feature is the target's final hidden state (what its LM head read) at the first draft
step and the draft's own output afterwards; the worker passes it in
``forward_batch.spec_info.hidden_states`` (speculative/eagle_info.py). The head has no
embedding or LM head of its own: the worker shares the target's (set_embed_and_head),
cut to the hot tokens when --speculative-token-map gives some.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from minisgl.layers.linear import ReplicatedLinear
from minisgl.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from minisgl.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class LlamaDecoderLayerEagle(LlamaDecoderLayer):
    def __init__(self, config, layer_id: int) -> None:
        super().__init__(config, layer_id)
        if layer_id == 0:
            self.input_layernorm = nn.Identity()  # fc's output enters the first layer unnormalized


class LlamaModelEagle(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embed_tokens: nn.Module | None = None  # the target's (set_embed_and_head)
        self.fc = ReplicatedLinear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layers = nn.ModuleList([LlamaDecoderLayerEagle(config, i) for i in range(config.num_hidden_layers)])
        # One pipeline stage holds the whole head (speculation is refused with pp_size > 1);
        # LlamaForCausalLM.load_weights reads the stage's bounds.
        self.start_layer, self.end_layer = 0, config.num_hidden_layers
        self.is_first_rank = self.is_last_rank = True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids)
        hidden_states = self.fc(torch.cat([embeds, forward_batch.spec_info.hidden_states.to(embeds.dtype)], dim=-1))
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, forward_batch, residual)
        return hidden_states + residual


class LlamaForCausalLMEagle(LlamaForCausalLM):
    def __init__(self, config) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.model = LlamaModelEagle(config)
        self.lm_head: nn.Module | None = None  # the target's (set_embed_and_head)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch) -> LogitsProcessorOutput:
        hidden_states = self.model(input_ids, positions, forward_batch)
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch)

    def set_embed_and_head(self, embed: nn.Module, head: nn.Module) -> None:
        self.model.embed_tokens, self.lm_head = embed, head
        self.logits_processor = LogitsProcessor(head.org_vocab_size)  # the hot tokens' count when cut

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # The checkpoint names fc and layers.* at the top level; an embedding or LM head in it
        # is ignored, as SGLang does: the target's are shared.
        shared = ("embed_tokens", "lm_head")
        return super().load_weights((f"model.{n}", w) for n, w in weights if not n.startswith(shared))


EntryClass = LlamaForCausalLMEagle
