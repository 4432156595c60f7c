"""C11: the attention backend is chosen at init from server_args and the device, never inside forward."""

import ast
from pathlib import Path

import pytest

from minisgl import tracing
from minisgl.kernels.cpu import is_available as cpu_kernels_available
from minisgl.layers.attention.intel_amx_backend import IntelAMXAttnBackend
from minisgl.layers.attention.torch_native_backend import TorchNativeAttnBackend
from minisgl.server_args import ServerArgs

# SGLang's CPU default; torch_native where the C++ kernels cannot be built.
CPU_DEFAULT = "intel_amx" if cpu_kernels_available() else "torch_native"


def test_c11_default_backend_by_device(tiny_llama):
    assert ServerArgs(model_path=tiny_llama, device="cpu").attention_backend == CPU_DEFAULT
    assert ServerArgs(model_path=tiny_llama, device="cuda").attention_backend == "triton"
    with pytest.raises(ValueError, match="attention_backend"):
        ServerArgs(model_path=tiny_llama, attention_backend="flashinfer")


def test_c11_chosen_in_init_attention_backend(tiny_llama):
    from minisgl.entrypoints.engine import Engine

    with tracing.record() as events:
        engine = Engine(model_path=tiny_llama, max_total_tokens=64)
    runner = engine.scheduler.tp_worker.model_runner
    assert isinstance(
        runner.attn_backend, IntelAMXAttnBackend if CPU_DEFAULT == "intel_amx" else TorchNativeAttnBackend
    )
    chosen = [e for e in events if e["event"] == "ModelRunner.init_attention_backend" and e["phase"] == "begin"]
    assert chosen == [{"event": "ModelRunner.init_attention_backend", "phase": "begin", "backend": CPU_DEFAULT}]
    backend = runner.attn_backend
    engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3})
    assert runner.attn_backend is backend


def test_c11_forward_path_never_selects_a_backend():
    import minisgl.model_executor.model_runner as mr

    tree = ast.parse(Path(mr.__file__).read_text())
    runner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunner")
    for fn in runner.body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith(("forward", "_forward", "sample")):
            src = ast.unparse(fn)
            assert "_get_attention_backend" not in src and "attention_backend" not in src, fn.name


def test_c11_a_registered_backend_is_accepted_and_built(tiny_llama, request):
    """A backend is one @register_attention_backend factory: ServerArgs then accepts its name and
    the model runner builds it; the CUDA-graph hooks are in the base contract, off by default."""
    from minisgl.entrypoints.engine import Engine
    from minisgl.layers.attention import attention_registry

    request.addfinalizer(lambda: attention_registry.ATTENTION_BACKENDS.pop("plain_sdpa", None))
    with pytest.raises(ValueError, match="torch_native"):
        ServerArgs(model_path=tiny_llama, attention_backend="plain_sdpa")

    class PlainSdpa(TorchNativeAttnBackend):
        pass

    attention_registry.register_attention_backend("plain_sdpa")(PlainSdpa)
    engine = Engine(model_path=tiny_llama, max_total_tokens=64, attention_backend="plain_sdpa")
    backend = engine.scheduler.tp_worker.model_runner.attn_backend
    assert type(backend) is PlainSdpa and not backend.supports_cuda_graph
    with pytest.raises(NotImplementedError, match="PlainSdpa"):
        backend.init_forward_metadata_capture_cuda_graph(1)
    assert engine.generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 2})["meta_info"]["completion_tokens"]
