"""minisgl: a compact, annotated reference implementation of SGLang's runtime.

Layering (mirrors python/sglang/srt/):
    entrypoints -> managers -> model_executor -> {models, layers, mem_cache}
"""

import os

# Triton kernels run on CPU only through the interpreter, and the interpreter is
# chosen when a kernel is *decorated*, i.e. when its module is imported. Setting
# it here, before any minisgl kernel module can be imported, keeps one code path
# for GPU and CPU. A user who sets TRITON_INTERPRET themselves wins.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

__version__ = "0.1.0"


def __getattr__(name: str):
    # ``minisgl.Engine`` as ``sgl.Engine``, imported on first use so that ``import minisgl``
    # stays cheap for code that needs only a submodule.
    if name == "Engine":
        from minisgl.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'minisgl' has no attribute {name!r}")
