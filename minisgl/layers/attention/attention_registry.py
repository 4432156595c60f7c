"""The attention backends by name: ``@register_attention_backend`` and the table it fills.

Mirrors python/sglang/srt/layers/attention/attention_registry.py (ATTENTION_BACKENDS,
register_attention_backend, one ``create_*_backend`` factory per name). A factory imports
its backend only when called, so ServerArgs can check a name against the table without
importing Triton or building C++ kernels; ModelRunner.init_attention_backend calls the
factory once, at start-up. A new backend is one decorated factory here, nothing else.
SGLang registers some twenty backends (FlashInfer, FlashAttention, MLA variants, ...);
minisgl has three.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from minisgl.layers.attention.base_attn_backend import AttentionBackend

ATTENTION_BACKENDS: dict[str, Callable[..., "AttentionBackend"]] = {}


def register_attention_backend(name: str):
    """Register ``fn(model_runner) -> AttentionBackend`` under ``name`` (SGLang's decorator)."""

    def decorator(fn: Callable[..., "AttentionBackend"]) -> Callable[..., "AttentionBackend"]:
        ATTENTION_BACKENDS[name] = fn
        return fn

    return decorator


@register_attention_backend("torch_native")
def create_torch_native_backend(runner) -> "AttentionBackend":
    from minisgl.layers.attention.torch_native_backend import TorchNativeAttnBackend

    return TorchNativeAttnBackend(runner)


@register_attention_backend("triton")
def create_triton_backend(runner) -> "AttentionBackend":
    from minisgl.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend(runner)


@register_attention_backend("intel_amx")
def create_intel_amx_backend(runner) -> "AttentionBackend":
    from minisgl.layers.attention.intel_amx_backend import IntelAMXAttnBackend

    return IntelAMXAttnBackend(runner)
