"""Tests for exercise 05 (flash-attention forward kernel, non-causal, N a multiple of the
block). On a CPU they run in Triton's interpreter, so the sizes are small."""

import pytest
import torch

import flashlab  # noqa: F401  (sets up the interpreter before the kernel is defined)
from flashlab import assert_close, reference_attention
from flashlab.reference import TF32_TOLERANCE, reference_logsumexp

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 tl.dot runs exact in the interpreter but through TF32 tensor cores on a GPU
TOL = {torch.float32: 1e-5 if DEVICE == "cpu" else TF32_TOLERANCE, torch.float16: 3e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("B,H,N,D", [(1, 1, 32, 16), (2, 2, 64, 32), (1, 2, 96, 64)])
def test_output_and_logsumexp_match_float64(exercise, B, H, N, D, dtype):
    q, k, v = (torch.randn(B, H, N, D, device=DEVICE, dtype=dtype) for _ in range(3))
    out, lse = exercise.flash_forward(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (B, H, N) and lse.dtype == torch.float32
    assert_close(out, reference_attention(q, k, v), tol=TOL[dtype])
    assert_close(lse, reference_logsumexp(q, k), tol=TOL[dtype], what="lse")


def test_large_scores_need_the_running_max(exercise):
    """Scores near ±300 overflow e^s in fp32: only a kernel that subtracts the running max survives."""
    q, k, v = (torch.randn(1, 2, 64, 16, device=DEVICE) for _ in range(3))
    q = q * 40
    out, lse = exercise.flash_forward(q, k, v)
    assert_close(out, reference_attention(q, k, v), tol=TOL[torch.float32])
    assert_close(lse, reference_logsumexp(q, k), tol=TOL[torch.float32], what="lse")


def test_scale(exercise):
    q, k, v = (torch.randn(1, 1, 32, 16, device=DEVICE) for _ in range(3))
    out, _ = exercise.flash_forward(q, k, v, scale=0.7)
    assert_close(out, reference_attention(q, k, v, scale=0.7), tol=TOL[torch.float32])


def test_rejects_a_length_that_is_not_a_block_multiple(exercise):
    q = torch.randn(1, 1, 33, 16, device=DEVICE)
    with pytest.raises(ValueError, match="^q:"):
        exercise.flash_forward(q, q, q)
