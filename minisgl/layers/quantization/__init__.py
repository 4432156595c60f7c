"""Quantization schemes by name, as ``--quantization`` and checkpoints' quant_method spell them.

Mirrors python/sglang/srt/layers/quantization/__init__.py (QUANTIZATION_METHODS,
get_quantization_config). SGLang registers 25 schemes (fp8, awq, gptq, gguf, w8a8_int8,
compressed-tensors, ...), most of them GPU kernels; minisgl implements the ones below.
"""

from __future__ import annotations

from minisgl.layers.quantization.base_config import QuantizationConfig
from minisgl.layers.quantization.gguf import GGUFConfig
from minisgl.layers.quantization.w8a8_int8 import W8A8Int8Config

QUANTIZATION_METHODS: dict[str, type[QuantizationConfig]] = {
    "gguf": GGUFConfig,
    "w8a8_int8": W8A8Int8Config,
}


def get_quantization_config(quantization: str) -> type[QuantizationConfig]:
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(
            f"unknown quantization method {quantization!r}: minisgl implements {sorted(QUANTIZATION_METHODS)}"
        )
    return QUANTIZATION_METHODS[quantization]
