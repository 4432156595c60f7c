"""EAGLE3's auxiliary hidden states: what some of the target's layers read, kept for the draft.

Mirrors the capture in SGLang's models/llama.py (LlamaModel.forward's aux_hidden_states,
LlamaForCausalLM.set_eagle3_layers_to_capture); LogitsProcessor then stores their
concatenation as the batch's hidden states (layers/logits_processor.py). A model keeps one
line in its layer loop; the bookkeeping is here.
"""

from __future__ import annotations

from typing import Optional

import torch


def default_eagle3_layers(num_layers: int) -> list[int]:
    """SGLang's [2, n // 2, n - 3], clamped into the model so a tiny test model has three too."""
    return [min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)]


class AuxHiddenStates:
    """The hidden state entering each listed layer (hidden + residual, the residual stream)."""

    def __init__(self, layer_ids: list[int]) -> None:
        self.layer_ids = layer_ids
        self.captured: dict[int, torch.Tensor] = {}

    def capture(self, layer_id: int, hidden_states: torch.Tensor, residual: Optional[torch.Tensor]) -> None:
        if layer_id in self.layer_ids:
            self.captured[layer_id] = hidden_states if residual is None else hidden_states + residual

    def get(self) -> Optional[list[torch.Tensor]]:
        """In the listed order (a layer listed twice appears twice); None when nothing is captured."""
        return [self.captured[i] for i in self.layer_ids] if self.layer_ids else None
