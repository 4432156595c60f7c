"""Record the pipeline's timeline from a real pp 2 run, draw it, and measure the bubble.

    python -m minisgl.tools.pp_timeline            # record (a tiny 8-layer Llama), print the bubble, write
                                                   # docs/assets/figures/pp_timeline.json and pp_timeline.svg
    python -m minisgl.tools.pp_timeline --model PATH --prompts 8 --output-len 16

The recording is a torch-profiler trace per stage (Engine.start_profile under pp 2 writes one Chrome
trace per stage, ``-PP-<stage>-TP-0``): a stage is busy while it runs
``TpModelWorker.forward_batch_generation``. Every stage runs the same micro-batches in the same
order (managers/scheduler_pp_mixin.py), so the k-th forward of stage 0 and the k-th of stage 1 are
the same micro-batch: the figure gives both the same number and colour, and a line joins the end of
one to the start of the other (the PPProxyTensors hand-off). The bubble of a stage is the share of
the window (first forward begun to last forward ended, on any stage) it spent outside its forwards.

Times depend on the machine and its load, so the recording is data (pp_timeline.json, with the
machine's CPU, core count and load average), not recomputed by make_figures: it redraws the SVG
from the recording, and tests/test_docs_figures.py checks the SVG is that drawing.
benchmarks/bench_pp.py prints the same bubble for its own run.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import tempfile
from pathlib import Path

FORWARD = "TpModelWorker.forward_batch_generation"
FIGURES = Path(__file__).resolve().parents[2] / "docs" / "assets" / "figures"
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def forward_ranges(trace_path: str) -> list[tuple[float, float]]:
    """(begin, end) in microseconds on the machine's clock, of every forward range in one stage's trace."""
    with open(trace_path) as f:
        trace = json.load(f)
    base_us = trace.get("baseTimeNanoseconds", 0) / 1000  # kineto's ts are relative to this
    return sorted(
        (base_us + e["ts"], base_us + e["ts"] + e["dur"])
        for e in trace["traceEvents"]
        if e.get("name") == FORWARD and e.get("ph") == "X"
    )


def stage_ranges(profile_dir: str, pp_size: int) -> list[list[tuple[float, float]]]:
    """Each stage's forward ranges, from the newest profile of stage 0's TP rank 0 in profile_dir."""
    paths = [sorted(glob.glob(os.path.join(profile_dir, f"*-PP-{p}-TP-0.trace.json")))[-1] for p in range(pp_size)]
    return [forward_ranges(p) for p in paths]


def bubble(stages: list[list[tuple[float, float]]]) -> tuple[list[float], float]:
    """Each stage's idle share of the window in which any stage ran a forward, and the window (in the
    ranges' unit)."""
    start = min(r[0][0] for r in stages)
    end = max(r[-1][1] for r in stages)
    return [1 - sum(e - b for b, e in r) / (end - start) for r in stages], end - start


def bubble_line(stages: list[list[tuple[float, float]]], unit_s: float) -> str:
    idle, window = bubble(stages)
    parts = ", ".join(f"stage {p} idle {b:.0%}" for p, b in enumerate(idle))
    return f"pp {len(stages)} bubble over {window * unit_s:.2f} s of forwards: {parts}"


def record(model: str, prompts: int, input_len: int, output_len: int, max_prefill_tokens: int) -> dict:
    """Serve greedy requests with pp 2 under the profiler; the stages' forwards in ms from the first."""
    import torch

    from minisgl.entrypoints.engine import Engine

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 500, (prompts, input_len), generator=gen).tolist()  # under the tiny vocabulary
    params = {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}
    kw = dict(max_prefill_tokens=max_prefill_tokens, chunked_prefill_size=max_prefill_tokens)
    with tempfile.TemporaryDirectory(prefix="pp-timeline-") as profile_dir:
        with Engine(model_path=model, device="cpu", pp_size=2, **kw) as engine:
            engine.generate(input_ids=ids[:1], sampling_params={**params, "max_new_tokens": 2})  # warm-up
            engine.start_profile(output_dir=profile_dir, activities=["CPU"])
            engine.generate(input_ids=ids, sampling_params=params)
            engine.stop_profile()
        stages = stage_ranges(profile_dir, 2)
    if len({len(r) for r in stages}) != 1:
        raise RuntimeError(f"the stages ran {[len(r) for r in stages]} forwards; they run the same micro-batches")
    t0 = min(r[0][0] for r in stages)
    return {
        "stages_ms": [[[round((b - t0) / 1e3, 3), round((e - t0) / 1e3, 3)] for b, e in r] for r in stages],
        "workload": f"{prompts} prompts x {input_len} tokens, {output_len} new each, {max_prefill_tokens} per prefill",
        "machine": f"{_cpu_name()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
        "torch_threads_per_stage": max(1, torch.get_num_threads() // 2),
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def draw(recording: dict, out: Path) -> None:
    """A Gantt chart: one row per stage, a bar per forward, micro-batch k's bars numbered k on both stages."""
    from minisgl.tools.figure_drawing import save_svg, svg_pyplot

    plt, stages = svg_pyplot(), recording["stages_ms"]
    idle, window = bubble(stages)
    fig, ax = plt.subplots(figsize=(10, 2.8))
    for p, ranges in enumerate(stages):
        y = len(stages) - 1 - p
        for k, (b, e) in enumerate(ranges):
            ax.broken_barh([(b, e - b)], (y - 0.35, 0.7), fc=COLORS[k % len(COLORS)], ec="k", lw=0.4, alpha=0.8)
            if e - b > window / 90:
                ax.text((b + e) / 2, y, str(k), ha="center", va="center", fontsize=6)
    for (_, e0), (b1, _) in zip(stages[0], stages[1]):  # stage 0 hands micro-batch k to stage 1
        ax.plot([e0, b1], [len(stages) - 1.35, len(stages) - 1.65], color="0.5", lw=0.5)
    ax.set_yticks(range(len(stages)), [f"stage {p}\nidle {idle[p]:.0%}" for p in reversed(range(len(stages)))])
    ax.set_xlim(0, window)
    ax.set_xlabel("ms since the first forward")
    ax.set_title(
        f"pp {len(stages)}: each stage's forwards, micro-batch k numbered on both (a line: stage 0 hands k on)\n"
        f"{recording['workload']}; {recording['machine']}",
        fontsize=8,
    )
    fig.tight_layout()
    save_svg(fig, out, "pp_timeline")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a checkpoint folder (default: a tiny 8-layer Llama)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--max-prefill-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=FIGURES, help="where pp_timeline.json and .svg go")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pp-timeline-model-") as tmp:
        from minisgl.tools.make_tiny_model import make_tiny_model

        model = args.model or str(make_tiny_model("llama", Path(tmp) / "llama8", num_hidden_layers=8))
        recording = record(model, args.prompts, args.input_len, args.output_len, args.max_prefill_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "pp_timeline.json"
    # One [begin, end] pair a line: a reviewable diff.
    text = re.sub(r"\[\s+([\d.]+),\s+([\d.]+)\s+\]", r"[\1, \2]", json.dumps(recording, indent=1))
    data.write_text(text + "\n", encoding="utf-8")
    print(bubble_line(recording["stages_ms"], 1e-3))
    draw(recording, args.out)
    print(f"wrote {data} and {args.out / 'pp_timeline.svg'}")


if __name__ == "__main__":
    main()
