"""How far a quantized model is from its float run: per layer, in logits, in tokens, in perplexity.

    python -m minisgl.tools.quant_accuracy --model SmolLM2-135M-Instruct --quantization w8a8_int8
    python -m minisgl.tools.quant_accuracy --model SRC --quant-model DST   # an offline checkpoint
    python -m minisgl.tools.quant_accuracy --model SRC --quant-model DST --text README.md docs/chapters/*[^h].md
    python -m minisgl.tools.quant_accuracy --dtype bfloat16 --kv-cache-dtype fp8_e5m2   # a KV pool dtype alone
    python -m minisgl.tools.quant_accuracy --model SmolLM2-135M-Instruct --quantization gguf \
        --llama-perplexity .venv-llamacpp/bin/llama-perplexity               # beside llama.cpp's

Both models score the same fixed text (benchmarks/data/perplexity_text.txt, public domain):

- per-layer error: every linear layer and MoE block of the quantized model is fed the *float*
  model's input to it, so each number is that layer's own error, ||y_q - y|| / ||y||;
- logits: windows of the text, the next-token logits at their last position: cosine similarity
  and KL(float || quantized), averaged over windows;
- greedy agreement: from each window, how many of the next 16 greedy tokens match before the
  first difference, as a fraction;
- perplexity of the whole text (teacher-forced, from the engine's input logprobs);
- with --dither-seeds N: that ratio again under N dithers (each run's embeddings times
  1 + eps * randn), their mean and spread: on a short text one ratio is one draw of which
  activations round up, and it moves by percents from draw to draw;
- with --text FILE...: the ratio on other text, longer than the fixed one and not the text a
  choice was tuned on (say, which layers to keep in float): --windows windows of --window tokens
  spread over the files (fenced code blocks dropped from Markdown), the ratio of their summed
  log-perplexities (:func:`windowed_ppl_ratio`);
- with --llama-perplexity (a GGUF model; the binary scripts/setup_llama_cpp.sh builds): the text's
  perplexity measured llama.cpp's way by both engines, :func:`chunked_perplexity` in minisgl and
  llama-perplexity on the same .gguf file, side by side (the target: within 0.5%).

tests/test_quantization.py runs the same measurements on tiny random checkpoints of every
architecture, with loose bounds; on a real model (SmolLM2) w8a8_int8's target is perplexity
within 2% of float.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
from typing import Optional

import torch
import torch.nn.functional as F

from minisgl.entrypoints.engine import Engine
from minisgl.layers.linear import LinearBase
from minisgl.layers.moe.fused_moe_triton.layer import FusedMoE
from minisgl.layers.vocab_parallel_embedding import VocabParallelEmbedding
from minisgl.model_loader.gguf import resolve_model_path
from minisgl.tools import without_code_blocks

TEXT_PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "perplexity_text.txt"
GREEDY_TOKENS = 16


def _model(engine: Engine) -> torch.nn.Module:
    return engine.scheduler.tp_worker.model_runner.model


def perplexity(engine: Engine, ids: list[int]) -> float:
    out = engine.generate(
        input_ids=[ids],
        sampling_params={"temperature": 0, "max_new_tokens": 1},
        return_logprob=True,
        logprob_start_len=0,
    )
    logprobs = [lp for lp, _, _ in out[0]["meta_info"]["input_token_logprobs"][1:]]  # the first token has none
    return math.exp(-sum(logprobs) / len(logprobs))


def last_position_logits(engine: Engine, prompts: list[list[int]]) -> torch.Tensor:
    """[len(prompts), vocab] float32: the logits each prompt's prefill ends with."""
    captured: list[torch.Tensor] = []
    hook = _model(engine).logits_processor.register_forward_hook(
        lambda module, args, out: captured.append(out.next_token_logits.float().clone())
    )
    try:
        engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 1})
    finally:
        hook.remove()
    return torch.cat(captured)  # one prefill row per prompt, in order (max_new_tokens=1: no decode)


