"""Quantize a float checkpoint offline into SGLang's w8a8_int8 layout.

    python -m minisgl.tools.quantize_w8a8 --model SRC --out DST
    python -m minisgl.tools.quantize_w8a8 --model SRC --out DST --ignore down_proj   # keep every down_proj in float

SRC is anything --model-path takes (an HF folder, a .gguf file, the default model's name).
Every linear layer's weight becomes int8 [N, K] plus ``weight_scale`` float32 [N, 1] (symmetric,
one scale per output row: layers/quantization/int8_kernel.py), the experts' matrices too;
embeddings, the LM head, norms and MoE routers stay in float, as in SGLang's w8a8_int8
checkpoints. config.json gains ``"quantization_config": {"quant_method": "w8a8_int8"}``, so
the folder serves with no flag (or with ``--quantization w8a8_int8``), by minisgl or by SGLang.
``--ignore`` names layers to leave in float (SGLang's matching: a name the module's contains, or
``re:`` and a regular expression; layers/quantization/utils.py); they are written float and listed
in the config's ``ignore``. The parts of a fused layer (q, k and v; gate and up) go together.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
from typing import Sequence

import torch
from safetensors.torch import save_file

from minisgl.layers.quantization.int8_kernel import quantize_weight_int8
from minisgl.layers.quantization.utils import check_equal_or_regex_match, packed_modules_mapping, should_ignore_layer
from minisgl.model_loader.gguf import resolve_model_path
from minisgl.model_loader.weight_utils import safetensors_weights_iterator
from minisgl.models.registry import ModelRegistry

# The projections minisgl builds as linear layers (layers/linear.py) or experts (FusedMoE):
# Llama/Qwen attention and MLP, Mixtral's experts (w1, w2, w3), DeepSeek's MLA projections.
LINEAR_NAMES = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3",
    "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
)  # fmt: skip


def is_quantized_weight(name: str, tensor: torch.Tensor) -> bool:
    parts = name.split(".")
    return tensor.dim() == 2 and parts[-1] == "weight" and len(parts) > 1 and parts[-2] in LINEAR_NAMES


def kept_in_float(module: str, ignore: list[str], fused_mapping: dict[str, list[str]]) -> bool:
    """Whether the ignore list keeps this checkpoint module (q_proj, not minisgl's qkv_proj) in float,
    decided for its whole fused layer as the loader will (a list naming part of one is an error)."""
    if not ignore:
        return False
    if ".experts." in module and check_equal_or_regex_match(module, ignore):
        raise ValueError(f"--ignore matches the expert {module}: minisgl keeps only linear layers in float by name")
    prefix, part = module.rsplit(".", 1)
    fused = next((f for f, parts in fused_mapping.items() if part in parts), None)
    return should_ignore_layer(f"{prefix}.{fused}" if fused else module, ignore, fused_mapping)


def quantize_checkpoint(model: str, out: str, ignore: Sequence[str] = ()) -> pathlib.Path:
    src, dst = pathlib.Path(resolve_model_path(model)), pathlib.Path(out)
    config = json.loads((src / "config.json").read_text())
    fused_mapping = packed_modules_mapping(ModelRegistry.resolve_model_cls(config["architectures"]))
    dst.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in safetensors_weights_iterator(str(src)):
        if is_quantized_weight(name, tensor) and not kept_in_float(
            name.removesuffix(".weight"), list(ignore), fused_mapping
        ):
            tensors[name], tensors[name + "_scale"] = quantize_weight_int8(tensor)
        else:
            tensors[name] = tensor.contiguous()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    config["quantization_config"] = {"quant_method": "w8a8_int8", **({"ignore": list(ignore)} if ignore else {})}
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for path in src.iterdir():  # tokenizer and generation config, as they are
        if path.is_file() and path.suffix != ".safetensors" and path.name != "config.json":
            shutil.copyfile(path, dst / path.name)
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="float checkpoint: HF folder, .gguf file or model name")
    parser.add_argument("--out", required=True, help="folder to write the w8a8_int8 checkpoint to")
    parser.add_argument("--ignore", nargs="+", default=[], help="layers to keep in float (names, or re:PATTERN)")
    args = parser.parse_args()
    print(quantize_checkpoint(args.model, args.out, args.ignore))


if __name__ == "__main__":
    main()
