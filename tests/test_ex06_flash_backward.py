"""Tests for exercise 06 (backward kernels: dK/dV pass and dQ pass). The forward's O and
log-sum-exp come from the float64 reference, so this exercise does not depend on 05."""

import pytest
import torch

import flashlab  # noqa: F401  (sets up the interpreter before the kernel is defined)
from flashlab import assert_close, reference_attention, reference_gradients
from flashlab.reference import reference_logsumexp

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 on a GPU goes through TF32 tensor cores; the backward chains three TF32 products
# (dP, dS·K, dSᵀ·Q), measured up to 3.1e-3 on an H200, so it gets 1e-2 there.
TOL = {torch.float32: 1e-5 if DEVICE == "cpu" else 1e-2, torch.float16: 3e-3}


def _forward(q, k, v, is_causal):
    """O (in q's dtype) and the natural-log log-sum-exp (float32), computed in float64."""
    lse = reference_logsumexp(q, k, is_causal).float().to(DEVICE)
    return reference_attention(q, k, v, is_causal=is_causal).to(DEVICE, q.dtype), lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", [(1, 1, 16), (17, 17, 16), (100, 100, 32), (40, 70, 16), (70, 40, 64)])
def test_gradients_match_float64(exercise, Nq, Nk, D, is_causal, dtype):
    q = torch.randn(2, 2, Nq, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(2, 2, Nk, D, device=DEVICE, dtype=dtype) for _ in range(2))
    grad_out = torch.randn_like(q)
    out, lse = _forward(q, k, v, is_causal)
    grads = exercise.flash_backward(q, k, v, out, lse, grad_out, is_causal=is_causal)
    for name, got, want in zip("qkv", grads, reference_gradients(q, k, v, grad_out, is_causal=is_causal)):
        assert got.shape == want.shape and got.dtype == dtype, f"d{name}: shape or dtype"
        assert_close(got, want, tol=TOL[dtype], what=f"d{name}")


def test_deterministic(exercise):
    """No atomics needed: each program owns its output tile, so two runs agree bit for bit."""
    q, k, v, grad_out = (torch.randn(1, 2, 70, 16, device=DEVICE) for _ in range(4))
    out, lse = _forward(q, k, v, True)
    first = exercise.flash_backward(q, k, v, out, lse, grad_out, is_causal=True)
    second = exercise.flash_backward(q, k, v, out, lse, grad_out, is_causal=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_causal_skips_tiles_above_the_diagonal(exercise):
    """Keys ≥ 128 are unseen by all 40 queries and hold NaN: both passes must skip their tiles."""
    q, grad_out = (torch.randn(1, 2, 40, 16, device=DEVICE) for _ in range(2))
    k, v = (torch.randn(1, 2, 300, 16, device=DEVICE) for _ in range(2))
    out, lse = _forward(q, k[:, :, :40], v[:, :, :40], True)
    k[:, :, 128:], v[:, :, 128:] = float("nan"), float("nan")
    dq, dk, dv = exercise.flash_backward(q, k, v, out, lse, grad_out, is_causal=True)
    assert torch.isfinite(dq).all(), "the dQ pass read key tiles that causal masking makes useless"
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all(), \
        "the dK/dV pass visited query blocks that cannot see its keys"
    assert (dk[:, :, 40:] == 0).all() and (dv[:, :, 40:] == 0).all(), "keys no query sees get zero gradient"
    want = reference_gradients(q, k[:, :, :40], v[:, :, :40], grad_out, is_causal=True)
    assert_close(dq, want[0], tol=TOL[torch.float32], what="dq")
    assert_close(dk[:, :, :40], want[1], tol=TOL[torch.float32], what="dk")
    assert_close(dv[:, :, :40], want[2], tol=TOL[torch.float32], what="dv")
