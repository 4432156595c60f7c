"""The CPU's matrix engines (minisgl/kernels/cpu/gemm_vnni.cpp, features.py) against torch.

The VNNI layout is pure data movement and is checked on every CPU. The GEMMs that read it run
only where the CPU has their engine (vdpbf16ps: avx512_bf16; AMX tiles: amx_bf16, amx_fp16);
elsewhere their tests skip and say which feature is missing. The AMX path's code runs on any
avx512_bf16 CPU with MINISGL_BRGEMM=1, oneDNN's brgemm multiplying without tiles there. The code
itself is compiled on every x86 machine (the AVX-512 functions carry their ISA in a target attribute), and
test_matrix_engine_sources_compile_with_their_isa_flags compiles it once more as an AVX-512/AMX
build does, so that a machine without those engines still catches an error in it.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minisgl.kernels.cpu import is_available
from minisgl.kernels.cpu.features import (
    _FEATURES,
    _proc_cpuinfo_flags,
    cpu_features,
    last_level_cache_bytes,
    vnni_gemm_engine,
)
from minisgl.layers import linear

pytestmark = pytest.mark.skipif(not is_available(), reason="the CPU kernels could not be built on this machine")
ops = torch.ops.minisgl_kernel
SOURCES = Path(linear.__file__).parents[1] / "kernels" / "cpu"


def needs(feature: str) -> None:
    if feature not in cpu_features():
        pytest.skip(f"needs {feature}; this CPU has {sorted(cpu_features())}")


def force_brgemm(monkeypatch, dtype: torch.dtype) -> None:
    """Set MINISGL_BRGEMM=1 for a test of the brgemm path in ``dtype`` (bfloat16 or int8), or skip
    where oneDNN's brgemm does not run: it needs AVX-512, so an AVX2 CPU, or oneDNN held below it
    with ONEDNN_MAX_CPU_ISA, gets an error that says so instead."""
    needs("avx512_bf16" if dtype == torch.bfloat16 else "avx512_vnni")
    monkeypatch.setenv("MINISGL_BRGEMM", "1")
    try:  # 8 rows: a block brgemm takes
        if dtype == torch.bfloat16:
            packed = ops.convert_weight_packed_vnni(torch.ones(32, 64).bfloat16())
            ops.weight_packed_linear(torch.ones(8, 64).bfloat16(), packed, None)
        else:
            packed = ops.convert_weight_packed_int8_vnni(torch.ones(16, 64, dtype=torch.int8))
            ops.int8_scaled_mm_with_quant(torch.ones(8, 64), packed, torch.ones(16), None, torch.float32, True)
    except RuntimeError as error:
        if "MINISGL_BRGEMM=1, but oneDNN's brgemm does not take" not in str(error):
            raise
        pytest.skip(f"oneDNN's brgemm does not run here: {error}")


def test_cpu_features_agree_with_torch_and_proc_cpuinfo():
    features = cpu_features()
    caps = torch._C._cpu._get_cpu_capability()
    assert features <= set(_FEATURES)
    assert all(caps[_FEATURES[name]] for name in features)
    flags = _proc_cpuinfo_flags()
    if flags is not None:
        assert features <= flags
        assert {n for n in ("avx2", "avx512f", "avx512_bf16") if n in flags and caps[_FEATURES[n]]} <= features
    # ATen dispatches to AVX512 only where the CPU has it (ATEN_CPU_CAPABILITY=avx2 may hold it lower)
    assert torch.backends.cpu.get_cpu_capability() != "AVX512" or "avx512f" in features


def test_onednn_held_below_amx_hides_the_tiles(monkeypatch):
    """With ONEDNN_MAX_CPU_ISA below AMX, cpu_features() leaves the AMX features out (the loader
    then packs no float16 weight for tiles the kernels will not reach); at or above AMX, it keeps them."""
    for cap in ("AVX2", "avx512_core_bf16"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert not {"amx_bf16", "amx_fp16", "amx_int8"} & cpu_features.__wrapped__()
    for cap in ("AVX512_CORE_AMX", "DEFAULT"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert cpu_features.__wrapped__() == cpu_features()


def test_last_level_cache_is_the_largest_cache_sysfs_lists(tmp_path):
    """_onednn_is_faster sizes its streamed weights from this; a cache it cannot read counts as 32 MiB."""
    for index, size in enumerate(["48K", "32K", "1024K", "32768K", "unknown"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32768 << 10
    (tmp_path / "index3" / "size").write_text("2M\n")
    assert last_level_cache_bytes.__wrapped__(tmp_path) == 2 << 20
    assert last_level_cache_bytes(tmp_path / "missing") == 32 << 20


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_vnni_packing_is_sglangs_layout(dtype):
    """[N, K] -> [N / 32, K / 2, 32, 2]: element (nb, k2, n, d) is W[32 nb + n, 2 k2 + d]."""
    weight = torch.randn(96, 70).to(dtype)
    packed = ops.convert_weight_packed_vnni(weight)
    assert packed.shape == (3, 35, 32, 2) and packed.dtype == dtype and packed.is_contiguous()
    nb, k2, n, d = torch.meshgrid(*(torch.arange(s) for s in packed.shape), indexing="ij")
    assert torch.equal(packed, weight[32 * nb + n, 2 * k2 + d])


def test_vnni_packing_rejects_what_the_engines_cannot_read():
    with pytest.raises(RuntimeError, match="bfloat16 or float16"):
        ops.convert_weight_packed_vnni(torch.randn(64, 64))
    with pytest.raises(RuntimeError, match="multiple of 32 and K even"):
        ops.convert_weight_packed_vnni(torch.randn(48, 64).bfloat16())
    with pytest.raises(RuntimeError, match="multiple of 32 and K even"):
        ops.convert_weight_packed_vnni(torch.randn(64, 63).bfloat16())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pack_linear_weight_uses_the_vnni_layout_exactly_where_an_engine_reads_it(dtype, monkeypatch):
    weight = torch.randn(64, 70).to(dtype)
    assert (linear.pack_linear_weight(weight).dim() == 4) == (vnni_gemm_engine(dtype) is not None)
    monkeypatch.setattr(linear, "vnni_gemm_engine", lambda dtype: "avx512_bf16")  # as on such a CPU
    assert torch.equal(linear.pack_linear_weight(weight), ops.convert_weight_packed_vnni(weight))
    assert linear.pack_linear_weight(torch.randn(48, 70).to(dtype)).dim() != 4  # N: not a multiple of 32
    assert linear.pack_linear_weight(torch.randn(64, 69).to(dtype)).dim() != 4  # K: odd


@pytest.mark.parametrize("dtype,feature", [(torch.bfloat16, "avx512_bf16"), (torch.float16, "amx_fp16")])
def test_vnni_weight_is_refused_by_name_where_its_engine_is_missing(dtype, feature):
    if vnni_gemm_engine(dtype) is not None:
        pytest.skip(f"this CPU has {vnni_gemm_engine(dtype)}: there is nothing to refuse")
    packed = ops.convert_weight_packed_vnni(torch.randn(64, 64).to(dtype))
    with pytest.raises(RuntimeError, match=f"needs {feature}"):
        ops.weight_packed_linear(torch.randn(3, 64).to(dtype), packed, None)


def check_vnni_gemm(dtype, rows, with_bias, k=70):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, k, generator=g).to(dtype)
    bias = torch.randn(96, generator=g).to(dtype) if with_bias else None
    x = torch.randn(rows, k + 10, generator=g).to(dtype)[:, 3 : k + 3]  # a strided view, as a split QKV output is
    y = ops.weight_packed_linear(x, ops.convert_weight_packed_vnni(weight), bias)
    ref = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert y.dtype == dtype and y.shape == (rows, 96)
    # float32 accumulation of exact 16-bit products, rounded once as it is stored
    torch.testing.assert_close(y.double(), ref, atol=0.2 if dtype == torch.bfloat16 else 2e-2, rtol=2e-2)
    return y


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 16, 31, 32, 33, 100])  # tile and block edges
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_vnni_gemm_matches_float64(rows, with_bias):
    """vdpbf16ps for up to 3 rows; from 4, AMX tiles where the CPU has them (gemm_amx.h's
    AMX_TILES_MIN_ROWS), else vdpbf16ps."""
    needs("avx512_bf16")
    check_vnni_gemm(torch.bfloat16, rows, with_bias)


@pytest.mark.parametrize("rows", [8, 10, 12, 13, 20])  # one tile of 8, one of 9-12, tiles of 8 and the rest
def test_vdpbf16ps_tiles_give_each_row_the_bits_it_gets_alone(rows):
    """On vdpbf16ps a row's dot products run in the same order whatever tile holds it (one of up to 12
    rows, or 8 and the rest), so each row of a block comes out as it does multiplied on its own."""
    needs("avx512_bf16")
    if "amx_bf16" in cpu_features():
        pytest.skip("needs a CPU without amx_bf16: there more than 4 rows go to the AMX tiles")
    g = torch.Generator().manual_seed(rows)
    weight = ops.convert_weight_packed_vnni(torch.randn(96, 576, generator=g).bfloat16())
    bias = torch.randn(96, generator=g).bfloat16()
    x = torch.randn(rows, 576, generator=g).bfloat16()
    y = ops.weight_packed_linear(x, weight, bias)
    alone = torch.cat([ops.weight_packed_linear(x[i : i + 1], weight, bias) for i in range(rows)])
    assert torch.equal(y, alone)


@pytest.mark.parametrize("rows", [5, 33, 300])
def test_bf16_brgemm_matches_float64(rows, monkeypatch):
    """The AMX path: oneDNN's brgemm into a float32 scratch, then bias and bf16 rounding. MINISGL_BRGEMM=1
    takes it on any avx512_bf16 CPU (oneDNN then multiplies with vdpbf16ps instead of AMX tiles)."""
    force_brgemm(monkeypatch, torch.bfloat16)
    check_vnni_gemm(torch.bfloat16, rows, True)


@pytest.mark.parametrize("k", [64, 192])
def test_bf16_amx_tiles_take_four_rows(k, monkeypatch):
    """From AMX_TILES_MIN_ROWS (4) rows, one fewer than brgemm takes, the own tiles multiply: 4 rows,
    multiplied from the zero-padded copy of a 16-row tile, against float64 and bit for bit against the
    same rows inside a full 16-row tile (a tile row's sums never depend on the other rows). vdpbf16ps
    gives the same bits on such inputs, so this checks the 4-row path's results, not which engine ran."""
    needs("amx_bf16")
    monkeypatch.delenv("MINISGL_BRGEMM", raising=False)
    four = check_vnni_gemm(torch.bfloat16, 4, True, k)
    g = torch.Generator().manual_seed(4)  # check_vnni_gemm's inputs, with 12 more rows
    weight = torch.randn(96, k, generator=g).bfloat16()
    bias = torch.randn(96, generator=g).bfloat16()
    four_rows = torch.randn(4, k + 10, generator=g).bfloat16()[:, 3 : k + 3]
    x = torch.cat([four_rows, torch.randn(12, k, generator=g).bfloat16()])
    block = ops.weight_packed_linear(x, ops.convert_weight_packed_vnni(weight), bias)
    assert torch.equal(four, block[:4])


@pytest.mark.parametrize("rows", [5, 16, 17, 33, 47, 130])  # one or two 16-row tiles, padded tails, two chunks
@pytest.mark.parametrize("k", [64, 192])  # whole tile rows of K (32 values); other K stays on brgemm
def test_bf16_amx_tiles_match_float64_and_brgemm_bitwise(rows, k, monkeypatch):
    """minisgl's own AMX tiles (gemm_amx.h), the default on a CPU with amx_bf16: against float64, and
    bit for bit against oneDNN's brgemm (MINISGL_BRGEMM=1), which multiplies the same tiles in the
    same order. A short last group of rows comes from a zero-padded copy, so none is read past x."""
    needs("amx_bf16")
    monkeypatch.delenv("MINISGL_BRGEMM", raising=False)
    ours = check_vnni_gemm(torch.bfloat16, rows, True, k)
    monkeypatch.setenv("MINISGL_BRGEMM", "1")
    assert torch.equal(ours, check_vnni_gemm(torch.bfloat16, rows, True, k))


# Every kernel with a brgemm path, at 8 rows (blocks of more than 4 rows go to brgemm when it is on).
BRGEMM_CALLS = """
import torch
from minisgl.kernels.cpu import is_available
assert is_available()  # loads the kernels
from tests.kernels.test_fused_moe import make_moe_case
from tests.kernels.test_fused_moe_int8 import w8a8_moe
ops = torch.ops.minisgl_kernel
x = torch.randn(8, 64).bfloat16()
ops.weight_packed_linear(x, ops.convert_weight_packed_vnni(torch.randn(64, 64).bfloat16()), None)
w_q = torch.randint(-127, 128, (32, 64), dtype=torch.int8)
ops.int8_scaled_mm_with_quant(x, ops.convert_weight_packed_int8_vnni(w_q), torch.rand(32), None, torch.bfloat16, True)
case = make_moe_case(16, 64, 32, 2, 1, torch.bfloat16, seed=0)  # 16 rows over 2 experts: 8 a block
vnni, args = ops.convert_weight_packed_vnni, (case["hidden_states"], case["topk_weights"], case["topk_ids"])
ops.fused_experts_cpu(args[0], vnni(case["w1"]), vnni(case["w2"]), *args[1:])
layer, method = w8a8_moe(case, 2, 64, 32, torch.bfloat16)
assert isinstance(layer.w13_int8, tuple)  # the fused kernel's stacks
method.apply(layer, *args)
from tests.kernels.test_cpu_kernels import test_extend_attention_matches_sdpa  # head dim 128: K x N = 128x32
test_extend_attention_matches_sdpa(torch.bfloat16, torch.bfloat16, [0, 17], [40, 20], 4, 4, 128)
"""


def brgemm_calls_seen(mode: str | None, code: str = BRGEMM_CALLS) -> set[tuple[str, str]]:
    """oneDNN's own log (ONEDNN_VERBOSE) of the brgemm calls ``code`` made: (A's type, MxK:KxN).
    mode: MINISGL_BRGEMM's value, None for unset."""
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_BRGEMM"} | {"ONEDNN_VERBOSE": "all"}
    if mode is not None:
        env["MINISGL_BRGEMM"] = mode
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=Path(__file__).parents[2]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    fields = [line.split(",") for line in (result.stdout + result.stderr).splitlines()]
    return {
        (f[8].split(":")[1], f[11].split(":", 1)[1]) for f in fields if f[2:6] == ["ukernel", "exec", "cpu", "brgemm"]
    }


@pytest.mark.slow  # ~15 s; MINISGL_BRGEMM=1 is the comparison path, not the default
def test_minisgl_brgemm_sends_blocks_to_onednn_exactly_when_asked(monkeypatch):
    """MINISGL_BRGEMM=1: each kernel calls oneDNN's brgemm, told apart by operand type and shape
    (K x N of a panel or key block); 0: none does. oneDNN logs each call, so the path is seen, not inferred."""
    force_brgemm(monkeypatch, torch.bfloat16)
    force_brgemm(monkeypatch, torch.int8)
    on = brgemm_calls_seen("1")
    assert ("bf16", "64x32") in on  # the bf16 GEMM, and the fused MoE's gate/up (K = H = 64)
    assert ("bf16", "32x32") in on  # the fused MoE's down projection (K = I = 32)
    assert ("u8", "64x16") in on  # the int8 GEMM and the int8 MoE's gate/up, on 16-column panels
    assert ("u8", "32x16") in on  # the int8 MoE's down projection
    assert ("bf16", "128x32") in on  # extend attention's Q . K^T: a head of 128 by a block of 32 keys
    assert ("bf16", "32x128") in on  # and its p . v: a block of 32 keys by a head of 128
    assert brgemm_calls_seen("0") == set()


E5M2_POOL_EXTEND = """
import torch
from minisgl.kernels.cpu import is_available
assert is_available()
from tests.kernels.test_cpu_kernels import test_extend_attention_matches_sdpa
test_extend_attention_matches_sdpa(torch.bfloat16, torch.float8_e5m2, [0, 17], [40, 20], 4, 4, 128)
"""


@pytest.mark.slow  # ~7 s, on the MINISGL_BRGEMM=1 comparison path
def test_a_bf16_model_over_an_e5m2_pool_takes_the_same_brgemm_path(monkeypatch):
    """--kv-cache-dtype fp8_e5m2 under a bf16 model: the keys and values are widened to bf16 and go to
    the same two brgemm shapes as a bf16 pool's, not to the float32 FMA tiles."""
    force_brgemm(monkeypatch, torch.bfloat16)
    assert {("bf16", "128x32"), ("bf16", "32x128")} <= brgemm_calls_seen("1", E5M2_POOL_EXTEND)


DENSE_GEMMS = """
import torch
from minisgl.kernels.cpu import is_available
assert is_available()
ops = torch.ops.minisgl_kernel
x = torch.randn(8, 128).bfloat16()
for k in (64, 80):
    packed = ops.convert_weight_packed_vnni(torch.randn(32, k).bfloat16())
    ops.weight_packed_linear(x[:, :k], packed, None)
for k in (64, 80):
    packed = ops.convert_weight_packed_int8_vnni(torch.ones(16, k, dtype=torch.int8))
    ops.int8_scaled_mm_with_quant(x[:, :k].contiguous(), packed, torch.ones(16), None, torch.bfloat16, True)
"""


def test_dense_gemms_take_their_own_tiles_on_amx():
    """On a CPU with amx_bf16 and amx_int8 the dense bf16 and int8 GEMMs multiply on their own tiles:
    oneDNN logs no brgemm call for K = 64; K = 80 (not whole tile rows) still goes to brgemm, and
    MINISGL_BRGEMM=1 sends both."""
    needs("amx_bf16")
    needs("amx_int8")
    assert brgemm_calls_seen(None, DENSE_GEMMS) == {("bf16", "80x32"), ("u8", "80x16")}
    expected = {("bf16", "64x32"), ("bf16", "80x32"), ("u8", "64x16"), ("u8", "80x16")}
    assert brgemm_calls_seen("1", DENSE_GEMMS) >= expected  # beside brgemm_runs' probes


def test_minisgl_brgemm_refuses_other_values(monkeypatch):
    needs("avx512_bf16")
    monkeypatch.setenv("MINISGL_BRGEMM", "yes")
    packed = ops.convert_weight_packed_vnni(torch.randn(64, 64).bfloat16())
    with pytest.raises(RuntimeError, match="MINISGL_BRGEMM must be 0 or 1, got 'yes'"):
        ops.weight_packed_linear(torch.randn(8, 64).bfloat16(), packed, None)


@pytest.mark.parametrize("setting", ["1", ""])
def test_minisgl_brgemm_says_where_onednn_cannot_run_it(setting):
    """oneDNN held at AVX2 has no brgemm: MINISGL_BRGEMM=1 is then refused by name, not with torch's
    message about AMX; unset, the blocks stay on minisgl's own tiles, even on a CPU with AMX (where
    they went to brgemm, which raised, before engines() read ONEDNN_MAX_CPU_ISA too)."""
    needs("avx512_bf16")
    code = """
import torch
from minisgl.kernels.cpu import is_available
assert is_available()  # loads the kernels
ops = torch.ops.minisgl_kernel
torch.manual_seed(0)  # fixed sums: an unseeded output past 32 could round by more than the bound below
x, w = torch.randn(8, 64).bfloat16(), torch.randn(32, 64).bfloat16()
try:
    y = ops.weight_packed_linear(x, ops.convert_weight_packed_vnni(w), None)
    print("error", (y.float() - x.double().matmul(w.double().T).float()).abs().max().item())
except RuntimeError as error:
    print(str(error).splitlines()[0])
"""
    env = {**os.environ, "MINISGL_BRGEMM": setting, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    if setting == "1":
        assert "MINISGL_BRGEMM=1, but oneDNN's brgemm does not take bf16 on this CPU" in result.stdout, result.stdout
    else:
        assert result.stdout.startswith("error "), result.stdout
        assert float(result.stdout.split()[1]) < 0.1, result.stdout  # bf16 rounding of sums of 64 products


@pytest.mark.parametrize("rows", [1, 5, 33])
def test_fp16_amx_brgemm_matches_float64(rows):
    needs("amx_fp16")
    check_vnni_gemm(torch.float16, rows, True)
