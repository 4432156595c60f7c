"""ExpertDistributionRecorder: how often each MoE expert is chosen, per layer.

Mirrors python/sglang/srt/eplb/expert_distribution.py (ExpertDistributionRecorder
with init_new, with_forward_pass, with_current_layer, on_select_experts,
start_record, stop_record, dump_record; modes stat / per_pass / per_token).
SGLang feeds this into EPLB (expert-parallel load balancing) and gathers it
across ranks; minisgl records on one rank and writes the dump to a file.

Dump format (``torch.save`` of a dict):
    {"mode": str, "num_layers": L, "num_experts": E,
     "stat":      LongTensor [L, E]                       (mode "stat"),
     "per_pass":  list of {"forward_pass_id", "counts": [L, E]} (mode "per_pass"),
     "per_token": list of {"forward_pass_id", "topk_ids": [L, T, k]} (mode "per_token")}
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import torch

from minisgl import tracing

RECORDER_MODES = ("stat", "per_pass", "per_token")


class ExpertDistributionRecorder:
    """A recorder that records nothing; the real one overrides the hooks."""

    @staticmethod
    @tracing.traced(name="ExpertDistributionRecorder.init_new")
    def init_new(mode: Optional[str], num_layers: int, num_experts: int) -> "ExpertDistributionRecorder":
        if mode is None or num_experts == 0:
            return ExpertDistributionRecorder()
        if mode not in RECORDER_MODES:
            raise ValueError(f"expert_distribution_recorder_mode must be one of {RECORDER_MODES}, got {mode!r}")
        return _ExpertDistributionRecorderReal(mode, num_layers, num_experts)

    @contextlib.contextmanager
    def with_forward_pass(self, forward_pass_id: int, forward_batch):
        tracing.point("ExpertDistributionRecorder.with_forward_pass", recording=False)
        yield

    @contextlib.contextmanager
    def with_current_layer(self, layer_idx: int):
        yield

    def on_select_experts(self, topk_ids: torch.Tensor) -> None:
        pass

    def start_record(self) -> None:
        raise RuntimeError(
            "the expert distribution recorder is off: start the engine with expert_distribution_recorder_mode"
        )

    stop_record = start_record

    def dump_record(self, output_path: Optional[str] = None) -> dict:
        self.start_record()


class _ExpertDistributionRecorderReal(ExpertDistributionRecorder):
    def __init__(self, mode: str, num_layers: int, num_experts: int) -> None:
        self.mode = mode
        self.num_layers = num_layers
        self.num_experts = num_experts
        self._recording = False
        self._current_layer: Optional[int] = None
        self._reset()

    def _reset(self) -> None:
        self._stat = torch.zeros(self.num_layers, self.num_experts, dtype=torch.int64)
        self._per_pass: list[dict] = []
        self._per_token: list[dict] = []
        self._pass: Optional[dict] = None

    @contextlib.contextmanager
    def with_forward_pass(self, forward_pass_id: int, forward_batch):
        tracing.point("ExpertDistributionRecorder.with_forward_pass", recording=self._recording)
        if not self._recording:
            yield
            return
        self._pass = {"forward_pass_id": forward_pass_id, "layers": {}}
        try:
            yield
        finally:
            self._on_forward_pass_end()

    @contextlib.contextmanager
    def with_current_layer(self, layer_idx: int):
        previous, self._current_layer = self._current_layer, layer_idx
        try:
            yield
        finally:
            self._current_layer = previous

    def on_select_experts(self, topk_ids: torch.Tensor) -> None:
        # topk_ids: [num_tokens, top_k]
        if self._pass is None:
            return
        tracing.point("ExpertDistributionRecorder.on_select_experts", layer=self._current_layer)
        self._pass["layers"][self._current_layer] = topk_ids.detach().to("cpu", torch.int64)

    def _on_forward_pass_end(self) -> None:
        layers = self._pass["layers"]
        counts = torch.zeros(self.num_layers, self.num_experts, dtype=torch.int64)
        for layer, ids in layers.items():
            counts[layer] = torch.bincount(ids.flatten(), minlength=self.num_experts)
        if self.mode == "stat":
            self._stat += counts
        elif self.mode == "per_pass":
            self._per_pass.append({"forward_pass_id": self._pass["forward_pass_id"], "counts": counts})
        else:
            stacked = torch.stack([layers[i] for i in sorted(layers)]) if layers else torch.empty(0)
            self._per_token.append({"forward_pass_id": self._pass["forward_pass_id"], "topk_ids": stacked})
        self._pass = None

    def start_record(self) -> None:
        self._reset()
        self._recording = True

    def stop_record(self) -> None:
        self._recording = False

    def dump_record(self, output_path: Optional[str] = None) -> dict:
        dump = {"mode": self.mode, "num_layers": self.num_layers, "num_experts": self.num_experts}
        dump[self.mode] = {"stat": self._stat, "per_pass": self._per_pass, "per_token": self._per_token}[self.mode]
        if output_path is not None:
            Path(output_path).parent.mkdir(parents=True, exist_ok=True)
            torch.save(dump, output_path)
        return dump


def expert_load(dump: dict) -> torch.Tensor:
    """[num_layers, num_experts] times each expert was chosen, from a dump of any mode."""
    if dump["mode"] == "stat":
        return dump["stat"]
    if dump["mode"] == "per_pass":
        return sum(
            (p["counts"] for p in dump["per_pass"]),
            torch.zeros(dump["num_layers"], dump["num_experts"], dtype=torch.int64),
        )
    load = torch.zeros(dump["num_layers"], dump["num_experts"], dtype=torch.int64)
    for p in dump["per_token"]:
        for layer, ids in enumerate(p["topk_ids"]):
            load[layer] += torch.bincount(ids.flatten(), minlength=dump["num_experts"])
    return load


def plot_expert_load(dump: dict, ax=None):
    """Heat map of expert_load(dump): layers down, experts across (needs matplotlib)."""
    import matplotlib.pyplot as plt

    load = expert_load(dump)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.5 + 0.55 * load.shape[1], 1 + 0.45 * load.shape[0]))
    image = ax.imshow(load.numpy(), cmap="viridis", aspect="auto")
    if load.numel() <= 256:  # numbers in the cells, while they fit
        for layer in range(load.shape[0]):
            for expert in range(load.shape[1]):
                ax.text(expert, layer, int(load[layer, expert]), ha="center", va="center", color="white", fontsize=8)
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_title(f"expert load (recorder mode {dump['mode']}): times each expert was chosen")
    ax.figure.colorbar(image, ax=ax, label="times chosen")
    return ax


_global_recorder = ExpertDistributionRecorder()


def set_global_expert_distribution_recorder(recorder: ExpertDistributionRecorder) -> None:
    global _global_recorder
    _global_recorder = recorder


def get_global_expert_distribution_recorder() -> ExpertDistributionRecorder:
    return _global_recorder
