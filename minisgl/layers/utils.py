"""Building a model for one pipeline stage: its slice of the layers, placeholders for the rest,
and PPProxyTensors, what a stage hands the next instead of logits.

Mirrors PPMissingLayer and get_layer_id (python/sglang/srt/layers/utils/common.py) and make_layers
(python/sglang/srt/utils/common.py:621). A stage builds only the decoder layers [start_layer,
end_layer) (get_pp_indices), and a parameterless PPMissingLayer everywhere else, so the layer
list keeps its checkpoint indices (``model.layers.7`` is still ``self.layers[7]``) while the
stage allocates, loads and caches nothing for the layers it does not run. SGLang's make_layers
also wraps layers for CPU offloading; omitted. SGLang keeps PPProxyTensors in
model_executor/forward_batch_info.py:978; minisgl's models may not import model_executor
(claim C10), so it lives here, beside the other pieces a model needs to be a stage.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

import torch
from torch import nn

from minisgl.distributed.parallel_state import get_pipeline_model_parallel_rank, get_pipeline_model_parallel_world_size
from minisgl.distributed.utils import get_pp_indices


class PPProxyTensors:
    """The hidden states and residual after a stage's last layer, named, as the next stage receives them.

    Mirrors PPProxyTensors (forward_batch_info.py:978, adapted from vLLM's IntermediateTensors).
    The residual travels too because each layer's input RMSNorm fuses the residual add (SGLang's
    models/llama.py has a FIXME about the same cost). Omitted: slicing by a Python slice."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors  # {"hidden_states": [num_tokens, hidden], "residual": [num_tokens, hidden]}

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __repr__(self) -> str:
        return f"PPProxyTensors({ {k: tuple(v.shape) for k, v in self.tensors.items()} })"


class PPMissingLayer(nn.Identity):
    """A layer another pipeline stage holds: no parameters, and it returns its input unchanged."""


def make_layers(num_hidden_layers: int, layer_fn: Callable[[int], nn.Module]) -> tuple[nn.ModuleList, int, int]:
    """This stage's decoder layers, placeholders elsewhere, and the stage's [start_layer, end_layer)."""
    start, end = get_pp_indices(
        num_hidden_layers, get_pipeline_model_parallel_rank(), get_pipeline_model_parallel_world_size()
    )
    layers = [layer_fn(i) if start <= i < end else PPMissingLayer() for i in range(num_hidden_layers)]
    return nn.ModuleList(layers), start, end


def get_layer_id(weight_name: str) -> Optional[int]:
    """The decoder-layer index in a checkpoint name (``model.layers.7.mlp...`` -> 7), or None."""
    match = re.search(r"layers\.(\d+)\.", weight_name)
    return int(match.group(1)) if match else None
