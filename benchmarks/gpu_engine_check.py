"""GPU check of the engine: HF parity, both loops with and without CUDA graphs, EAGLE.

    python benchmarks/gpu_engine_check.py                               # the default model
    python benchmarks/gpu_engine_check.py --model-path DIR --random-weights
    python benchmarks/gpu_engine_check.py --only loops

Needs a CUDA device (on a CPU-only machine it says so and exits with status 1).
benchmarks/gpu_check.py checks the Triton kernels alone; this runs whole engines:

1. parity: every tiny architecture (minisgl.tools.make_tiny_model) on the GPU in float32
   against transformers on the GPU: each generated token is HF's argmax after the same
   prefix, and its logprob is HF's.
2. loops: the model at --model-path through the four combinations of SGLang's two
   event loops (normal, overlap) and CUDA graphs (off, on): greedy tokens against the
   normal eager loop, then TTFT and decode tok/s per stream at batch 1, 4, 16 and 64,
   in bfloat16, as benchmarks/bench_one_batch.py measures them on a CPU.
3. eagle: EAGLE (chain and tree) with a random head on the tiny Llama, the target's
   true continuation planted along one branch (minisgl.tools.eagle_oracle): greedy
   tokens equal to decoding without speculation, the KV pool whole afterwards.

--random-weights keeps the model's config and tokenizer and draws its weights with
transformers' own initialisation (seed 0), for a machine that lacks the checkpoint:
shapes, and so timings, are the real model's; the tokens mean nothing.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from workload import make_workload  # noqa: E402

from minisgl.entrypoints.engine import Engine  # noqa: E402
from minisgl.model_loader.gguf import DEFAULT_MODEL_PATH  # noqa: E402
from minisgl.tools.make_tiny_model import ARCHS  # noqa: E402
from tests._models import tiny_model_dir  # noqa: E402

LOOPS = {
    "normal, eager": dict(disable_overlap_schedule=True, disable_cuda_graph=True),
    "normal, graphs": dict(disable_overlap_schedule=True, disable_cuda_graph=False),
    "overlap, eager": dict(disable_overlap_schedule=False, disable_cuda_graph=True),
    "overlap, graphs": dict(disable_overlap_schedule=False, disable_cuda_graph=False),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def random_checkpoint_like(model_path: str, out: Path) -> str:
    """model_path's config and tokenizer, with weights from transformers' initialisation."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_path)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (Path(model_path) / name).exists():
            shutil.copy(Path(model_path) / name, out / name)
    return str(out)


@torch.no_grad()
def check_parity(device: str) -> None:
    """16 greedy tokens of 4 prompts, minisgl against transformers, float32: HF scores minisgl's
    sequence once, and each token must be its argmax, with minisgl's logprob."""
    from transformers import AutoModelForCausalLM

    print("== parity with transformers on the device, float32 (tiny random checkpoints)")
    prompts = [[5, 6, 7], [100, 101, 102, 103, 104, 105, 106, 107, 108], [300] * 20, list(range(200, 240))]
    for arch in ARCHS:
        path = tiny_model_dir(arch)
        engine = Engine(model_path=path, dtype="float32", device=device, max_total_tokens=4096, disable_cuda_graph=True)
        outs = engine.generate(
            input_ids=prompts,
            sampling_params={"temperature": 0, "max_new_tokens": 16, "ignore_eos": True},
            return_logprob=True,
            logprob_start_len=0,
            top_logprobs_num=1,
        )
        engine.shutdown()
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        same, worst = 0, 0.0
        for ids, out in zip(prompts, outs):
            seq = ids + out["output_ids"]
            logprobs = torch.log_softmax(hf(torch.tensor([seq], device=device)).logits[0].float(), -1)
            # Every generated token's logprob under HF, against minisgl's own.
            ours = torch.tensor([entry[0] for entry in out["meta_info"]["output_token_logprobs"]])
            theirs = logprobs[len(ids) - 1 : len(seq) - 1].gather(
                1, torch.tensor(out["output_ids"], device=device)[:, None]
            )
            worst = max(worst, (ours - theirs.flatten().cpu()).abs().max().item())
            same += int(out["output_ids"] == logprobs[len(ids) - 1 : len(seq) - 1].argmax(-1).tolist())
        print(f"    {arch:<12} greedy tokens as HF's argmax: {same}/{len(prompts)}   max|logprob diff| {worst:.1e}")


def run_batch(engine: Engine, prompts: list[list[int]], n: int) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    outs = engine.generate(
        input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": n, "ignore_eos": True}
    )
    return time.perf_counter() - start, [o["output_ids"] for o in outs]


