"""Shared SVG settings of the book's figures, and the drawings of the later chapters' figures
(kv_indices, model_config, overlap_timeline, eagle_tree, quant_blocks). minisgl/tools/make_figures.py
collects their data and calls them; split from it to keep each file to one screenful of jobs."""

from __future__ import annotations

from pathlib import Path


def svg_pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {"svg.fonttype": "none", "svg.hashsalt": "minisgl", "font.family": "DejaVu Sans", "font.size": 9}
    )
    return plt


def save_svg(fig, out: Path, name: str) -> None:
    fig.savefig(out / f"{name}.svg", format="svg", metadata={"Date": None, "Creator": "minisgl make_figures"})
    svg_pyplot().close(fig)


def draw_kv_indices(data: dict, out: Path) -> None:
    plt = svg_pyplot()
    rows, ptr, flat = data["req_to_token"], data["kv_indptr"], data["kv_indices"]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]

    def cell(x, y, text, color, w=1.0):
        ax.add_patch(plt.Rectangle((x, y), w * 0.94, 0.8, fc=color, ec="k", lw=0.6, alpha=0.35))
        ax.text(x + w * 0.47, y + 0.4, text, ha="center", va="center", fontsize=8)

    for i, (row, idx) in enumerate(zip(rows, data["req_pool_indices"])):
        y = 5.2 - i
        ax.text(-0.3, y + 0.4, f"req_to_token[{idx}, :{data['seq_lens'][i]}]", ha="right", va="center", fontsize=8)
        for k, slot in enumerate(row):
            cell(k, y, slot, colors[i])
    ax.text(-0.3, 1.4, "kv_indices", ha="right", va="center", fontsize=8)
    for k, slot in enumerate(flat):
        cell(k, 1.0, slot, colors[next(i for i in range(len(ptr) - 1) if ptr[i] <= k < ptr[i + 1])])
    ax.text(-0.3, 0.0, "kv_indptr", ha="right", va="center", fontsize=8)
    for i, p in enumerate(ptr):
        ax.annotate(
            str(p),
            (p - 0.03, 0.95),
            (p - 0.03, 0.0),
            ha="center",
            va="center",
            fontsize=8,
            arrowprops=dict(arrowstyle="->", lw=0.8),
        )
    ax.set_xlim(-4.6, len(flat) + 0.3)
    ax.set_ylim(-0.4, 6.2)
    ax.axis("off")
    ax.set_title(
        "one DECODE batch of three requests: each row of req_to_token, flattened for the kernels\n"
        "(TritonAttnBackend.init_forward_metadata; request b = kv_indices[kv_indptr[b]:kv_indptr[b + 1]])"
    )
    fig.tight_layout()
    save_svg(fig, out, "kv_indices")


def draw_model_config(data: dict, out: Path) -> None:
    plt = svg_pyplot()
    fields = data["fields"]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(fields) + 1.6))
    box = dict(boxstyle="round", fc="#e8eaf6", ec="#3f51b5")
    for i, (key, raw, name, value) in enumerate(fields):
        y = len(fields) - i
        ax.text(0.0, y, f"{key}: {raw}", ha="left", va="center", fontsize=8, bbox=box)
        ax.annotate("", (0.52, y), (0.40, y), arrowprops=dict(arrowstyle="->", lw=0.8))
        ax.text(0.53, y, f"{name} = {value}", ha="left", va="center", fontsize=8, bbox=dict(box, fc="#e8f5e9"))
    ax.text(0.0, len(fields) + 0.9, "config.json", ha="left", fontsize=9, weight="bold")
    ax.text(0.53, len(fields) + 0.9, "ModelConfig (the personality)", ha="left", fontsize=9, weight="bold")
    sizes = (
        f"is_moe = {data['is_moe']};  request table req_to_token {data['req_to_token']} (context_len + 4 columns);  "
        f"KV pool: {data['kv_layers']} layers of K and V, each {data['k_buffer']} = [slots, kv_heads, head_dim]"
    )
    ax.text(0.0, 0.1, sizes, ha="left", va="center", fontsize=7.5)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.3, len(fields) + 1.4)
    ax.axis("off")
    fig.tight_layout()
    save_svg(fig, out, "model_config")


