"""Capture which experts routed each token, keyed by the token's KV slot.

Mirrors python/sglang/srt/layers/moe/routed_experts_capturer.py
(RoutedExpertsCapturer: capture, on_forward_end, get_routed_experts). During a
forward, ``select_experts`` writes each layer's top-k ids into a device
buffer; at the end of the forward the rows are copied to a host buffer at the
tokens' KV slots (``out_cache_loc``). A token's slot lives exactly as long as
its KV, so when a request finishes its experts are read back through
``req_to_token``, prompt and generated tokens alike, whatever batches they
ran in. Layers without experts (a dense layer among MoE ones) read -1, and so
do, on a pipeline stage, the layers of other stages (TpModelWorker merges them).
When the feature is off the no-op capturer does no copy at all.
"""

from __future__ import annotations

import torch

from minisgl import tracing


class RoutedExpertsCapturer:
    """The disabled capturer: every hook is free."""

    @staticmethod
    def create(enable: bool, num_layers: int, top_k: int, num_slots: int, device: str) -> "RoutedExpertsCapturer":
        if not enable:
            return RoutedExpertsCapturer()
        return _RoutedExpertsCapturerReal(num_layers, top_k, num_slots, device)

    def capture(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        pass

    def on_forward_end(self, out_cache_loc: torch.Tensor) -> None:
        pass

    def get_routed_experts(self, slots: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("routed experts were not captured: start the engine with enable_return_routed_experts")


class _RoutedExpertsCapturerReal(RoutedExpertsCapturer):
    def __init__(self, num_layers: int, top_k: int, num_slots: int, device: str) -> None:
        self.num_layers = num_layers
        self.top_k = top_k
        self.device = device
        # One row per KV slot (slot 0 is the pool's dummy), like the KV pool itself. -1 until written:
        # a pipeline stage without MoE layers never writes, and its rows must read "no expert".
        self.host_buffer = torch.full((num_slots, num_layers, top_k), -1, dtype=torch.int32)
        self._device_rows: dict[int, torch.Tensor] = {}

    def capture(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        tracing.point("RoutedExpertsCapturer.capture", layer_id=layer_id)
        self._device_rows[layer_id] = topk_ids  # [num_tokens, top_k]

    def on_forward_end(self, out_cache_loc: torch.Tensor) -> None:
        if not self._device_rows:
            return
        # A dense layer (DeepSeek's first_k_dense_replace) routes nothing: its row reads -1.
        layers = sorted(self._device_rows)
        stacked = torch.stack([self._device_rows[i] for i in layers], dim=1)  # [T, moe layers, k]
        tracing.point("RoutedExpertsCapturer.on_forward_end", num_tokens=stacked.shape[0], copy="device_to_host")
        rows = torch.full((stacked.shape[0], self.num_layers, self.top_k), -1, dtype=torch.int32)
        rows[:, layers] = stacked.to("cpu", torch.int32)
        self.host_buffer[out_cache_loc.cpu()] = rows
        self._device_rows.clear()

    def get_routed_experts(self, slots: torch.Tensor) -> torch.Tensor:
        tracing.point("RoutedExpertsCapturer.get_routed_experts", num_tokens=len(slots))
        return self.host_buffer[slots.cpu().long()].clone()  # [num_tokens, num_layers, top_k]


_global_capturer = RoutedExpertsCapturer()


def set_global_experts_capturer(capturer: RoutedExpertsCapturer) -> None:
    global _global_capturer
    _global_capturer = capturer


def get_global_experts_capturer() -> RoutedExpertsCapturer:
    return _global_capturer
