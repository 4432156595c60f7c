"""Read checkpoint tensors one at a time.

Mirrors python/sglang/srt/model_loader/weight_utils.py
(safetensors_weights_iterator, default_weight_loader). SGLang opens each file with
safetensors' ``safe_open``, which memory-maps it; minisgl reads each tensor with a plain
``read`` instead (see safetensors_weights_iterator for why).
"""

from __future__ import annotations

import glob
import json
import os
import struct
from typing import Iterator

import torch

# The dtype names of the safetensors header (https://github.com/huggingface/safetensors).
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def safetensors_weights_iterator(model_path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every *.safetensors file in the folder, in file order.

    Each tensor is read into its own buffer, so at most one checkpoint tensor is held at a time
    beside the model. A memory-mapped file would also work, but every page of it the loader
    touches counts as the process's resident memory until the file is closed: a float32
    checkpoint loaded into a bfloat16 model would then peak at the model plus the whole
    checkpoint (loading SmolLM2 in bfloat16 and serving four requests peaked at 1,232 MB with
    the map, 844 MB with reads).
    """
    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_path}")
    for path in files:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
            header.pop("__metadata__", None)
            data_start = 8 + header_len
            for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
                dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
                if dtype is None:
                    raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which minisgl does not load")
                begin, end = info["data_offsets"]
                buf = bytearray(end - begin)
                f.seek(data_start + begin)
                if f.readinto(buf) != len(buf):
                    raise ValueError(f"{path}: tensor {name!r} is cut short (file truncated?)")
                tensor = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
                yield name, tensor.reshape(info["shape"])


def default_weight_loader(param: torch.nn.Parameter, loaded_weight: torch.Tensor) -> None:
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded_weight.shape)}")
    param.data.copy_(loaded_weight)
