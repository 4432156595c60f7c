"""How far a quantized model is from its float run: per layer, in logits, in tokens, in perplexity.

    python -m minisgl.tools.quant_accuracy --model SmolLM2-135M-Instruct --quantization w8a8_int8
    python -m minisgl.tools.quant_accuracy --model SRC --quant-model DST   # an offline checkpoint

Both models score the same fixed text (benchmarks/data/perplexity_text.txt, public domain):

- per-layer error: every linear layer and MoE block of the quantized model is fed the *float*
  model's input to it, so each number is that layer's own error, ||y_q - y|| / ||y||;
- logits: windows of the text, the next-token logits at their last position: cosine similarity
  and KL(float || quantized), averaged over windows;
- greedy agreement: from each window, how many of the next 16 greedy tokens match before the
  first difference, as a fraction;
- perplexity of the whole text (teacher-forced, from the engine's input logprobs).

tests/test_quantization.py runs the same measurements on tiny random checkpoints of every
architecture, with loose bounds; on a real model (SmolLM2) w8a8_int8's target is perplexity
within 2% of float.
"""

from __future__ import annotations

import argparse
import math
import pathlib
from typing import Optional

import torch
import torch.nn.functional as F

from minisgl.entrypoints.engine import Engine
from minisgl.layers.linear import LinearBase
from minisgl.layers.moe.fused_moe_triton.layer import FusedMoE

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


def compare(float_engine: Engine, quant_engine: Engine, text: Optional[str] = None, windows: int = 8) -> dict:
    ids = float_engine.tokenizer.encode(text if text is not None else TEXT_PATH.read_text())
    ids = ids[: _model(float_engine).config.max_position_embeddings - 1]  # room for the one generated token
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="the float reference")
    parser.add_argument("--quantization", default=None, help="a scheme to apply to --model while loading")
    parser.add_argument("--quant-model", default=None, help="or: an already quantized checkpoint")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    if (args.quantization is None) == (args.quant_model is None):
        parser.error("give exactly one of --quantization and --quant-model")
    common = dict(max_total_tokens=4096, dtype=args.dtype)
    float_engine = Engine(model_path=args.model, **common)
    quant_engine = Engine(model_path=args.quant_model or args.model, quantization=args.quantization, **common)
    try:
        report = compare(float_engine, quant_engine)
    finally:
        float_engine.shutdown()
        quant_engine.shutdown()
    for name, err in report.pop("per_layer_error").items():
        print(f"  {name:60s} {err:.5f}")
    for key, value in report.items():
        print(f"{key:22s} {value:.6f}")


if __name__ == "__main__":
    main()
