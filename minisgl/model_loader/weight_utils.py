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


# Bytes of a checkpoint tensor read at a time when it is converted as it is read.
CAST_CHUNK_BYTES = 16 << 20


def safetensors_weights_iterator(
    model_path: str, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of every *.safetensors file in the folder, in file order.

    Each tensor is read into its own buffer, so at most one checkpoint tensor is held at a time
    beside the model. A memory-mapped file would also work, but every page of it the loader
    touches counts as the process's resident memory until the file is closed: a float32
    checkpoint loaded into a bfloat16 model would then peak at the model plus the whole
    checkpoint (loading SmolLM2 in bfloat16 and serving four requests peaked at 1,232 MB with
    the map, 844 MB with reads).

    With ``dtype`` (the model's), a floating tensor larger than CAST_CHUNK_BYTES that is stored in
    another floating dtype is converted as it is read, a chunk at a time, so that loading a float32
    checkpoint in bfloat16 never holds a whole float32 copy of a big tensor (SmolLM2's embedding
    is 113 MB in float32, 57 MB in bfloat16). Smaller tensors come as stored: they cost no memory
    to speak of, and a parameter a model keeps in float32 whatever its dtype (DeepSeek's
    e_score_correction_bias) stays exact. A tensor stored in the model's dtype is never converted.
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
                stored = _SAFETENSORS_DTYPES.get(info["dtype"])
                if stored is None:
                    raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which minisgl does not load")
                begin, end = info["data_offsets"]
                f.seek(data_start + begin)
                floats = stored.is_floating_point and dtype is not None and dtype.is_floating_point
                if floats and dtype != stored and end - begin > CAST_CHUNK_BYTES:
                    tensor = _read_converting(f, end - begin, stored, dtype)
                else:
                    tensor = _read_as_stored(f, end - begin, stored)
                if tensor is None:
                    raise ValueError(f"{path}: tensor {name!r} is cut short (file truncated?)")
                yield name, tensor.reshape(info["shape"])


def _read_as_stored(f, nbytes: int, dtype: torch.dtype) -> torch.Tensor | None:
    buf = bytearray(nbytes)
    if f.readinto(buf) != nbytes:
        return None
    return torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)


def _read_converting(f, nbytes: int, stored: torch.dtype, target: torch.dtype) -> torch.Tensor | None:
    """The next ``nbytes`` of ``f`` (``stored`` values) as a ``target`` tensor, read a chunk at a time."""
    elt = stored.itemsize
    out = torch.empty(nbytes // elt, dtype=target)
    buf = bytearray(CAST_CHUNK_BYTES // elt * elt)
    done = 0
    while done < nbytes:
        size = min(len(buf), nbytes - done)
        if f.readinto(memoryview(buf)[:size]) != size:
            return None
        out[done // elt : (done + size) // elt].copy_(torch.frombuffer(buf, dtype=stored, count=size // elt))
        done += size
    return out


def default_weight_loader(param: torch.nn.Parameter, loaded_weight: torch.Tensor) -> None:
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded_weight.shape)}")
    param.data.copy_(loaded_weight)