def draw_overlap_timeline(data: dict, out: Path) -> None:
    """Both loops' recorded order, laid out with unit costs: a scheduler action (prepare and
    launch, or process) takes 1, a forward 2. A forward starts once launched and once the
    previous forward ended; processing a batch waits for its forward (normal: same thread)."""
    plt = svg_pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(10, 3.6), sharex=True)
    colors = {"EXTEND": "#2ca02c", "DECODE": "#1f77b4"}
    longest = 0.0
    for ax, loop in zip(axes, ("normal", "overlap")):
        clock, forward_end, ends = 0.0, 0.0, {}
        for action, n, mode in data[loop]:
            if action == "launch":
                ax.add_patch(plt.Rectangle((clock, 1.1), 1, 0.8, color="#bbbbbb"))
                ax.text(clock + 0.5, 1.5, f"prep {n}", ha="center", va="center", fontsize=7)
                clock += 1
                start = max(clock, forward_end)
                forward_end = ends[n] = start + 2
                row = 1.1 if loop == "normal" else 0.1
                ax.add_patch(plt.Rectangle((start, row), 2, 0.8, color=colors[mode]))
                ax.text(start + 1, row + 0.4, f"fwd {n}", ha="center", va="center", fontsize=7, color="white")
                if loop == "normal":
                    clock = forward_end
            else:
                clock = max(clock, ends[n])
                ax.add_patch(plt.Rectangle((clock, 1.1), 1, 0.8, color="#ff7f0e"))
                ax.text(clock + 0.5, 1.5, f"proc {n}", ha="center", va="center", fontsize=7)
                clock += 1
        ax.set_ylim(0, 2)
        ax.set_yticks([0.5, 1.5], ["forward thread", "scheduler thread"])
        ax.set_title(f"event_loop_{loop}: {clock:.0f} units for the same batches")
        longest = max(longest, clock)
    axes[-1].set_xlim(0, longest)
    axes[-1].set_xlabel("time in units (prepare/process 1, forward 2); order recorded from a run of two requests")
    fig.tight_layout()
    save_svg(fig, out, "overlap_timeline")


def draw_eagle_tree(events: list[dict], out: Path) -> None:
    """Each EAGLE round of traces/eagle_decoding.jsonl: the nodes verify scored (t0 and the best
    drafts, joined to their parents) and the path it accepted, from the trace's own points."""
    plt = svg_pyplot()
    trees = [e for e in events if e["event"] == "EAGLEWorker.verify.tree"]
    accepted = [e for e in events if e["event"] == "EAGLEWorker.verify.accepted"]
    fig, axes = plt.subplots(1, len(trees), figsize=(4.5 * len(trees), 3.4), squeeze=False)
    for r, (ax, tree, result) in enumerate(zip(axes[0], trees, accepted)):
        parents, tokens, path = tree["parents"][0], tree["tokens"], result["accepted_nodes"][0]
        depth = [0] * len(parents)
        for j, p in enumerate(parents):
            depth[j] = 0 if p < 0 else depth[p] + 1
        spot, per_depth = {}, {}
        for j in range(len(parents)):  # left to right within a depth, in node order
            spot[j] = (per_depth.get(depth[j], 0), -depth[j])
            per_depth[depth[j]] = per_depth.get(depth[j], 0) + 1
        for j, p in enumerate(parents):
            if p >= 0:
                on_path = j in path and p in path
                ax.plot(*zip(spot[p], spot[j]), color="#2ca02c" if on_path else "#aaaaaa", lw=2 if on_path else 1)
        for j, (x, y) in spot.items():
            label = f"t0 = {tokens[j]}\n(verified)" if j == 0 else f"node {j}\ntoken {tokens[j]}"
            color = "#c7e9c0" if j in path else "#eeeeee"
            ax.text(x, y, label, ha="center", va="center", fontsize=8, bbox=dict(boxstyle="round", fc=color, ec="#555"))
        ax.set_xlim(-0.7, max(x for x, _ in spot.values()) + 0.7)
        ax.set_ylim(min(y for _, y in spot.values()) - 0.6, 0.6)
        ax.axis("off")
        kept, freed = result["accept_lengths"][0], result["freed_slots"]
        ax.set_title(
            f"round {r + 1}: verify scores {len(parents)} nodes,\naccepts path {path} "
            f"({kept} draft{'s' * (kept != 1)} kept), frees {freed} slot{'s' * (freed != 1)}",
            fontsize=9,
        )
    fig.suptitle("EAGLE tree verify (traces/eagle_decoding.jsonl; green: accepted)", fontsize=10)
    fig.tight_layout()
    save_svg(fig, out, "eagle_tree")


