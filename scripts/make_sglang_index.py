"""Write docs/reference/sglang-index-64bca53.json: facts about SGLang's runtime at the pinned commit.

The docs tests (tests/test_docs_sglang.py) check every `python/sglang/srt/<file>:<line>` the book cites
against this file, so it ships with the project and a bare clone runs every check. It holds
facts only, never code: for each file under python/sglang/srt/, its length, the line of each
top-level class and function and of each method (as `Class.method`), and the srt packages it
imports at module level (outside `if TYPE_CHECKING:`). For the methods the book reads call by
call (KEY_METHODS) it also lists each callee at the line of its first call, and for the Scheduler
class and its mixins the lines that read a `model_runner` or call its `forward` (SCHEDULER_CLASSES).

    python scripts/make_sglang_index.py --repo PATH_TO_SGLANG [--commit 64bca53...] [--check]

PATH_TO_SGLANG is a checkout or a bare git directory of SGLang; the commit must resolve there.
--check compares with the committed file and exits 1 if they differ.

    python scripts/make_sglang_index.py --update-from PATH/sglang/srt --only FILE [FILE ...]

re-reads only the named files from an unpacked copy (the sglang 0.5.9 wheel matches the pin in
most files), refusing any file whose known facts differ from the committed index.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "reference" / "sglang-index-64bca53.json"
COMMIT = "64bca5315f59ae6b7e57cf4d8a13180f0e7e518f"
SRT = "python/sglang/srt/"

# file -> methods whose calls are listed (the ones the book follows step by step).
KEY_METHODS = {
    "model_executor/model_runner.py": [
        "ModelRunner.__init__",
        "ModelRunner.initialize",
        "ModelRunner.forward",
        "ModelRunner._forward_raw",
        "ModelRunner.forward_decode",
        "ModelRunner.forward_extend",
        "ModelRunner.forward_split_prefill",
        "ModelRunner._preprocess_logits",
        "ModelRunner.sample",
        "ModelRunner.load_model",
        "ModelRunner.init_attention_backend",
        "ModelRunner.init_device_graphs",
    ],
    "model_executor/model_runner_kv_cache_mixin.py": ["ModelRunnerKVCacheMixin.init_memory_pool"],
    "managers/tp_worker.py": [
        "TpModelWorker.__init__",
        "TpModelWorker._init_model_config",
        "TpModelWorker._init_model_runner",
        "TpModelWorker._init_multi_layer_eagle_model_runners",
        "TpModelWorker.forward_batch_generation",
    ],
    "configs/model_config.py": ["ModelConfig.__init__", "ModelConfig.from_server_args"],
    "layers/moe/topk.py": ["select_experts"],
    "layers/logits_processor.py": ["LogitsProcessor.forward"],
    "layers/sampler.py": ["Sampler.forward"],
    "managers/scheduler_output_processor_mixin.py": ["SchedulerOutputProcessorMixin.maybe_collect_routed_experts"],
    "speculative/eagle_worker_v2.py": ["EagleDraftWorker.__init__"],
}
# Claim C1 counts how often SGLang's Scheduler reaches past its worker to a runner. The Scheduler
# class is assembled from these classes (scheduler.py:251 lists the mixins), so each one's file
# lists every read of an attribute chain ending in `.model_runner` inside that class ("reads"),
# and every call of a runner's `forward` there ("forward_calls").
SCHEDULER_CLASSES = {
    "managers/scheduler.py": "Scheduler",
    "managers/scheduler_output_processor_mixin.py": "SchedulerOutputProcessorMixin",
    "managers/scheduler_update_weights_mixin.py": "SchedulerUpdateWeightsMixin",
    "managers/scheduler_profiler_mixin.py": "SchedulerProfilerMixin",
    "managers/scheduler_metrics_mixin.py": "SchedulerMetricsMixin",
    "disaggregation/decode.py": "SchedulerDisaggregationDecodeMixin",
    "disaggregation/prefill.py": "SchedulerDisaggregationPrefillMixin",
    "multiplex/multiplexing_mixin.py": "SchedulerMultiplexMixin",
    "managers/scheduler_runtime_checker_mixin.py": "SchedulerRuntimeCheckerMixin",
    "managers/scheduler_pp_mixin.py": "SchedulerPPMixin",
    "managers/scheduler_dp_attn_mixin.py": "SchedulerDPAttnMixin",
    "dllm/mixin/scheduler.py": "SchedulerDllmMixin",
}
# Classes whose runner `forward` calls are all listed, not only the first (KEY_METHODS's rule):
# the worker calls it once for pipeline parallelism's last rank and once for the others.
FORWARD_CALLS = {"managers/tp_worker.py": "TpModelWorker"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _call_name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        parts, node = [func.attr], func.value
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        head = node.id if isinstance(node, ast.Name) else "(...)"
        return ".".join([head, *reversed(parts)])
    return None


def _calls(fn: ast.AST) -> list[list]:
    # Source order; an outer call of a chain (`f(x).g()`) sorts before the inner one it starts with.
    nodes = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
    found = [(n.lineno, n.col_offset, i, _call_name(n.func)) for i, n in enumerate(nodes)]
    out, seen = [], set()
    for line, _, _, name in sorted(found):
        if name and name not in seen:
            seen.add(name)
            out.append([line, name])
    return out


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _module_imports(tree: ast.Module) -> list[str]:
    """srt packages (first path part) imported at module level, outside TYPE_CHECKING blocks."""
    out: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.If) and _is_type_checking(node):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                for part in (
                    node.body,
                    node.orelse,
                    getattr(node, "finalbody", []),
                    *[h.body for h in getattr(node, "handlers", [])],
                ):
                    visit(part)
                continue
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("sglang.srt."):
                    out.add(name.split(".")[2])

    visit(tree.body)
    return sorted(out)


def index_file(rel: str, source: str) -> dict:
    tree = ast.parse(source)
    defs: list[list] = []
    nodes: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.append([node.lineno, node.name])
            nodes[node.name] = node
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    defs.append([item.lineno, f"{node.name}.{item.name}"])
                    nodes[f"{node.name}.{item.name}"] = item
    entry: dict = {"lines": len(source.splitlines()), "defs": defs, "imports": _module_imports(tree)}
    calls = {}
    for method in KEY_METHODS.get(rel, []):
        if method not in nodes:
            raise SystemExit(f"{rel} has no {method} at this commit: update KEY_METHODS")
        calls[method] = _calls(nodes[method])
    if calls:
        entry["calls"] = calls
    if rel in SCHEDULER_CLASSES:
        entry.update(_runner_uses(nodes[SCHEDULER_CLASSES[rel]], reads=True))
    if rel in FORWARD_CALLS:
        entry.update(_runner_uses(nodes[FORWARD_CALLS[rel]], reads=False))
    return entry


def _runner_uses(cls: ast.AST, reads: bool) -> dict:
    """Calls of a runner's `forward` inside a class and, with `reads`, reads of `<chain>.model_runner`.

    A runner's `forward` is `<...>model_runner.forward(...)`, or `name.forward(...)` where the class
    bound `name = <chain>.model_runner` (as `runner = self.tp_worker.model_runner`).
    """
    bound = {
        t.id
        for node in ast.walk(cls)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "model_runner"
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    reads_, forwards = [], []
    for node in ast.walk(cls):
        if reads and isinstance(node, ast.Attribute) and node.attr == "model_runner":
            reads_.append([node.lineno, ast.unparse(node)])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "forward":
            receiver = node.func.value
            if (isinstance(receiver, ast.Attribute) and receiver.attr == "model_runner") or (
                isinstance(receiver, ast.Name) and receiver.id in bound | {"model_runner"}
            ):
                forwards.append([node.lineno, _call_name(node.func)])
    out = {"reads": sorted(reads_)} if reads_ else {}
    return out | ({"forward_calls": sorted(forwards)} if forwards else {})


def build(repo: Path, commit: str) -> dict:
    full = _git(repo, "rev-parse", f"{commit}^{{commit}}").strip()
    paths = [p for p in _git(repo, "ls-tree", "-r", "--name-only", full, SRT).splitlines() if p.endswith(".py")]
    # One `git cat-file --batch` for every blob: far faster than a `git show` per file.
    request = "".join(f"{full}:{path}\n" for path in paths).encode()
    raw = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "--batch"], input=request, check=True, capture_output=True
    ).stdout
    files, pos = {}, 0
    for path in paths:
        header_end = raw.index(b"\n", pos)
        size = int(raw[pos:header_end].split()[2])
        blob = raw[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
        files[path[len(SRT) :]] = index_file(path[len(SRT) :], blob.decode("utf-8").removeprefix("\ufeff"))
    missing = [rel for rel in {**KEY_METHODS, **SCHEDULER_CLASSES, **FORWARD_CALLS} if rel not in files]
    if missing:
        raise SystemExit(f"not at this commit: {missing}")
    return {"commit": full, "root": SRT, "files": files}


def render(index: dict) -> str:
    # One file per line keeps diffs between commits readable.
    lines = ["{", f' "commit": {json.dumps(index["commit"])},', f' "root": {json.dumps(index["root"])},', ' "files": {']
    items = sorted(index["files"].items())
    for i, (rel, entry) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"  {json.dumps(rel)}: {json.dumps(entry, separators=(',', ':'))}{comma}")
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def update(srt: Path, rels: list[str]) -> dict:
    """The committed index with `rels` re-read from an unpacked copy of srt/ (a release wheel's).

    A file is taken only where everything the committed index already knows of it (length,
    definitions with their lines, imports, calls) is the same, the evidence that the copy is
    the file at the pinned commit; any other file is refused by name.
    """
    index = json.loads(OUT.read_text(encoding="utf-8"))
    for rel in rels:
        fresh = index_file(rel, (srt / rel).read_text(encoding="utf-8").removeprefix("\ufeff"))
        known = {k: v for k, v in index["files"][rel].items() if k not in ("reads", "forward_calls")}
        if {k: fresh.get(k) for k in known} != known or set(fresh) - set(known) - {"reads", "forward_calls"}:
            raise SystemExit(f"{srt / rel} is not the file at {COMMIT[:7]}: build from a checkout (--repo)")
        index["files"][rel] = fresh
    return index


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, help="an SGLang checkout or bare git directory")
    ap.add_argument("--commit", default=COMMIT)
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed index differs")
    ap.add_argument("--update-from", type=Path, metavar="SRT", help="re-read only --only's files from this srt/ copy")
    ap.add_argument("--only", nargs="+", default=[], metavar="FILE", help="files under srt/, for --update-from")
    args = ap.parse_args()
    if (args.repo is None) == (args.update_from is None):
        ap.error("give --repo, or --update-from with --only")
    text = render(update(args.update_from, args.only) if args.update_from else build(args.repo, args.commit))
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        print("index is up to date" if same else f"{OUT} differs from a fresh build")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)} ({len(text) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
