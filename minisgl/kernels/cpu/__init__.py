"""minisgl's CPU kernels: C++ built on this machine the first time they are needed.

Mirrors the CPU half of sgl-kernel (sgl-kernel/csrc/cpu/): the same op names
(``decode_attention_cpu``, ``extend_attention_cpu``, ``rmsnorm_cpu``, ``fused_add_rmsnorm_cpu``,
``silu_and_mul_cpu``, ``rotary_embedding_cpu``, ``convert_weight_packed``,
``weight_packed_linear``, ``fused_experts_cpu`` for float experts, ``topk_softmax_cpu`` for their router,
and for W8A8-int8 ``per_token_quant_int8``,
``int8_scaled_mm_with_quant`` and ``fused_experts_int8_cpu``)
registered under ``torch.ops.minisgl_kernel``, plus ``gguf_mul_mat`` and ``gguf_mul_mat_vec_a8``
for GGUF blocks kept quantized (sgl-kernel's GGUF GEMMs, ggml_mul_mat_a8 and ggml_mul_mat_vec_a8,
are CUDA-only), ``argmax_cpu`` for greedy sampling and ``apply_token_bitmask_cpu`` for grammar
masks, which sgl-kernel has no counterpart of, and ``convert_weight_packed_int8`` (sgl-kernel's
convert_weight_packed packs int8 weights too, by dtype). SGLang builds a wheel with CMake and
multiplies bf16 weights with AMX tiles; minisgl compiles the sources with
``torch.utils.cpp_extension.load`` and caches the library. Omitted: the fused MoE for fp8 and
int4 experts, fp8 and int4 GEMMs, MLA and the shared-memory all-reduce.

Which vector ISA: the one ATen itself dispatches to on this CPU,
``torch.backends.cpu.get_cpu_capability()`` (AVX512 or AVX2), since the sources use at::vec, whose
width is fixed at compile time. Every kernel, the packed GEMM included, is built at either width.
To build and run the narrower one on an AVX-512 machine, set ``ATEN_CPU_CAPABILITY=avx2`` (ATen
then reports, and dispatches to, AVX2; add ``ONEDNN_MAX_CPU_ISA=AVX2`` to hold oneDNN there too).
Each ISA gets its own cache directory, so switching back and forth rebuilds nothing twice.

The matrix engines are chosen at run time instead, in the same build: gemm_vnni.cpp's AVX512-BF16
code carries its ISA in a target attribute and AMX is reached through ATen's
``at::native::cpublas::brgemm``, so every x86 build contains both, and a bf16 (fp16) weight is
packed for them only where :func:`minisgl.kernels.cpu.features.cpu_features` reports the feature.
``MINISGL_BRGEMM=1`` sends what AMX would take (bf16 and int8 GEMM blocks over 4 rows, extend
attention's bf16 products) to brgemm on a CPU without AMX too, where oneDNN multiplies with AVX-512
instead (how the AMX paths are tested there); ``MINISGL_BRGEMM=0`` keeps an AMX CPU on minisgl's
own tiles (common.h's use_brgemm).

Building needs a C++ compiler and ninja and takes about 40 s on two cores, once per machine and ISA
(``python -m minisgl.kernels.cpu`` does it ahead of time; scripts/setup.sh calls it). Where it
cannot build, :func:`is_available` is False, a warning says why, and callers keep their
PyTorch paths; ``MINISGL_DISABLE_CPU_KERNELS=1`` does the same on purpose (for comparisons,
as in ``benchmarks/profile_step.py --torch-native``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
from pathlib import Path

import torch

from minisgl.kernels.cpu.features import cache_for_compile

logger = logging.getLogger(__name__)

_SOURCES = [
    "norm.cpp",
    "activation.cpp",
    "rope.cpp",
    "decode.cpp",
    "extend.cpp",
    "gemm.cpp",
    "gemm_vnni.cpp",
    "moe.cpp",
    "moe_int8.cpp",
    "topk.cpp",
    "sampling.cpp",
    "gemm_int8.cpp",
    "gemm_int8_vnni.cpp",
    "gemm_gguf.cpp",
    "gemm_gguf_vec.cpp",
    "gemm_gguf_vnni.cpp",
    "torch_extension_cpu.cpp",
    "aoti_shims.cpp",
]
_HEADERS = [
    "common.h",
    "gemm_int8.h",
    "attention_args.h",
    "attention_brgemm.h",
    "attention_dpbf16.h",
    "attention.h",
    "gemm.h",
    "gemm_vnni.h",
    "gemm_amx.h",
    "gemm_int8_vnni.h",
    "moe.h",
    "gguf_blocks.h",
    "ops.h",
]
# The flags that make at::vec use the same vector width ATen's own kernels use on this CPU.
_ISA_FLAGS = {
    "AVX512": [
        "-DCPU_CAPABILITY=AVX512",
        "-DCPU_CAPABILITY_AVX512",
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512dq",
        "-mfma",
    ],
    "AVX2": ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}


def _build_toolchain() -> list[str]:
    """What torch's build.ninja records besides the sources and flags: the compiler, and the
    include and library paths of this venv's torch and Python. Two venvs (or compilers) thus get
    two directories instead of rebuilding one in turn, each start blocking on the build lock."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths, library_paths

    cxx = os.environ.get("CXX", "c++")
    return [cxx, os.path.realpath(shutil.which(cxx) or cxx), sysconfig.get_paths()["include"]] + [
        *include_paths(),
        *library_paths(),
    ]