def draw_quant_blocks(data: dict, out: Path) -> None:
    """One block of 32 weights in each stored layout: its bytes by field (left) and the weights decoded
    from them against the float weights (right); a 4-bit type's 16 levels are drawn as faint lines."""
    plt = svg_pyplot()
    fig, axes = plt.subplots(4, 2, figsize=(10.5, 7.6), gridspec_kw={"width_ratios": [1.25, 1]})
    weights = data["weights"]
    colors = {"d": "#ff7f0e", "m": "#9467bd", "q": "#1f77b4", "scale": "#ff7f0e"}
    rows = [
        ("Q8_0", "w = q·d", lambda q: [str(v) for v in q]),
        ("Q4_0", "w = (q − 8)·d", lambda q: [f"{q[j + 16]}|{q[j]}" for j in range(16)]),
        ("Q4_1", "w = q·d + m", lambda q: [f"{q[j + 16]}|{q[j]}" for j in range(16)]),
        ("w8a8_int8", "w = q·scale", lambda q: [str(v) for v in q]),
    ]
    for (left, right), (kind, formula, byte_labels) in zip(axes, rows):
        block = data[kind]
        # (field, bytes, label): the scales as one box each, every q byte on its own
        fields = [("q", 1, label) for label in byte_labels(block["q"])]
        if kind == "w8a8_int8":  # the row's scale is a separate tensor (weight_scale), one float32 per row
            fields += [(None, 1, ""), ("scale", 4, "scale fp32")]
        else:
            fields = [("d", 2, "d\nfp16")] + ([("m", 2, "m\nfp16")] if block["m"] is not None else []) + fields
        x = 0
        for field, size, label in fields:
            if field is not None:
                left.add_patch(plt.Rectangle((x, 0), size - 0.08, 1, fc=colors[field], alpha=0.35, ec="k", lw=0.4))
                left.text(x + size / 2, 0.5, label, ha="center", va="center", fontsize=4.8 if size == 1 else 5.5,
                          rotation=90 if size == 1 else 0)  # fmt: skip
            x += size
        left.set_xlim(-0.2, 38)
        left.set_ylim(-0.2, 1.2)
        left.axis("off")
        if kind == "w8a8_int8":
            what = (f"W8A8 weight row: int8 q, 1 byte each (the first 32 of K = {data['k']}), "
                    f"and one float32 scale = {block['scale']} for the row")  # fmt: skip
        else:
            m = f", m = {block['m']}" if block["m"] is not None else ""
            nibbles = "; each q byte: high|low nibble = q(j+16)|q(j)" if kind != "Q8_0" else ""
            what = f"{kind}: {block['bytes']} bytes per 32 weights, d = {block['d']}{m} (fp16){nibbles}"
        left.set_title(what, fontsize=7.5, loc="left")
        decoded = block["decoded"]
        if kind in ("Q4_0", "Q4_1"):
            for level in range(16):
                value = (level - 8) * block["d"] if kind == "Q4_0" else level * block["d"] + block["m"]
                right.axhline(value, color="#cccccc", lw=0.4, zorder=0)
        right.plot(range(32), weights, "o", ms=3, color="k", label="float weight")
        right.plot(range(32), decoded, "x", ms=4, color=colors["q"], label="decoded")
        worst = max(abs(a - b) for a, b in zip(weights, decoded))
        right.set_title(f"{formula}: largest error {worst:.3g}", fontsize=7.5)
        right.tick_params(labelsize=6)
    axes[0][1].legend(fontsize=6, loc="lower right")
    axes[-1][1].set_xlabel(f"weight j of {data['tensor']} (tiny Llama checkpoint)", fontsize=7)
    fig.tight_layout()
    save_svg(fig, out, "quant_blocks")