def check_loops(model_path: str, device: str, batch_sizes: list[int], output_len: int) -> None:
    """Both loops, CUDA graphs off and on: tokens against the normal eager loop, and latency."""
    print(f"== loops x CUDA graphs, bfloat16, {model_path}: 64-token prompts, {output_len} new tokens")
    print(f"    {'loop':<16} {'batch':>5} {'TTFT ms':>8} {'tok/s/stream':>13} {'tok/s':>8}  tokens as normal eager")
    reference: dict[int, list[list[int]]] = {}
    for name, loop in LOOPS.items():
        start = time.perf_counter()
        engine = Engine(
            model_path=model_path,
            dtype="bfloat16",
            device=device,
            max_total_tokens=1 << 15,
            disable_radix_cache=True,
            cuda_graph_max_bs=max(batch_sizes),
            **loop,
        )
        graphs = engine.scheduler.tp_worker.model_runner.graph_runner is not None
        print(f"    {name}: engine ready in {time.perf_counter() - start:.1f} s (graphs captured: {graphs})")
        vocab = engine.scheduler.tp_worker.model_runner.model_config.vocab_size
        for bs in batch_sizes:
            workload = make_workload(bs, 64, 64, output_len, output_len, vocab, seed=bs)
            prompts = [p for p, _ in workload]
            run_batch(engine, prompts, 4)  # Triton's compiles, the allocator
            ttft, _ = run_batch(engine, prompts, 1)
            total, ids = run_batch(engine, prompts, output_len)
            per_stream = (output_len - 1) / (total - ttft)
            ref = reference.setdefault(bs, ids)
            same = sum(a == b for a, b in zip(ids, ref))
            print(f"    {name:<16} {bs:>5} {1e3 * ttft:8.1f} {per_stream:13.1f} {per_stream * bs:8.0f}  {same}/{bs}")
        allocator = engine.scheduler.token_to_kv_pool_allocator
        assert allocator.available_size() == engine.scheduler.worker_info.max_total_num_tokens, "KV slots leaked"
        engine.shutdown()


def check_eagle(device: str) -> None:
    """EAGLE chain and tree on the device: the target's greedy tokens, every KV slot given back."""
    from minisgl.tools.eagle_oracle import plant_oracle
    from minisgl.tools.make_eagle_head import make_eagle_head

    print("== EAGLE on the device (tiny Llama, random head with the target's continuation planted)")
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]]
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    kw = dict(device=device, dtype="float32", max_total_tokens=1024, attention_backend="torch_native")
    path = tiny_model_dir("llama")
    plain = Engine(model_path=path, **kw)
    expected = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
    plain.shutdown()
    head = make_eagle_head(path, Path(tempfile.mkdtemp()) / "head")
    shapes = {
        "chain": dict(speculative_num_steps=3, speculative_eagle_topk=1),
        "tree": dict(speculative_num_steps=3, speculative_eagle_topk=3, speculative_num_draft_tokens=6),
    }
    for name, shape in shapes.items():
        engine = Engine(
            model_path=path, speculative_algorithm="EAGLE", speculative_draft_model_path=str(head), **kw, **shape
        )
        plant_oracle(engine.scheduler.draft_worker, {tuple(p): e for p, e in zip(prompts, expected)}, depth=2)
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        accepted = sum(o["meta_info"].get("spec_accept_token_num", 0) for o in outs)
        assert engine.flush_cache()
        whole = (
            engine.scheduler.token_to_kv_pool_allocator.available_size()
            == engine.scheduler.worker_info.max_total_num_tokens
        )
        same = sum(o["output_ids"] == e for o, e in zip(outs, expected))
        print(
            f"    {name:<6} tokens as without speculation: {same}/{len(prompts)}, "
            f"accepted drafts {accepted}, pool whole: {whole}"
        )
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=DEFAULT_MODEL_PATH)
    parser.add_argument(
        "--random-weights", action="store_true", help="the model's config and tokenizer, random weights"
    )
    parser.add_argument("--only", nargs="+", choices=("parity", "loops", "eagle"), default=["parity", "loops", "eagle"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself (no graphs there)")
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_engine_check: no CUDA device here. On a CPU the test suite runs the same checks.")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device: {name}  torch {torch.__version__}")
    model_path = args.model_path
    if args.random_weights:
        model_path = random_checkpoint_like(model_path, Path(tempfile.mkdtemp(prefix="minisgl-random-")))
    for section in args.only:
        if section == "parity":
            check_parity(args.device)
        elif section == "loops":
            check_loops(model_path, args.device, args.batch_sizes, args.output_len)
        else:
            check_eagle(args.device)


if __name__ == "__main__":
    main()