def _build_dir(flags: list[str]) -> Path:
    """One cache directory per source text, flags, torch version and toolchain (_build_toolchain),
    so a stale build is never loaded and a build another venv made is never overwritten."""
    digest = hashlib.sha256(torch.__version__.encode() + " ".join(flags).encode())
    digest.update("\0".join(_build_toolchain()).encode())
    for name in _SOURCES + _HEADERS:
        digest.update((Path(__file__).parent / name).read_bytes())
    root = Path(os.environ.get("MINISGL_KERNEL_CACHE", Path.home() / ".cache" / "minisgl" / "kernels"))
    path = root / f"cpu-{digest.hexdigest()[:16]}"
    (path / "src").mkdir(parents=True, exist_ok=True)
    return path


def _sources_in(build_dir: Path) -> list[str]:
    """The sources, copied into the build directory. ninja rebuilds when a source's *path* in
    build.ninja changes, so building from the checkout would recompile for every clone of it;
    the directory is named after the sources' content, so the copies never go stale."""
    for name in _SOURCES + _HEADERS:
        copy = build_dir / "src" / name
        if not copy.exists():
            shutil.copyfile(Path(__file__).parent / name, copy)
    return [str(build_dir / "src" / s) for s in _SOURCES]


@contextlib.contextmanager
def _build_lock(build_dir: Path):
    """One builder at a time, through a lock the kernel releases when its holder dies.
    torch's own lock is a file whose existence is the lock: a build killed midway leaves it
    behind and every later process waits on it forever. Under this lock, any such file is stale."""
    with open(build_dir / "build.flock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        yield


def can_build() -> bool:
    """Whether the kernels are wanted and could be built here, answered without building them
    (ServerArgs asks this to pick the CPU default; the build waits for the model runner)."""
    if os.environ.get("MINISGL_DISABLE_CPU_KERNELS") == "1":
        return False
    from torch.utils.cpp_extension import is_ninja_available

    return shutil.which(os.environ.get("CXX", "c++")) is not None and is_ninja_available()


@cache_for_compile  # CustomOp asks on every call, from inside CPUGraphRunner's compiled forward too
def is_available() -> bool:
    """Build (or load the cached build of) the kernels; False, with a warning, where that fails."""
    if os.environ.get("MINISGL_DISABLE_CPU_KERNELS") == "1":
        return False
    isa = torch.backends.cpu.get_cpu_capability()
    # -fopenmp: at::parallel_for is inlined from ATen's headers as an OpenMP loop. The library then
    # links libgomp.so.1 by soname and so shares the runtime (and thread pool) torch already loaded.
    flags = ["-O3", "-fopenmp", *_ISA_FLAGS.get(isa, [])]
    try:
        from torch.utils.cpp_extension import load

        build_dir = _build_dir(flags)
        with _build_lock(build_dir):
            load(
                name="minisgl_cpu_kernels",
                sources=_sources_in(build_dir),
                extra_cflags=flags,
                extra_ldflags=["-fopenmp"],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=False,
            )
        # Loaded again, by the same path, into the global symbol scope (RTLD_NOLOAD: no second copy):
        # a graph CPUGraphRunner compiled calls aoti_shims.cpp's functions by their C names, which
        # the dynamic linker resolves there when it loads the graph's library.
        ctypes.CDLL(str(build_dir / "minisgl_cpu_kernels.so"), mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except Exception as e:  # no compiler, no ninja, a read-only cache: fall back, loudly
        logger.warning("minisgl CPU kernels unavailable (%s: %s); using the PyTorch paths", type(e).__name__, e)
        return False
    return True


def has_packed_gemm() -> bool:
    """Whether ``weight_packed_linear`` can run: wherever the kernels built."""
    return is_available()


def packed_gemm_block_n() -> int:
    """Columns per panel of ``convert_weight_packed``: two vector registers of float32 (32 with
    AVX-512, 16 with AVX2); a weight's N must be a multiple of it."""
    return torch.ops.minisgl_kernel.weight_packed_block_n()
