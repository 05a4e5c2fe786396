"""flashlab.lessons.flash_minimal: the minimal forward and backward kernels against float64, and
their contract (N a multiple of the blocks, power-of-two D) enforced with clear errors."""

import math

import pytest
import torch

from flashlab import assert_close, reference_attention, reference_gradients
from flashlab.lessons.flash_minimal import minimal_flash_backward, minimal_flash_forward
from flashlab.reference.float64 import TF32_TOLERANCE, TOLERANCE, reference_logsumexp

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def tol(dtype):
    """On a GPU an fp32 tl.dot rounds its products to TF32; the interpreter multiplies exactly."""
    return TF32_TOLERANCE if CUDA and dtype == torch.float32 else TOLERANCE[dtype]

SHAPES = [(1, 1, 32, 16, 16, 16), (2, 3, 64, 32, 32, 16), (1, 2, 96, 16, 32, 32)]   # B, H, N, D, block_m, block_n


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("B,H,N,D,block_m,block_n", SHAPES)
def test_forward_matches_float64(B, H, N, D, block_m, block_n, dtype):
    q, k, v = (torch.randn(B, H, N, D, dtype=dtype, device=DEVICE) for _ in range(3))
    out, lse = minimal_flash_forward(q, k, v, block_m=block_m, block_n=block_n)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_close(out, reference_attention(q, k, v), tol=tol(dtype))
    # the saved statistic is the base-2 log-sum-exp: L · ln 2 is the natural one
    assert_close(lse * math.log(2), reference_logsumexp(q, k), tol=TF32_TOLERANCE if CUDA else 1e-5, what="L")


def test_forward_survives_scores_that_overflow_without_the_running_max():
    """Scores of order 1000 overflow exp() in fp32: only the running max keeps them finite. On a GPU
    the inputs are fp16, which tl.dot multiplies exactly: an fp32 tl.dot rounds to TF32 there, whose
    errors of about |S|·2⁻¹¹ ≈ 0.5 in scores of 1000 would be the test's subject instead (8.8e-3 on an
    H100 against TF32's tolerance 3e-3). The exponentials are fp32 either way."""
    dtype = torch.float16 if CUDA else torch.float32
    q, k, v = (torch.randn(1, 1, 64, 16, device=DEVICE) for _ in range(3))
    q, k, v = (q * 200).to(dtype), k.to(dtype), v.to(dtype)
    out, _ = minimal_flash_forward(q, k, v)
    assert torch.isfinite(out).all()
    assert_close(out, reference_attention(q, k, v), tol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("B,H,N,D,block_m,block_n", SHAPES)
def test_backward_matches_float64_gradients(B, H, N, D, block_m, block_n, dtype):
    q, k, v, grad_out = (torch.randn(B, H, N, D, dtype=dtype, device=DEVICE) for _ in range(4))
    out, lse = minimal_flash_forward(q, k, v, block_m=block_m, block_n=block_n)
    grads = minimal_flash_backward(q, k, v, out, lse, grad_out, block_m=block_m, block_n=block_n)
    for name, got, want in zip("qkv", grads, reference_gradients(q, k, v, grad_out)):
        assert got.dtype == dtype
        assert_close(got, want, tol=tol(dtype), what=f"d{name}")


def test_explicit_scale_is_used():
    q, k, v, grad_out = (torch.randn(1, 2, 32, 16, device=DEVICE) for _ in range(4))
    out, lse = minimal_flash_forward(q, k, v, scale=0.3)
    assert_close(out, reference_attention(q, k, v, scale=0.3), tol=tol(torch.float32))
    grads = minimal_flash_backward(q, k, v, out, lse, grad_out, scale=0.3)
    for got, want in zip(grads, reference_gradients(q, k, v, grad_out, scale=0.3)):
        assert_close(got, want, tol=tol(torch.float32))


@pytest.mark.parametrize("shape,kwargs,names", [
    ((1, 1, 40, 16), {}, "block_m"),                          # N not a multiple of the block
    ((1, 1, 32, 24), {}, "head dim"),                         # D not a power of two
    ((1, 1, 32, 16), {"block_n": 24}, "block_n"),             # block not a power of two
    ((1, 32, 16), {}, "(B, H, N, D)"),                        # wrong rank
])
def test_inputs_outside_the_contract_raise_clearly(shape, kwargs, names):
    q, k, v = (torch.randn(shape) for _ in range(3))
    with pytest.raises(ValueError, match=names.replace("(", r"\(").replace(")", r"\)")):
        minimal_flash_forward(q, k, v, **kwargs)


def test_bad_dtype_and_mismatched_k_raise_clearly():
    q = torch.randn(1, 1, 32, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="q: dtype"):
        minimal_flash_forward(q, q, q)
    q = torch.randn(1, 1, 32, 16)
    with pytest.raises(ValueError, match="k, v"):
        minimal_flash_forward(q, torch.randn(1, 1, 64, 16), torch.randn(1, 1, 64, 16))