def layer_inputs_outputs(engine: Engine, ids: list[int]) -> dict[str, tuple[tuple, torch.Tensor]]:
    """Each linear layer's and MoE block's (inputs, output) in one prefill of ids."""
    records, hooks = {}, []

    def record(name: str):
        def hook(module, args, out) -> None:  # returns None: a hook's return value would replace `out`
            records.setdefault(name, (args, out))

        return hook

    for name, module in _model(engine).named_modules():
        if isinstance(module, (LinearBase, FusedMoE)):
            hooks.append(module.register_forward_hook(record(name)))
    try:
        engine.generate(input_ids=[ids], sampling_params={"temperature": 0, "max_new_tokens": 1})
    finally:
        for hook in hooks:
            hook.remove()
    return records


@torch.no_grad()
def per_layer_error(float_engine: Engine, quant_engine: Engine, ids: list[int]) -> dict[str, float]:
    quant_modules = dict(_model(quant_engine).named_modules())
    errors = {}
    for name, (args, ref) in layer_inputs_outputs(float_engine, ids).items():
        out = quant_modules[name](*args)
        errors[name] = float((out.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-12))
    return errors


def text_ids(engine: Engine, text: Optional[str] = None) -> list[int]:
    """The text's token ids (the fixed text by default), cut to leave room for one generated token."""
    ids = engine.tokenizer.encode(text if text is not None else TEXT_PATH.read_text())
    return ids[: _model(engine).config.max_position_embeddings - 1]


