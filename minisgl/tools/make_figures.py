"""Draw the book's figures from running code (needs matplotlib, a dev dependency).

    python -m minisgl.tools.make_figures            # rewrite docs/assets/figures/ and the request-life
                                                    # diagram in chapters/serving.md and serving.zh.md
    python -m minisgl.tools.make_figures --out DIR  # write the figures into DIR instead

The data comes from minisgl/tools/figure_data.py (the engine on tiny checkpoints) and from
the golden traces; it is saved as data.json beside the SVGs. The pipeline timeline is drawn from a
recorded run, pp_timeline.json (python -m minisgl.tools.pp_timeline records it anew). The SVGs are deterministic:
text stays text (svg.fonttype none), a fixed hash salt, no date in the metadata. The
request's life is a Mermaid sequence diagram, generated from its trace into the chapter.
tests/test_docs_figures.py regenerates everything and compares.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from minisgl import tracing
from minisgl.tools import figure_data
from minisgl.tools.figure_drawing import (
    draw_eagle_tree,
    draw_kv_indices,
    draw_model_config,
    draw_overlap_timeline,
    draw_quant_blocks,
    save_svg,
    svg_pyplot,
)

REPO = Path(__file__).resolve().parents[2]
FIGURES = REPO / "docs" / "assets" / "figures"
# The request-life diagram is generated into both editions of the serving chapter.
SERVING_PAGES = [REPO / "docs" / "chapters" / "serving.md", REPO / "docs" / "chapters" / "serving.zh.md"]
BEGIN, END = "<!-- figure:request_life (python -m minisgl.tools.make_figures) -->", "<!-- /figure:request_life -->"
STATE_COLORS = {
    "": "#ffffff",
    "waiting": "#d9d9d9",
    "prefill": "#2ca02c",
    "decode": "#1f77b4",
    "retracted": "#d62728",
    "done": "#f2f2f2",
}


def collect(workdir: str) -> dict:
    """Every figure's data, from fresh runs on tiny checkpoints built in `workdir`."""
    from minisgl.tools.make_tiny_model import make_tiny_model

    llama = str(make_tiny_model("llama", Path(workdir) / "llama", seed=0))
    moe = str(make_tiny_model("qwen3_moe", Path(workdir) / "qwen3_moe", seed=0))
    return {
        "kv_slots": figure_data.kv_slots(llama),
        "radix_tree": figure_data.radix_tree(llama),
        "continuous_batching": figure_data.continuous_batching(llama),
        "expert_heat": figure_data.expert_heat(moe),
        "extend_attention": figure_data.extend_attention(llama),
        "kv_indices": figure_data.kv_indices(llama),
        "model_config": figure_data.model_config(moe),
        "request_life": figure_data.request_life(llama),
        "overlap_timeline": figure_data.overlap_timeline(llama),
        "quant_blocks": figure_data.quant_blocks(llama),
    }


def draw_trace(events: list[dict], title: str, out: Path, name: str) -> None:
    from minisgl.notebook_utils import plot_timeline

    svg_pyplot()
    ax = plot_timeline(events, title=title)
    save_svg(ax.figure, out, name)


def draw_kv_slots(data: dict, out: Path) -> None:
    import numpy as np
    from matplotlib.colors import ListedColormap

    plt, page, steps = svg_pyplot(), data["page_size"], data["steps"]
    width = (max(s for st in steps for r in data["requests"] for s in st[r]) // page + 2) * page
    owner = np.zeros((len(steps), width))
    for i, st in enumerate(steps):
        for k, rid in enumerate(data["requests"], 1):
            owner[i, st[rid]] = k
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(steps) + 1.4))
    ax.imshow(owner, cmap=ListedColormap(["#f2f2f2", "#1f77b4", "#ff7f0e"]), aspect="auto", vmin=0, vmax=2)
    for x in range(0, width + 1, page):
        ax.axvline(x - 0.5, color="k", lw=0.8)
    ax.set_xticks(range(0, width, page))
    ax.set_yticks(range(len(steps)), [f"step {i + 1}: {st['batch']}" for i, st in enumerate(steps)])
    ax.set_xlabel("KV slot (lines: pages of 4 slots; page 0 is the padding page nobody owns)")
    ax.set_title("KV slots owned after each step: blue = request a (5 prompt tokens), orange = b (3)")
    fig.tight_layout()
    save_svg(fig, out, "kv_slots")


def _layout(node: dict, depth: int, next_x: list[float], spots: list) -> float:
    xs = [_layout(c, depth + 1, next_x, spots) for c in node["children"]]
    if xs:
        x = sum(xs) / len(xs)
    else:
        x, next_x[0] = next_x[0], next_x[0] + 1
    spots.append((x, depth, node, xs))
    return x


