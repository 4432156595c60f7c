"""Quantize a float checkpoint offline into SGLang's w8a8_int8 layout.

    python -m minisgl.tools.quantize_w8a8 --model SRC --out DST

SRC is anything --model-path takes (an HF folder, a .gguf file, the default model's name).
Every linear layer's weight becomes int8 [N, K] plus ``weight_scale`` float32 [N, 1] (symmetric,
one scale per output row: layers/quantization/int8_kernel.py), the experts' matrices too;
embeddings, the LM head, norms and MoE routers stay in float, as in SGLang's w8a8_int8
checkpoints. config.json gains ``"quantization_config": {"quant_method": "w8a8_int8"}``, so
the folder serves with no flag (or with ``--quantization w8a8_int8``), by minisgl or by SGLang.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil

import torch
from safetensors.torch import save_file

from minisgl.layers.quantization.int8_kernel import quantize_weight_int8
from minisgl.model_loader.gguf import resolve_model_path
from minisgl.model_loader.weight_utils import safetensors_weights_iterator

# The projections minisgl builds as linear layers (layers/linear.py) or experts (FusedMoE):
# Llama/Qwen attention and MLP, Mixtral's experts (w1, w2, w3), DeepSeek's MLA projections.
LINEAR_NAMES = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3",
    "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
)  # fmt: skip


def is_quantized_weight(name: str, tensor: torch.Tensor) -> bool:
    parts = name.split(".")
    return tensor.dim() == 2 and parts[-1] == "weight" and len(parts) > 1 and parts[-2] in LINEAR_NAMES


def quantize_checkpoint(model: str, out: str) -> pathlib.Path:
    src, dst = pathlib.Path(resolve_model_path(model)), pathlib.Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in safetensors_weights_iterator(str(src)):
        if is_quantized_weight(name, tensor):
            tensors[name], tensors[name + "_scale"] = quantize_weight_int8(tensor)
        else:
            tensors[name] = tensor.contiguous()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "w8a8_int8"}
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for path in src.iterdir():  # tokenizer and generation config, as they are
        if path.is_file() and path.suffix != ".safetensors" and path.name != "config.json":
            shutil.copyfile(path, dst / path.name)
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="float checkpoint: HF folder, .gguf file or model name")
    parser.add_argument("--out", required=True, help="folder to write the w8a8_int8 checkpoint to")
    args = parser.parse_args()
    print(quantize_checkpoint(args.model, args.out))


if __name__ == "__main__":
    main()
