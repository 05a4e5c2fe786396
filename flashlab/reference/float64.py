"""The float64 reference and the error metrics every flashlab test uses.

Tests compare an implementation to the float64 reference with the relative error norm

    rel_error = ‖out − ref‖_F / ‖ref‖_F

and a tolerance that depends on the dtype the implementation computed in. A NaN or inf
anywhere fails, whatever its size.
"""

from __future__ import annotations

import math

import torch

from .checks import default_scale
from .naive import causal_keep_mask, naive_attention

# Relative-error tolerances by the dtype of the computation under test. Each is well
# above the error that dtype's rounding leaves in a correct kernel (about 1e-7 for fp32
# with exact products, 5e-4 for fp16 and 4e-3 for bf16 with fp32 accumulation, measured
# in tests/), and well below the error of a real bug (a wrong mask or a missing
# rescale gives errors of order 1e-1 to 1).
TOLERANCE = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 3e-3,
    torch.bfloat16: 2e-2,
}
# fp32 inputs through TF32 tensor cores (Triton's default for an fp32 tl.dot on GPU).
TF32_TOLERANCE = 3e-3



def tf32_nearest(x: torch.Tensor) -> torch.Tensor:
    """fp32 → TF32 (10 of fp32's 23 mantissa bits), rounded to nearest even as cuBLAS rounds, Inf/NaN
    kept; returned as float32. A reference for the kernels' TF32 path (`flashlab.kernels.tile.round_to_tf32`),
    independent of Triton: adding just under half of the 13 dropped bits, plus the last kept bit, then
    clearing them rounds to nearest with ties to even."""
    bits = x.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF     # the bits, unsigned
    special = (bits & 0x7F800000) == 0x7F800000
    rounded = torch.where(special, bits, (bits + ((bits >> 13) & 1) + 0xFFF) & 0xFFFFE000)
    return torch.where(rounded >= 2**31, rounded - 2**32, rounded).to(torch.int32).view(torch.float32)


def tf32_truncated(x: torch.Tensor) -> torch.Tensor:
    """fp32 → TF32 by dropping the 13 low mantissa bits (toward zero), as Hopper's tensor cores read raw
    fp32 operands; returned as float32."""
    return (x.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)

def _to_float64(t: torch.Tensor) -> torch.Tensor:
    # on its own device: float64 is exact enough anywhere, and a GPU computes the
    # reference for N = 16384 in seconds where a CPU takes minutes
    return t.detach().to(dtype=torch.float64)


def _mask_to_float64(mask: torch.Tensor) -> torch.Tensor:
    # a boolean mask keeps its meaning as is; a float mask is upcast like the scores
    return mask.detach() if mask.dtype == torch.bool else _to_float64(mask)


def reference_attention(q, k, v, attn_mask=None, is_causal=False, scale=None, *, dropout_p=0.0,
                        dropout_keep=None, window=None, softcap=None) -> torch.Tensor:
    """Attention in float64: the ground truth for every test.

    Same arguments and semantics as :func:`flashlab.naive_attention`; the inputs (and a
    float mask) are upcast to float64 on their own device first, so the only rounding
    left is float64's (about 1e-16 relative). Dropout needs the keep mask the
    implementation used (``dropout_keep``), or the comparison is meaningless. ``window`` and
    ``softcap`` as `flashlab.attention`'s.
    """
    mask = None if attn_mask is None else _mask_to_float64(attn_mask)
    keep = None if dropout_keep is None else dropout_keep.to(q.device)
    return naive_attention(_to_float64(q), _to_float64(k), _to_float64(v), mask, is_causal, scale,
                           dropout_p=dropout_p, dropout_keep=keep, window=window, softcap=softcap)


def reference_gradients(q, k, v, grad_out, attn_mask=None, is_causal=False, scale=None, *, dropout_p=0.0,
                        dropout_keep=None, window=None, softcap=None):
    """(dq, dk, dv) of attention in float64 (on the inputs' device), by autograd through the naive
    implementation: the ground truth for every backward test."""
    q64, k64, v64 = (_to_float64(t).requires_grad_() for t in (q, k, v))
    mask = None if attn_mask is None else _mask_to_float64(attn_mask)
    keep = None if dropout_keep is None else dropout_keep.to(q.device)
    out = naive_attention(q64, k64, v64, mask, is_causal, scale, dropout_p=dropout_p, dropout_keep=keep,
                          window=window, softcap=softcap)
    return torch.autograd.grad(out, (q64, k64, v64), _to_float64(grad_out))


def reference_logsumexp(q, k, is_causal=False, scale=None) -> torch.Tensor:
    """L_i = log Σ_j e^(s_ij), the natural-log log-sum-exp of each score row, in float64:
    what a flash-attention forward saves for its backward (causal: keys j ≤ i only)."""
    scores = _to_float64(q) @ _to_float64(k).transpose(-1, -2) * default_scale(q.shape[-1], scale)
    if is_causal:
        scores = scores.masked_fill(~causal_keep_mask(q.shape[-2], k.shape[-2], scores.device), float("-inf"))
    return torch.logsumexp(scores, dim=-1)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖_F / ‖ref‖_F in float64 (NaN if `out` holds NaN or inf).

    If ``ref`` is all zeros the absolute norm ‖out‖ is returned instead.
    """
    if out.shape != ref.shape:
        raise ValueError(f"out: shape {tuple(out.shape)} differs from ref's {tuple(ref.shape)}. "
                         "Compare tensors of the same shape.")
    out64 = out.detach().to(device="cpu", dtype=torch.float64)
    ref64 = ref.detach().to(device="cpu", dtype=torch.float64)
    if not torch.isfinite(out64).all():
        return math.nan
    ref_norm = ref64.norm().item()
    diff_norm = (out64 - ref64).norm().item()
    return diff_norm / ref_norm if ref_norm > 0 else diff_norm


def max_abs_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out − ref| in float64 (NaN if `out` holds NaN or inf)."""
    out64 = out.detach().to(device="cpu", dtype=torch.float64)
    ref64 = ref.detach().to(device="cpu", dtype=torch.float64)
    if not torch.isfinite(out64).all():
        return math.nan
    return (out64 - ref64).abs().max().item() if out64.numel() else 0.0


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None,
                 tol: float | None = None, what: str = "output") -> float:
    """Fail unless ``rel_error(out, ref) <= tol``; returns the error.

    ``tol`` defaults to ``TOLERANCE[dtype]`` with ``dtype`` defaulting to ``out.dtype``.
    """
    if tol is None:
        tol = TOLERANCE[dtype or out.dtype]
    err = rel_error(out, ref)
    if not err <= tol:  # also catches NaN
        raise AssertionError(
            f"{what}: relative error {err:.3e} exceeds {tol:.1e} "
            f"(max abs error {max_abs_error(out, ref):.3e}, shape {tuple(out.shape)})")
    return err
