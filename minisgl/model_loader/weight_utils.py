"""Read checkpoint tensors one at a time.

Mirrors python/sglang/srt/model_loader/weight_utils.py
(safetensors_weights_iterator, default_weight_loader).
"""

from __future__ import annotations

import glob
import os
from typing import Iterator

import torch
from safetensors import safe_open


def safetensors_weights_iterator(model_path: str) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_path}")
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def default_weight_loader(param: torch.nn.Parameter, loaded_weight: torch.Tensor) -> None:
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded_weight.shape)}")
    param.data.copy_(loaded_weight)
