"""Regenerate the golden traces in traces/ (deliberately: review the diff afterwards).

    python -m minisgl.tools.refresh_traces            # all scenarios
    python -m minisgl.tools.refresh_traces NAME ...   # some of them

Each scenario runs the engine on a tiny deterministic checkpoint under
``tracing.record()`` and returns the events; tests run the same scenarios and
compare with the files, so a changed code path shows up as a failing test and
then as a reviewed diff.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Callable

from minisgl import tracing

TRACES_DIR = Path(__file__).resolve().parents[2] / "traces"
ENGINE_KWARGS = dict(max_total_tokens=256, max_running_requests=8, device="cpu", attention_backend="torch_native")
PROMPTS = [[5, 6, 7, 8], [9, 10]]


def _tiny(arch: str, workdir: str) -> str:
    from minisgl.tools.make_tiny_model import make_tiny_model

    return str(make_tiny_model(arch, Path(workdir) / arch, seed=0))


def _engine(path: str, **kwargs):
    from minisgl.entrypoints.engine import Engine

    return Engine(model_path=path, **{**ENGINE_KWARGS, **kwargs})


def model_runner_initialize(workdir: str) -> list[dict]:
    """C4/C5: building an Engine, from ModelConfig to init_device_graphs."""
    path = _tiny("llama", workdir)
    with tracing.record() as events:
        _engine(path)
    return events


def model_runner_forward_sample(workdir: str) -> list[dict]:
    """C6/C7/C8: one prefill of two requests, then decode steps, greedy."""
    engine = _engine(_tiny("llama", workdir))
    with tracing.record() as events:
        engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True})
    return events


def attention_backend_triton(workdir: str) -> list[dict]:
    """C11 and the Triton backend: chosen at init; metadata built once per forward, before layer 0."""
    path = _tiny("llama", workdir)
    with tracing.record() as events:
        engine = _engine(path, attention_backend="triton", page_size=4)
        engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True})
    keep = ("ModelRunner.init_attention_backend", "ModelRunner.forward", "attn_backend.init_forward_metadata", "RadixAttention.forward")
    return [e for e in events if e["event"].startswith(keep)]


def side_outputs(workdir: str) -> list[dict]:
    """C9: hidden states, routed experts and the expert recorder on a tiny Qwen3-MoE."""
    engine = _engine(
        _tiny("qwen3_moe", workdir),
        enable_return_hidden_states=True,
        enable_return_routed_experts=True,
        expert_distribution_recorder_mode="stat",
    )
    engine.start_expert_distribution_record()
    with tracing.record() as events:
        engine.generate(
            input_ids=PROMPTS[0],
            sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True},
            return_hidden_states=True,
            return_routed_experts=True,
            return_logprob=True,
        )
    keep = ("ModelRunner.forward", "ModelRunner.sample", "ExpertDistributionRecorder", "RoutedExpertsCapturer", "LogitsProcessor")
    return [e for e in events if e["event"].startswith(keep)]


SCENARIOS: dict[str, Callable[[str], list[dict]]] = {
    "model_runner_initialize": model_runner_initialize,
    "model_runner_forward_sample": model_runner_forward_sample,
    "attention_backend_triton": attention_backend_triton,
    "side_outputs": side_outputs,
}


def run_scenario(name: str) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="minisgl-trace-") as workdir:
        return SCENARIOS[name](workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", choices=[[], *SCENARIOS], default=[])
    names = parser.parse_args().names or list(SCENARIOS)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name in names:
        path = TRACES_DIR / f"{name}.jsonl"
        events = run_scenario(name)
        tracing.dump_jsonl(events, path)
        print(f"wrote {len(events)} events to {path}")


if __name__ == "__main__":
    main()
