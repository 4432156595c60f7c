"""Loading in another dtype than the checkpoint's (model_loader/weight_utils.py): big tensors are
converted as they are read, so no whole float32 copy of one is ever held; the values are .to()'s."""

import tracemalloc

import torch
from safetensors.torch import save_file

from minisgl.model_loader import weight_utils
from minisgl.model_loader.weight_utils import safetensors_weights_iterator


def test_big_tensors_arrive_converted_without_a_whole_copy_in_the_stored_dtype(tmp_path, monkeypatch):
    monkeypatch.setattr(weight_utils, "CAST_CHUNK_BYTES", 64 << 10)
    torch.manual_seed(0)
    tensors = {
        "big.f32": torch.randn(512, 257),  # 514 KiB: 9 chunks, the last one short
        "small.f32": torch.randn(10),  # under a chunk: as stored (a float32 parameter stays exact)
        "big.bf16": torch.randn(300, 300).bfloat16(),  # already the model dtype: never converted
        "ids.i64": torch.arange(40_000),  # not floating: as stored
    }
    save_file(tensors, tmp_path / "model.safetensors")
    tracemalloc.start()
    try:
        got, peaks, held = {}, {}, 0
        for name, tensor in safetensors_weights_iterator(str(tmp_path), torch.bfloat16):
            got[name] = tensor
            peaks[name] = tracemalloc.get_traced_memory()[1] - held  # read buffers are Python bytearrays
            tracemalloc.reset_peak()
            held = tracemalloc.get_traced_memory()[0]  # the tensors kept so far
    finally:
        tracemalloc.stop()
    assert got["big.f32"].dtype == torch.bfloat16 and torch.equal(got["big.f32"], tensors["big.f32"].bfloat16())
    assert peaks["big.f32"] < 2 * (64 << 10) < tensors["big.f32"].nbytes  # one chunk at a time
    for name in ("small.f32", "big.bf16", "ids.i64"):
        assert got[name].dtype == tensors[name].dtype and torch.equal(got[name], tensors[name]), name
    # and upwards: a 16-bit checkpoint in a float32 model, exactly
    (_, up), *_ = [(n, t) for n, t in safetensors_weights_iterator(str(tmp_path), torch.float32) if n == "big.bf16"]
    assert up.dtype == torch.float32 and torch.equal(up, tensors["big.bf16"].float())