def compare(float_engine: Engine, quant_engine: Engine, text: Optional[str] = None, windows: int = 8) -> dict:
    ids = text_ids(float_engine, text)
    width = min(64, len(ids) // (windows + 1))
    prompts = [ids[i * width : (i + 1) * width] for i in range(windows)]
    ref, quant = last_position_logits(float_engine, prompts), last_position_logits(quant_engine, prompts)
    kl = F.kl_div(quant.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    params = {"temperature": 0, "max_new_tokens": GREEDY_TOKENS, "ignore_eos": True}
    agree = []
    for a, b in zip(float_engine.generate(input_ids=prompts, sampling_params=params),
                    quant_engine.generate(input_ids=prompts, sampling_params=params)):  # fmt: skip
        same = next((i for i, (x, y) in enumerate(zip(a["output_ids"], b["output_ids"])) if x != y), GREEDY_TOKENS)
        agree.append(same / GREEDY_TOKENS)
    layer_errors = per_layer_error(float_engine, quant_engine, prompts[0])
    ppl_float, ppl_quant = perplexity(float_engine, ids), perplexity(quant_engine, ids)
    return {
        "per_layer_error_max": max(layer_errors.values()),
        "per_layer_error_mean": sum(layer_errors.values()) / len(layer_errors),
        "per_layer_error": layer_errors,
        "logits_cosine": float(F.cosine_similarity(ref, quant, dim=-1).mean()),
        "kl": float(kl.mean()),
        "greedy_agreement": sum(agree) / len(agree),
        "ppl_float": ppl_float,
        "ppl_quant": ppl_quant,
        "ppl_ratio": ppl_quant / ppl_float,
    }


@contextlib.contextmanager
def dithered(engine: Engine, seed: int):
    """Within it, the embeddings' output is multiplied by 1 + eps * randn before the layers (eps: the
    machine epsilon of its dtype; the noise drawn from `seed`, so two engines of one model dtype that
    run the same batches see the same noise). Every activation downstream moves by about one float
    rounding, which a float model does not notice and a model that rounds its activations to int8
    does: a value near a half step flips to the other level."""
    embed = next((m for m in _model(engine).modules() if isinstance(m, VocabParallelEmbedding)), None)
    if embed is None:
        raise ValueError("dithering needs the model's input embedding on this rank (the first pipeline stage)")
    generator = torch.Generator().manual_seed(seed)

    def hook(module, args, out: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(out.shape, generator=generator) * torch.finfo(out.dtype).eps
        return (out.float() * (1 + noise)).to(out.dtype)

    handle = embed.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def dithered_ppl_ratios(float_engine: Engine, quant_engine: Engine, ids: list[int], seeds: int) -> list[float]:
    """The perplexity ratio once per seed, both models dithered alike (:func:`dithered`). A single
    ratio is one draw of which activations round up; on the fixed text (526 tokens) SmolLM2's ratio
    under W8A8 moved from 0.994 to 1.069 over 16 dithers (docs: models-and-layers, W8A8-int8), so the
    mean and spread of these say what one ratio cannot. The engines must not reuse cached prefixes
    (disable_radix_cache), or a dithered run would read the KV of an earlier one."""
    ratios = []
    for seed in range(seeds):
        with dithered(float_engine, seed):
            ppl_float = perplexity(float_engine, ids)
        with dithered(quant_engine, seed):
            ratios.append(perplexity(quant_engine, ids) / ppl_float)
    return ratios


def windowed_ppl_ratio(float_engine: Engine, quant_engine: Engine, ids: list[int], windows: int, window: int):
    """exp(mean over windows of log ppl_quant - log ppl_float), `windows` windows of `window` tokens
    spread evenly over ids (each scored on its own, from its first token), and each window's ratio."""
    if len(ids) < window:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one window of {window}")
    step = (len(ids) - window) // max(windows - 1, 1)
    logs = [
        math.log(perplexity(quant_engine, part)) - math.log(perplexity(float_engine, part))
        for part in (ids[i * step : i * step + window] for i in range(windows))
    ]
    return math.exp(sum(logs) / len(logs)), [math.exp(x) for x in logs]


def read_texts(paths: list[str]) -> str:
    """The files' text, Markdown's fenced code blocks dropped (prose is what perplexity should score)."""
    return "\n\n".join(without_code_blocks(pathlib.Path(p).read_text(encoding="utf-8")) for p in paths)


def chunked_perplexity(engine: Engine, ids: list[int], n_ctx: int, bos_id: Optional[int] = None) -> float:
    """Perplexity as llama-perplexity computes it (tools/perplexity/perplexity.cpp, perplexity()):
    the tokens cut into len // n_ctx chunks of n_ctx, each run on its own (the first token
    replaced by BOS where the vocabulary adds one), and only each chunk's second half scored, the
    tokens n_ctx / 2 + 1 .. n_ctx - 1, so that every scored token has at least n_ctx / 2 of context."""
    chunks = [ids[i * n_ctx : (i + 1) * n_ctx] for i in range(len(ids) // n_ctx)]
    if not chunks:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one chunk of n_ctx={n_ctx}")
    if bos_id is not None:
        chunks = [[bos_id, *chunk[1:]] for chunk in chunks]
    outs = engine.generate(
        input_ids=chunks,
        sampling_params={"temperature": 0, "max_new_tokens": 1},
        return_logprob=True,
        logprob_start_len=0,
    )
    first = n_ctx // 2
    scored = [lp for out in outs for lp, _, _ in out["meta_info"]["input_token_logprobs"][first + 1 : n_ctx]]
    return math.exp(-sum(scored) / len(scored))


def llama_cpp_perplexity(binary: str, gguf_file: str, n_ctx: int) -> tuple[float, str]:
    """llama-perplexity's final estimate on the same text and its chunk line, with a float32 KV
    cache (minisgl's, for a float32 run; llama.cpp's default is f16) and without flash attention.

    minisgl's attention is exact float32, and so is llama.cpp's without flash attention. Its
    flash-attention kernel (``-fa auto`` turns it on where the build has it) gave this text a
    perplexity 1.3% lower than its plain path on an AVX-512 EPYC (19.83 against 20.08), which
    would measure llama.cpp's attention kernels instead of the quantized weights."""
    cmd = [binary, "-m", gguf_file, "-f", str(TEXT_PATH), "-c", str(n_ctx), "-t", str(os.cpu_count())]
    cmd += ["--cache-type-k", "f32", "--cache-type-v", "f32", "-fa", "off"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    log = proc.stdout + proc.stderr
    estimate = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    if proc.returncode or not estimate:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode} with no final estimate:\n{log[-2000:]}")
    chunks = re.search(r"calculating perplexity over .*", log)
    return float(estimate.group(1)), chunks.group(0) if chunks else ""


def compare_with_llama_cpp(float_engine: Engine, quant_engine: Engine, binary: str, gguf_file: str, n_ctx: int):
    """Prints the text's chunked perplexity from minisgl's float and GGUF runs and from llama.cpp.
    The tokens are minisgl's (the HF tokenizer); llama-perplexity tokenizes the text itself with the
    vocabulary in the .gguf, and its log names the chunks it scored, to check that they match."""
    import gguf

    reader = gguf.GGUFReader(gguf_file)
    add_bos = (
        "tokenizer.ggml.add_bos_token" in reader.fields and reader.fields["tokenizer.ggml.add_bos_token"].contents()
    )
    bos_id = reader.fields["tokenizer.ggml.bos_token_id"].contents() if add_bos else None
    ids = float_engine.tokenizer.encode(TEXT_PATH.read_text())
    ids = ([bos_id] if add_bos else []) + ids  # as llama.cpp's tokenizer adds it to the text
    print(f"chunked perplexity, n_ctx={n_ctx}: {len(ids) // n_ctx} chunks of minisgl's {len(ids)} tokens")
    ppl_quant = chunked_perplexity(quant_engine, ids, n_ctx, bos_id)
    print(f"  minisgl float      {chunked_perplexity(float_engine, ids, n_ctx, bos_id):.6f}")
    print(f"  minisgl quantized  {ppl_quant:.6f}")
    ppl_llama, chunk_line = llama_cpp_perplexity(binary, gguf_file, n_ctx)
    print(f"  llama.cpp          {ppl_llama:.6f}   (llama-perplexity on {gguf_file}; it logged: {chunk_line})")
    print(f"  minisgl quantized / llama.cpp  {ppl_quant / ppl_llama:.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="the float reference")
    parser.add_argument("--quantization", default=None, help="a scheme to apply to --model while loading")
    parser.add_argument("--quant-model", default=None, help="or: an already quantized checkpoint")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--llama-perplexity", default=None, help="llama.cpp's llama-perplexity, to compare with")
    parser.add_argument("--llama-ctx", type=int, default=128, help="its -c: the text holds two such chunks or more")
    parser.add_argument("--dither-seeds", type=int, default=0, help="also the perplexity ratio under N dithers")
    parser.add_argument("--text", nargs="+", default=[], help="also the ratio over windows of these files")
    parser.add_argument("--windows", type=int, default=24, help="how many windows of --text")
    parser.add_argument("--window", type=int, default=512, help="tokens per window of --text")
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="the compared run's KV pool (bfloat16, fp8_e5m2), alone or with a scheme",
    )
    args = parser.parse_args()
    if args.quantization is not None and args.quant_model is not None:
        parser.error("give at most one of --quantization and --quant-model")
    if args.quantization is None and args.quant_model is None and args.kv_cache_dtype == "auto":
        parser.error("give --quantization, --quant-model or --kv-cache-dtype")
    if args.llama_perplexity and args.quantization != "gguf":
        parser.error("--llama-perplexity compares a GGUF model's run: give --quantization gguf")
    # No prefix reuse: a dithered run must compute every token itself (dithered_ppl_ratios).
    common = dict(max_total_tokens=4096, dtype=args.dtype, disable_radix_cache=True)
    float_engine = Engine(model_path=args.model, **common)
    quant_engine = Engine(
        model_path=args.quant_model or args.model,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        **common,
    )
    try:
        report = compare(float_engine, quant_engine)
        for name, err in report.pop("per_layer_error").items():
            print(f"  {name:60s} {err:.5f}")
        for key, value in report.items():
            print(f"{key:22s} {value:.6f}")
        if args.dither_seeds > 0:
            ratios = dithered_ppl_ratios(float_engine, quant_engine, text_ids(float_engine), args.dither_seeds)
            spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
            print(f"ppl_ratio over {len(ratios)} dithers: mean {statistics.mean(ratios):.6f}, standard deviation "
                  f"{spread:.6f}, from {min(ratios):.6f} to {max(ratios):.6f}")  # fmt: skip
        if args.text:
            ids = float_engine.tokenizer.encode(read_texts(args.text))
            ratio, each = windowed_ppl_ratio(float_engine, quant_engine, ids, args.windows, args.window)
            print(f"ppl_ratio over {len(each)} windows of {args.window} tokens of --text: {ratio:.6f} (windows "
                  f"from {min(each):.6f} to {max(each):.6f})")  # fmt: skip
        if args.llama_perplexity:  # the file the GGUF run's config.json points at (model_loader/gguf.py)
            config = json.loads((pathlib.Path(resolve_model_path(args.model, "gguf")) / "config.json").read_text())
            gguf_file = config["quantization_config"]["gguf_file"]
            compare_with_llama_cpp(float_engine, quant_engine, args.llama_perplexity, gguf_file, args.llama_ctx)
    finally:
        float_engine.shutdown()
        quant_engine.shutdown()


if __name__ == "__main__":
    main()