def draw_radix_tree(data: dict, out: Path) -> None:
    plt = svg_pyplot()
    spots: list = []
    _layout(data["root"], 0, [0.0], spots)
    fig, ax = plt.subplots(figsize=(8, 4))
    for x, depth, node, child_xs in spots:
        for cx in child_xs:
            ax.plot([x, cx], [-depth, -depth - 1], color="#888", lw=1, zorder=1)
        label = "root" if not node["key"] else f"tokens {node['key']}\nslots {node['slots']}"
        ax.text(
            x,
            -depth,
            label,
            ha="center",
            va="center",
            fontsize=8,
            zorder=2,
            bbox=dict(boxstyle="round", fc="#e8eaf6" if node["key"] else "#c5cae9", ec="#3f51b5"),
        )
    cached = ", ".join(f"{rid}: {n}" for rid, n in data["cached_tokens"].items())
    prompts = "; ".join(f"{rid} = {ids}" for rid, ids in data["prompts"].items())
    ax.set_title(
        f"radix cache after these prompts, run in turn:\n{prompts}\ncached prompt tokens per request: {cached}"
    )
    ax.set_xlim(-0.8, max(x for x, *_ in spots) + 0.8)
    ax.set_ylim(-max(d for _, d, *_ in spots) - 0.6, 0.6)
    ax.axis("off")
    fig.tight_layout()
    save_svg(fig, out, "radix_tree")


def draw_continuous_batching(data: dict, out: Path) -> None:
    plt = svg_pyplot()
    rids, steps = data["requests"], data["steps"]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rids) + 1.8))
    for t, st in enumerate(steps):
        for row, rid in enumerate(rids):
            ax.add_patch(plt.Rectangle((t, row), 1, 0.8, color=STATE_COLORS[st[rid]], lw=0))
    ax.set_xlim(0, len(steps))
    ax.set_ylim(len(rids), -0.2)
    ax.set_yticks([i + 0.4 for i in range(len(rids))], rids)
    ax.set_xlabel(f"scheduler step (KV pool: {data['pool']} slots)")
    shown = ("waiting", "prefill", "decode", "retracted")
    handles = [plt.Rectangle((0, 0), 1, 1, color=STATE_COLORS[s]) for s in shown]
    ax.legend(
        handles,
        ["waiting", "prefill (EXTEND)", "decode", "retracted"],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25),
        ncol=4,
        frameon=False,
    )
    ax.set_title("continuous batching: each request's part in each step (r3 arrives at step 6)")
    fig.tight_layout()
    save_svg(fig, out, "continuous_batching")


def draw_expert_heat(data: dict, out: Path) -> None:
    import torch

    from minisgl.eplb.expert_distribution import plot_expert_load

    svg_pyplot()
    ax = plot_expert_load({"mode": data["mode"], "stat": torch.tensor(data["stat"])})
    ax.set_yticks(range(len(data["stat"])))  # one tick per layer, never a fractional one
    ax.figure.tight_layout()
    save_svg(ax.figure, out, "expert_heat")


def draw_extend_attention(data: dict, out: Path) -> None:
    import numpy as np

    plt, reqs = svg_pyplot(), data["requests"]
    width = max(max(r["slots"]) for r in reqs) + 1
    rows, labels = [], []
    for k, r in enumerate(reqs):
        for i in range(r["new"]):
            row = np.zeros(width)
            visible = r["slots"][: r["prefix"] + i + 1]
            row[visible[: r["prefix"]]] = 1  # cached prefix
            row[visible[r["prefix"] :]] = 2  # this extend's own keys, causal
            rows.append(row)
            labels.append(f"req {k}, query {r['prefix'] + i}")
    from matplotlib.colors import ListedColormap

    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.4))
    ax.imshow(np.array(rows), cmap=ListedColormap(["#f2f2f2", "#9467bd", "#2ca02c"]), aspect="auto", vmin=0, vmax=2)
    ax.set_yticks(range(len(rows)), labels)
    ax.set_xticks(range(width))
    ax.set_xlabel("KV slot read (purple: prefix from the radix cache; green: keys of this extend, causal)")
    ax.set_title("one EXTEND batch: the slots each query attends to, through req_to_token")
    fig.tight_layout()
    save_svg(fig, out, "extend_attention")


def _participant(event: str) -> str | None:
    head = event.split(".")[0]
    return {"GenerateRun": "TokenizerManager", "ForwardBatch": "TpModelWorker"}.get(
        head, head if head in figure_data.PARTICIPANTS else None
    )


