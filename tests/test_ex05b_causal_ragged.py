"""Tests for exercise 05b (forward kernel: causal masking, skipped tiles, any N)."""

import pytest
import torch

import flashlab  # noqa: F401  (sets up the interpreter before the kernel is defined)
from flashlab import assert_close, reference_attention
from flashlab.reference import TF32_TOLERANCE, reference_logsumexp

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5 if DEVICE == "cpu" else TF32_TOLERANCE, torch.float16: 3e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", [(1, 1, 16), (17, 17, 16), (100, 100, 32), (40, 70, 16), (70, 40, 64)])
def test_matches_float64(exercise, Nq, Nk, D, is_causal, dtype):
    q = torch.randn(2, 2, Nq, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(2, 2, Nk, D, device=DEVICE, dtype=dtype) for _ in range(2))
    out, lse = exercise.flash_forward(q, k, v, is_causal=is_causal)
    assert out.shape == q.shape and lse.shape == (2, 2, Nq)
    assert_close(out, reference_attention(q, k, v, is_causal=is_causal), tol=TOL[dtype])
    assert_close(lse, reference_logsumexp(q, k, is_causal), tol=TOL[dtype], what="lse")


def test_causal_skips_tiles_above_the_diagonal(exercise):
    """40 queries, 300 keys, causal: keys ≥ 40 are masked for every query, and whole key
    blocks past the last query block must never be read. They hold NaN here: a kernel that
    reads them and masks afterwards returns NaN (0 · NaN = NaN in P V)."""
    q = torch.randn(1, 2, 40, 16, device=DEVICE)
    k, v = (torch.randn(1, 2, 300, 16, device=DEVICE) for _ in range(2))
    k[:, :, 128:], v[:, :, 128:] = float("nan"), float("nan")   # beyond any block size up to 128
    out, _ = exercise.flash_forward(q, k, v, is_causal=True)
    assert torch.isfinite(out).all(), "the kernel read key tiles that causal masking makes useless"
    assert_close(out, reference_attention(q, k[:, :, :40], v[:, :, :40], is_causal=True), tol=TOL[torch.float32])
