"""Where each logical expert physically lives.

Mirrors python/sglang/srt/eplb/expert_location.py (ExpertLocationMetadata,
compute_initial_expert_location_metadata). With expert parallelism and EPLB,
SGLang replicates hot experts and maps logical ids to physical slots; minisgl
has no expert parallelism, so the map is the identity. It is still built
first in ModelRunner.initialize(), because the recorder counts per physical
expert and must know how many there are.
"""

from __future__ import annotations

import dataclasses

import torch

from minisgl import tracing


@dataclasses.dataclass
class ExpertLocationMetadata:
    num_layers: int
    num_logical_experts: int
    physical_to_logical_map: torch.Tensor  # [num_layers, num_physical_experts]

    @property
    def num_physical_experts(self) -> int:
        return self.physical_to_logical_map.shape[1]

    @staticmethod
    def init_trivial(num_layers: int, num_experts: int) -> "ExpertLocationMetadata":
        identity = torch.arange(num_experts).repeat(num_layers, 1)
        return ExpertLocationMetadata(num_layers, num_experts, identity)


@tracing.traced
def compute_initial_expert_location_metadata(num_layers: int, num_experts: int) -> ExpertLocationMetadata:
    """SGLang's function of this name reads an EPLB placement or falls back to the trivial one;
    minisgl has only the trivial one (logical expert i is physical expert i)."""
    return ExpertLocationMetadata.init_trivial(num_layers, num_experts)
