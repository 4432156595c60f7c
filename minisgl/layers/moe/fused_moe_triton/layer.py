"""FusedMoE: all experts' weights in two stacked tensors, and the routed compute.

Mirrors python/sglang/srt/layers/moe/fused_moe_triton/layer.py (FusedMoE with
its per-expert weight_loader). Checkpoints store experts one matrix at a time
(``experts.{e}.gate_proj``); the loader stacks them as w13 [E, 2I, H] and
w2 [E, H, I] so a grouped kernel can run them all. Under tensor parallelism
each rank keeps a slice of every expert's intermediate dimension. The weights and the
expert compute come from ``quant_method`` (a FusedMoEMethodBase: UnquantizedFusedMoEMethod
runs the Triton kernel on a GPU, the per-expert loop on a CPU). SGLang also has expert
parallelism and many MoE runners; omitted.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from minisgl.eplb.expert_distribution import get_global_expert_distribution_recorder
from minisgl.layers.moe.topk import TopKConfig, select_experts
from minisgl.layers.quantization.base_config import FROM_LOADER, resolve_quant_config
from minisgl.layers.quantization.unquant import UnquantizedFusedMoEMethod


class FusedMoE(nn.Module):
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        layer_id: int,
        renormalize: bool = True,
        num_expert_group: int | None = None,
        topk_group: int | None = None,
        correction_bias: torch.Tensor | None = None,
        quant_config=FROM_LOADER,
    ) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        assert intermediate_size % self.tp_size == 0
        self.num_experts = num_experts
        self.top_k = top_k
        self.layer_id = layer_id
        # Grouped routing (DeepSeek) when the model names expert groups; see topk.py.
        self.topk_config = TopKConfig(
            top_k=top_k,
            renormalize=renormalize,
            use_grouped_topk=num_expert_group is not None,
            num_expert_group=num_expert_group,
            topk_group=topk_group,
            correction_bias=correction_bias,
        )
        self.intermediate_size_per_partition = intermediate_size // self.tp_size
        quant_config = resolve_quant_config(quant_config)
        self.quant_method = quant_config.get_quant_method(self) if quant_config is not None else None
        self.quant_method = self.quant_method or UnquantizedFusedMoEMethod()
        self.quant_method.create_weights(
            self,
            num_experts,
            hidden_size,
            self.intermediate_size_per_partition,
            torch.get_default_dtype(),
            weight_loader=self.weight_loader,
        )

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str, expert_id: int) -> None:
        inter = self.intermediate_size_per_partition
        if shard_id == "w2":  # down_proj [H, I]: split the input dimension (not a scale's [H, 1])
            # This rank's share is the parameter's own width: I / tp weights, or the bytes of that
            # many weights where GGUF holds them in blocks (GGUFMoEMethod; whole blocks per rank).
            width = param.shape[2]
            split = loaded_weight.shape[1] != width
            param.data[expert_id].copy_(
                loaded_weight.narrow(1, self.tp_rank * width, width) if split else loaded_weight
            )
            return
        offset = 0 if shard_id == "w1" else inter  # w1 = gate_proj, w3 = up_proj
        local = loaded_weight.narrow(0, self.tp_rank * inter, inter)
        param.data[expert_id].narrow(0, offset, inter).copy_(local)

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        with get_global_expert_distribution_recorder().with_current_layer(self.layer_id):
            topk_weights, topk_ids = select_experts(router_logits, self.topk_config, self.layer_id)
        out = self.quant_method.apply(self, hidden_states, topk_weights, topk_ids)
        return tensor_model_parallel_all_reduce(out)

    def process_weights_after_loading(self) -> None:
        self.quant_method.process_weights_after_loading(self)

    @staticmethod
    def make_expert_params_mapping(num_experts: int, gate: str, down: str, up: str) -> list[tuple[str, str, int, str]]:
        """(param prefix, checkpoint prefix, expert id, shard id) for every expert matrix: a checkpoint
        tensor ``...experts.3.gate_proj.weight`` (or ``.weight_scale``) loads ``...experts.w13_weight``
        (or ``w13_weight_scale``) as shard w1 of expert 3."""
        return [
            (param, f"experts.{e}.{ckpt}.", e, shard)
            for e in range(num_experts)
            for param, ckpt, shard in (
                ("experts.w13_", gate, "w1"),
                ("experts.w2_", down, "w2"),
                ("experts.w13_", up, "w3"),
            )
        ]
