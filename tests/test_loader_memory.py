"""Loading in another dtype than the checkpoint's (model_loader/weight_utils.py): big tensors are
converted as they are read, so no whole float32 copy of one is ever held; the values are .to()'s.
And the loader as a whole (model_loader/loader.py): a bfloat16 model never sees a float32 weight."""

import pathlib
import shutil
import tracemalloc

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from minisgl.configs.model_config import ModelConfig
from minisgl.model_loader import weight_utils
from minisgl.model_loader.loader import get_model
from minisgl.model_loader.weight_utils import safetensors_weights_iterator
from minisgl.server_args import ServerArgs
from tests._models import tiny_model_dir


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


class _TensorSightings(TorchDispatchMode):
    """(op, dtype, shape) of every tensor an ATen op takes or returns while this mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, torch.dtype, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor):
                self.seen.append((str(func), t.dtype, tuple(t.shape)))
        return out


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_a_bfloat16_model_never_holds_a_float32_copy_of_a_weight(tmp_path, monkeypatch, stored):
    # The whole of get_model (building the modules, the weight loaders, packing for the GEMM), not
    # the reader alone: building in float32 and casting after, a weight_loader or a packing that
    # widens, or a loader that casts whole tensors after reading them would each hand some op a
    # float32 tensor of a weight's shape (or flattened). Reading goes through a 1 KiB chunk here,
    # so every matrix of the tiny model is big enough to be converted while it is read.
    monkeypatch.setattr(weight_utils, "CAST_CHUNK_BYTES", 1 << 10)
    src = pathlib.Path(tiny_model_dir("llama"))
    shutil.copytree(src, tmp_path, dirs_exist_ok=True)
    checkpoint = load_file(src / "model.safetensors")
    save_file({k: v.to(stored) for k, v in checkpoint.items()}, tmp_path / "model.safetensors")
    matrices = {s for t in checkpoint.values() if t.dim() == 2 for s in (t.shape, t.shape[::-1], (t.numel(),))}
    config = ModelConfig.from_server_args(ServerArgs(model_path=str(tmp_path), device="cpu", dtype="bfloat16"))
    with _TensorSightings() as ops:
        model = get_model(config, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    weights = [(op, dtype, shape) for op, dtype, shape in ops.seen if shape in matrices]
    assert {dtype for _, dtype, _ in weights} == {torch.bfloat16}, [w for w in weights if w[1] != torch.bfloat16]
