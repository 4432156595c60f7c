"""A GGUF file's tensor table and tensors, read with plain reads.

gguf-py's GGUFReader, which SGLang's GGUF loader uses, memory-maps the file and parses every
metadata value into numpy arrays when it opens it: for SmolLM2 the vocabulary and merges took
about 160 MB while the reader lived, and every page of the map the loader then touched counted as
resident memory until the map was closed. This module walks the header instead, keeping only the
metadata the loader asks for, and reads each tensor into its own buffer, as
safetensors_weights_iterator reads a safetensors file (weight_utils.py).

The format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md, versions 2 and 3): a
header (magic, version, tensor count, metadata count), the metadata as (key, type, value), then
one (name, dims, ggml type, offset) per tensor, then the tensors' data, aligned to
``general.alignment`` (32 by default), each at its offset from the data's start.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import BinaryIO

import torch

from minisgl.model_loader.weight_utils import _read_as_stored

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# The metadata value types of fixed size: uint8, int8, uint16, int16, uint32, int32, float32,
# bool, (8: string, 9: array), uint64, int64, float64.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# The unquantized ggml types a 1-D tensor (a norm, a bias) comes in.
_FLOAT_TYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}


@dataclass
class GGUFTensor:
    name: str
    dims: tuple[int, ...]  # ggml's order: dims[0] is the innermost (a row's length)
    tensor_type: int  # a ggml type id (gguf.GGMLQuantizationType)
    offset: int  # from the file's start
    row_bytes: int  # one row (dims[0] values) in its blocks


def read_tensor_table(f: BinaryIO, keys: tuple[str, ...]) -> tuple[dict[str, object], list[GGUFTensor]]:
    """The values of the metadata ``keys`` the file has (strings and scalars), and its tensors."""
    try:
        return _read_tensor_table(f, keys)
    except struct.error as e:  # a read came back short
        raise ValueError(f"{f.name}: the GGUF header is cut short ({e})") from None


def _read_tensor_table(f: BinaryIO, keys: tuple[str, ...]) -> tuple[dict[str, object], list[GGUFTensor]]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if f.read(4) != _MAGIC:
        raise ValueError(f"{f.name}: not a GGUF file")
    version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
    if version not in (2, 3):
        raise ValueError(f"{f.name}: GGUF version {version}; minisgl reads versions 2 and 3")
    metadata = {}
    for _ in range(n_kv):
        key = _string(f)
        (value_type,) = struct.unpack("<I", f.read(4))
        value = _value(f, value_type, keep=key in keys)
        if key in keys:
            metadata[key] = value
    infos = []
    for _ in range(n_tensors):
        name = _string(f)
        (n_dims,) = struct.unpack("<I", f.read(4))
        dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
        tensor_type, offset = struct.unpack("<IQ", f.read(12))
        infos.append((name, dims, tensor_type, offset))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = -(-f.tell() // alignment) * alignment
    tensors = []
    for name, dims, tensor_type, offset in infos:
        if tensor_type not in GGMLQuantizationType._value2member_map_:
            raise ValueError(f"{f.name}: tensor {name!r} has ggml type {tensor_type}, which gguf-py does not know")
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor_type)]
        tensors.append(GGUFTensor(name, dims, tensor_type, data_start + offset, dims[0] // block * block_bytes))
    return metadata, tensors


def read_tensor(f: BinaryIO, tensor: GGUFTensor) -> torch.Tensor:
    """A 1-D tensor as its float values; a matrix (or a stack of them) as its rows' bytes,
    uint8 [..., rows, row_bytes], the layout GGUFReader's ``data`` has."""
    f.seek(tensor.offset)
    rows = math.prod(tensor.dims[1:])
    data = _read_as_stored(f, rows * tensor.row_bytes, torch.uint8)
    if data is None:
        raise ValueError(f"{f.name}: tensor {tensor.name!r} is cut short (file truncated?)")
    if len(tensor.dims) > 1:
        return data.view(*reversed(tensor.dims[1:]), tensor.row_bytes)
    if tensor.tensor_type not in _FLOAT_TYPES:
        raise ValueError(f"{f.name}: 1-D tensor {tensor.name!r} has ggml type {tensor.tensor_type}, not a float type")
    return data.view(_FLOAT_TYPES[tensor.tensor_type])


def _string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", f.read(8))
    return f.read(length).decode("utf-8")


def _value(f: BinaryIO, value_type: int, keep: bool) -> object:
    """Read (keep) or skip one metadata value; arrays are always skipped."""
    if value_type in _SCALARS:
        fmt = _SCALARS[value_type]
        (value,) = struct.unpack(fmt, f.read(struct.calcsize(fmt)))
        return value
    if value_type == _STRING:
        if keep:
            return _string(f)
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(length, 1)
        return None
    if value_type == _ARRAY:
        item_type, count = struct.unpack("<IQ", f.read(12))
        if item_type in _SCALARS:
            f.seek(count * struct.calcsize(_SCALARS[item_type]), 1)
        else:
            for _ in range(count):
                _value(f, item_type, keep=False)
        return None
    raise ValueError(f"{f.name}: unknown GGUF metadata type {value_type}")