RETURNS = {
    "TokenizerManager.generate_request": "JSON (text, output_ids, meta_info)",
    "Scheduler.step": "ReqOutput(new_output_ids)",
    "TpModelWorker.forward_batch_generation": "GenerationBatchResult",
    "ModelRunner.forward": "ModelRunnerOutput(logits_output)",
    "model.forward": "LogitsProcessorOutput",
    "ModelRunner.sample": "next_token_ids",
    "Sampler.forward": "next_token_ids",
}


def request_life_mermaid(events: list[dict]) -> str:
    """A sequence diagram: a span is a call from the participant whose span encloses it.

    Calls within one participant are self-arrows; a return arrow closes each call between two.
    """
    ids = {p: p.replace(" ", "") for p in figure_data.PARTICIPANTS}
    lines = ["```mermaid", "sequenceDiagram"]
    lines += [f"    participant {ids[p]} as {p}" for p in figure_data.PARTICIPANTS]
    stack: list[tuple[str, str]] = [("Engine", "")]
    for e in events:
        who = _participant(e["event"])
        if e["phase"] == "begin":
            caller = stack[-1][0]
            head, method = e["event"].split(".", 1)
            method = method if head == who else e["event"]  # ForwardBatch.init_new runs in the worker
            if e["event"] == "Scheduler.step":
                step = sum("scheduler step" in x for x in lines) + 1
                lines.append(f"    Note over Scheduler,Sampler: scheduler step {step}")
            mode = f" ({e['forward_mode']})" if "forward_mode" in e else ""
            if len(stack) > 1 or who != caller:  # the handler's own span is where the diagram starts
                lines.append(f"    {ids[caller]}->>{ids[who]}: {method}{mode}")
            stack.append((who, e["event"]))
        elif e["phase"] == "end":
            callee, event = stack.pop()
            if callee != stack[-1][0]:
                lines.append(f"    {ids[callee]}-->>{ids[stack[-1][0]]}: {RETURNS.get(event, 'return')}")
    lines.append("```")
    return "\n".join(lines)


def with_request_life(chapter: str, diagram: str) -> str:
    if BEGIN not in chapter or END not in chapter:
        raise SystemExit("a serving chapter lost the request-life markers")
    head, rest = chapter.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{diagram}\n{rest[rest.index(END) :]}"


def build(out: Path, data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    traces = REPO / "traces"
    init_title = (
        "Engine(...): Scheduler → TpModelWorker → ModelRunner.initialize\n(traces/model_runner_initialize.jsonl)"
    )
    draw_trace(tracing.load_jsonl(traces / "model_runner_initialize.jsonl"), init_title, out, "init_timeline")
    draw_trace(
        tracing.load_jsonl(traces / "model_runner_forward_sample.jsonl"),
        "two scheduler steps, EXTEND then DECODE (traces/model_runner_forward_sample.jsonl)",
        out,
        "forward_sample",
    )
    draw_kv_slots(data["kv_slots"], out)
    draw_radix_tree(data["radix_tree"], out)
    draw_continuous_batching(data["continuous_batching"], out)
    draw_expert_heat(data["expert_heat"], out)
    draw_extend_attention(data["extend_attention"], out)
    draw_kv_indices(data["kv_indices"], out)
    draw_model_config(data["model_config"], out)
    draw_overlap_timeline(data["overlap_timeline"], out)
    draw_quant_blocks(data["quant_blocks"], out)
    draw_eagle_tree(tracing.load_jsonl(traces / "eagle_decoding.jsonl"), out)
    draw_recorded_figures(out)
    (out / "data.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    # The SVG bytes depend on matplotlib's version; the test compares bytes only under the same one.
    import matplotlib

    (out / "drawn_with.txt").write_text(f"matplotlib {matplotlib.__version__}\n", encoding="utf-8")


def draw_recorded_figures(out: Path) -> None:
    """Figures of measured times, drawn from a committed recording: a fresh run's times differ, so only
    the drawing is checked here. `python -m minisgl.tools.pp_timeline` records pp_timeline.json anew."""
    from minisgl.tools import pp_timeline

    pp_timeline.draw(json.loads((FIGURES / "pp_timeline.json").read_text(encoding="utf-8")), out)


def main() -> None:
    ap = argparse.ArgumentParser(description="Draw the book's figures from running code.")
    ap.add_argument("--out", type=Path, default=None, help="write here instead of docs/assets/figures/")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="minisgl-figures-") as workdir:
        data = collect(workdir)
    build(args.out or FIGURES, data)
    diagram = request_life_mermaid(data["request_life"])
    if args.out is None:
        for page in SERVING_PAGES:
            page.write_text(with_request_life(page.read_text(encoding="utf-8"), diagram), encoding="utf-8")
    else:
        (args.out / "request_life.md").write_text(diagram + "\n", encoding="utf-8")
    print(f"wrote {sorted(p.name for p in (args.out or FIGURES).iterdir())}")


if __name__ == "__main__":
    main()
