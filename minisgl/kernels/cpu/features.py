"""Which of the CPU's vector and matrix engines minisgl's kernels may use on this machine.

sgl-kernel's CPU kernels are compiled for AVX-512 (their vector code sits under
``CPU_CAPABILITY_AVX512``) and SGLang asks at run time whether the CPU has AMX
(``cpu_has_amx_support``, python/sglang/srt/utils/common.py:287 at 64bca53). minisgl builds one
source tree on every x86 CPU and picks a path per call (kernels/cpu/gemm_vnni.cpp reads ATen's
cpuinfo table in C++). This module reports that table to Python: the loader packs weights for the
engine that will multiply them, and the tests skip, by name, the paths this CPU lacks.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

# minisgl's name (the /proc/cpuinfo flag) -> torch's name for it (torch._C._cpu._get_cpu_capability()).
_FEATURES = {
    "amx_bf16": "amx_bf16",  # AMX tiles with bf16 dot products: minisgl's own from M = 4, brgemm M > 4
    "amx_fp16": "amx_fp16",  # the same for fp16 (Granite Rapids onwards)
    "amx_int8": "amx_int8",  # the same for W8A8-int8 (u8 x s8 -> s32 tiles), M > 4
    "avx512_bf16": "avx512_bf16",  # vdpbf16ps: the small-M bf16 GEMM
    "avx512_vnni": "avx512_vnni",  # vpdpbusd: the int8 GEMM (gemm_int8_vnni.cpp)
    "avx512f": "avx512_f",  # ATen's AVX512 build of at::vec: 32-column float panels
    "avx2": "avx2",  # ATen's AVX2 build: 16-column float panels
    "fma": "fma3",  # with avx2 and f16c: gemm_gguf.cpp's vector path
    "f16c": "f16c",  # fp16 -> fp32 in one instruction (the GGUF blocks' scales)
}


def _proc_cpuinfo_flags() -> set[str] | None:
    """The flags line of /proc/cpuinfo, or None where there is none (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return None


def cache_for_compile(fn):
    """functools.cache for a function of no arguments, in a form torch.compile can trace.

    Layers ask such questions (are the kernels built? which ISA?) on every call. Traced by
    CPUGraphRunner, a functools.cache'd function is stepped into and the graph stops at the first
    line dynamo cannot trace; a closure's list is read as a constant instead."""
    answer: list = []

    @functools.wraps(fn)
    def cached():
        if not answer:
            answer.append(fn())
        return answer[0]

    return cached


@cache_for_compile
def cpu_features() -> frozenset[str]:
    """The features of ``_FEATURES`` this CPU has and this process may use.

    A feature counts when torch's cpuinfo reports it and, on Linux, /proc/cpuinfo lists it too
    (a hypervisor can hide a feature from the kernel that CPUID still shows). AMX also needs the
    kernel's permission to use the tile registers, which ``torch._C._cpu._init_amx()`` requests.
    """
    torch_caps = torch._C._cpu._get_cpu_capability()
    flags = _proc_cpuinfo_flags()
    found = {
        name
        for name, torch_name in _FEATURES.items()
        if torch_caps.get(torch_name, False) and (flags is None or name in flags)
    }
    amx = {"amx_bf16", "amx_fp16", "amx_int8"}
    if amx & found and not (_onednn_may_use_amx() and torch._C._cpu._init_amx()):
        found -= amx
    return frozenset(found)


def _onednn_may_use_amx() -> bool:
    """False where ONEDNN_MAX_CPU_ISA holds oneDNN below AMX (AVX2, AVX512_CORE_BF16, ...): its
    brgemm, the only way minisgl reaches the tiles, then does not use them (below AVX-512 it raises),
    and the C++ side (common.h's engines) reads the variable the same way."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return cap in ("", "DEFAULT", "ALL") or "AMX" in cap


def vnni_gemm_engine(dtype: torch.dtype) -> str | None:
    """The feature that multiplies a VNNI-packed ``dtype`` weight here, or None where none does.

    bf16 needs vdpbf16ps (every AMX CPU has it too; with AMX, batches of 4 rows or more go to the tiles);
    fp16 needs AMX-FP16, since there is no fp16 counterpart of vdpbf16ps.
    """
    features = cpu_features()
    if dtype == torch.bfloat16 and "avx512_bf16" in features:  # also rounds brgemm's float32 results
        return "amx_bf16" if "amx_bf16" in features else "avx512_bf16"
    if dtype == torch.float16 and "amx_fp16" in features:
        return "amx_fp16"
    return None


def int8_gemm_engine() -> str:
    """The instruction that multiplies W8A8-int8 weights here: vpdpbusd where the CPU has
    AVX512-VNNI (weights packed in k-quads), else AVX2's vpmaddwd (k-pairs; a scalar loop in a
    build without AVX2)."""
    return "avx512_vnni" if "avx512_vnni" in cpu_features() else "avx2"


def gguf_gemm_uses_avx2() -> bool:
    """Whether gemm_gguf.cpp may take its AVX2 + FMA + F16C path here (else its scalar path)."""
    return {"avx2", "fma", "f16c"} <= cpu_features()


@functools.cache
def last_level_cache_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The size of the largest CPU cache sysfs lists for cpu0 (the L3 on x86), else 32 MiB.

    A benchmark that must time weights streamed from memory, as a forward streams them, sizes
    its working set from this (linear.py's _onednn_is_faster).
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for index in cache_dir.glob("index*"):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if size[:-1].isdigit() and size[-1] in units:
            sizes.append(int(size[:-1]) * units[size[-1]])
    return max(sizes, default=32 << 20)
