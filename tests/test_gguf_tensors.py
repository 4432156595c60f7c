"""minisgl's plain-read GGUF tensor table (model_loader/gguf_tensors.py) against gguf-py's GGUFReader,
the reader SGLang's loader uses: the same tensors, shapes, types and bytes, on the shipped SmolLM2 file
and on a file with every kind of metadata value, another alignment and unquantized matrices."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter
from gguf.quants import quantize

from minisgl.model_loader.gguf import bundled_gguf_path
from minisgl.model_loader.gguf_tensors import read_tensor, read_tensor_table

KEYS = ("general.architecture", "general.alignment")


def _assert_same_as_gguf_reader(path) -> dict:
    reference = {t.name: t for t in GGUFReader(str(path)).tensors}
    with open(path, "rb") as f:
        metadata, tensors = read_tensor_table(f, KEYS)
        assert [t.name for t in tensors] == list(reference)
        for tensor in tensors:
            ref = reference[tensor.name]
            assert tensor.dims == tuple(int(d) for d in ref.shape) and tensor.tensor_type == int(ref.tensor_type)
            expected = torch.from_numpy(np.array(ref.data))
            if len(tensor.dims) > 1 and expected.dtype != torch.uint8:  # an unquantized matrix: its bytes
                expected = expected.view(torch.uint8)
            assert torch.equal(read_tensor(f, tensor), expected), tensor.name
    return metadata


def test_the_shipped_file_reads_as_gguf_reader_reads_it():
    assert _assert_same_as_gguf_reader(bundled_gguf_path()) == {"general.architecture": "llama"}


def test_every_metadata_type_another_alignment_and_unquantized_matrices(tmp_path):
    path = tmp_path / "mixed.gguf"
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_custom_alignment(64)
    writer.add_uint32("some.u32", 7)
    writer.add_float32("some.f32", 0.5)
    writer.add_bool("some.bool", True)
    writer.add_string("some.string", "s" * 36)  # puts the table's end where 32- and 64-byte alignment differ
    writer.add_array("some.strings", ["a", "bc", ""])
    writer.add_array("some.ints", [1, 2, 3])
    writer.add_tensor(
        "blk.0.attn_q.weight", quantize(rng.standard_normal((64, 96)).astype(np.float32), T.Q8_0), raw_dtype=T.Q8_0
    )
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(96).astype(np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((8, 96)).astype(np.float16))
    writer.add_tensor("blk.0.ffn_down.weight", rng.standard_normal((96, 8)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert _assert_same_as_gguf_reader(path) == {"general.architecture": "qwen2", "general.alignment": 64}
    with open(path, "rb") as f:
        _, tensors = read_tensor_table(f, KEYS)
        assert 0 < f.tell() % 64 <= 32 and min(t.offset for t in tensors) % 64 == 0


def test_a_file_that_is_not_gguf_or_is_cut_short_is_refused(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"PK\x03\x04" + bytes(100))
    with open(bogus, "rb") as f, pytest.raises(ValueError, match="not a GGUF file"):
        read_tensor_table(f, KEYS)
    shipped = bundled_gguf_path().read_bytes()
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(shipped[:4096])  # inside the vocabulary's strings
    with open(header_only, "rb") as f, pytest.raises(ValueError, match="the GGUF header is cut short"):
        read_tensor_table(f, KEYS)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(shipped[: len(shipped) - 1000])
    with open(cut, "rb") as f:
        _, tensors = read_tensor_table(f, KEYS)
        last = max(tensors, key=lambda t: t.offset)
        with pytest.raises(ValueError, match=f"tensor '{last.name}' is cut short"):
            read_tensor(f, last)
