"""rmsnorm / fused_add_rmsnorm against fp32 plain-torch references."""

import pytest
import torch

import minisgl  # noqa: F401  (sets TRITON_INTERPRET on CPU before any kernel is decorated)
from minisgl.layers.triton_ops.rmsnorm import fused_add_rmsnorm, rmsnorm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}
CASES = [
    (1, 64, torch.float32),
    (5, 576, torch.float32),  # SmolLM2's hidden size: not a power of two
    (3, 96, torch.float16),
    (4, 200, torch.bfloat16),
]


def rmsnorm_ref(x, weight, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def make_inputs(n, hidden, dtype):
    g = torch.Generator().manual_seed(n * hidden)
    x = (torch.randn(n, hidden, generator=g) * 3).to(dtype).to(DEVICE)
    residual = torch.randn(n, hidden, generator=g).to(dtype).to(DEVICE)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).to(DEVICE)
    return x, residual, weight


@pytest.mark.parametrize("n, hidden, dtype", CASES)
def test_rmsnorm(n, hidden, dtype):
    x, _, weight = make_inputs(n, hidden, dtype)
    out = rmsnorm(x, weight, 1e-6)
    tol = TOLERANCE[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), rmsnorm_ref(x, weight, 1e-6), atol=tol, rtol=tol)


@pytest.mark.parametrize("n, hidden, dtype", CASES)
def test_fused_add_rmsnorm(n, hidden, dtype):
    x, residual, weight = make_inputs(n, hidden, dtype)
    x_before, residual_before = x.clone(), residual.clone()
    out, residual_out = fused_add_rmsnorm(x, residual, weight, 1e-5)

    residual_ref = (x.float() + residual.float()).to(dtype)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(residual_out, residual_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(out.float(), rmsnorm_ref(residual_ref, weight, 1e-5), atol=tol, rtol=tol)
    # Functional, unlike SGLang's in-place op: the inputs are untouched.
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


def test_rmsnorm_strided_rows():
    # A row slice of a wider tensor, as when normalising part of a fused projection.
    x, _, weight = make_inputs(3, 128, torch.float32)
    wide = torch.cat([x, torch.full_like(x, 1e4)], dim=1)[:, :128]
    torch.testing.assert_close(rmsnorm(wide, weight, 1e-6), rmsnorm_ref(x, weight, 1e-6), atol=1e-5, rtol=1e-5)
