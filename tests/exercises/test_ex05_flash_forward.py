"""Tests for exercise 05 (flash-attention forward kernel, non-causal, N a multiple of the
block). On a CPU they run in Triton's interpreter, so the sizes are small."""

import functools
import math

import pytest
import torch

from flashlab import assert_close, reference_attention
from flashlab.reference.float64 import TF32_TOLERANCE, reference_logsumexp, rel_error
from tests.exercises.hints import known_mistake, unwritten
from tests.exercises.padded_launch import PaddedLaunch, launch_guarded

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 tl.dot runs exact in the interpreter but through TF32 tensor cores on a GPU
TOL = {torch.float32: 1e-5 if DEVICE == "cpu" else TF32_TOLERANCE, torch.float16: 3e-3}

RESCALE_HINT = ("\nhint: if only sequences of one key block pass, check the rescale of the accumulator "
                "by alpha = exp(m_old − m_new) when the running max changes")
NO_SCALE_HINT = ("\nhint: the output is attention with unscaled scores, softmax(Q Kᵀ) V: multiply the scores by "
                 "`scale` (1/√D unless given), S = Q Kᵀ · scale, before the running max")
SCALE_TWICE_HINT = ("\nhint: the output is attention with its scores scaled twice, softmax(Q Kᵀ · scale²) V: "
                    "multiply by `scale` once")
IGNORED_SCALE_HINT = ("\nhint: the output is attention with the default scale 1/√D, not the `scale` passed: "
                      "use the argument when it is given")
LOG2E_HINT = ("\nhint: the output is softmax(S·ln 2) V, attention with its scores scaled by ln 2: exp2 needs "
              "S·log2(e) (2^(x·log2 e) = e^x), so multiply the scores by log2(e) before exp2")
OVERFLOW_HINT = ("\nhint: inf or NaN: e^S overflows fp32 once S > ln(fp32 max) ≈ 88.7; exponentiate S − m "
                 "with m the running row max")
MAX_INIT_HINT = ("\nhint: NaN in rows whose every score is far below 0: e^(S − m) underflows fp32 to 0 for S − m below "
                 "≈ −88 (−103 with subnormals), so ℓ = 0 and O = 0/0, unless m is the row's true running max. Start "
                 "it at −inf, m_i = tl.full([BLOCK_M], -float(\"inf\"), tl.float32), not at 0 (tl.zeros), and "
                 "update m' = max(m, rowmax S)")


@pytest.fixture
def exercise(exercise, monkeypatch):
    """conftest.py's `exercise`, the kernel launched on padded copies of its tensors (`launch_guarded`): a store
    outside O or L is named, instead of aborting pytest."""
    monkeypatch.setattr(exercise, "flash_forward_kernel",
                        PaddedLaunch(exercise.flash_forward_kernel, functools.partial(launch_guarded, {"O", "L"})))
    return exercise


def _check_lse(lse, q, k, tol):
    """assert_close of L, naming the mistake when the error has a known signature."""
    want = reference_logsumexp(q, k)
    try:
        assert_close(lse, want, tol=tol, what="lse")
    except AssertionError as error:
        scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
        row_max = scores.amax(-1).to(want.device)
        signatures = [  # error of L = log2(e)·L (the kernel's base-2 units), of L = log(l) (no max)
            (math.log2(math.e) - 1, "L must be in natural log units: multiply the base-2 value by ln 2"),
            (rel_error(want - row_max, want), "L = m + log(l): add the running max back"),
        ]
        hint = unwritten(lse, "L") or known_mistake(rel_error(lse, want), signatures)
        raise AssertionError(f"{error}{hint}") from None


def _check_out(out, q, k, v, tol, block, scale=None, nonfinite_hint=OVERFLOW_HINT):
    """assert_close of O against float64 attention, with a hint where the failure has the
    signature of a known mistake: inf/NaN (``nonfinite_hint``), the output of attention with the
    scores scaled by ln 2 (exp2 without log2 e), or by another scale (none, twice, the default in
    place of the one passed), or (N > one key block) a missing rescale."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    try:
        assert_close(out, reference_attention(q, k, v, scale=scale), tol=tol)
    except AssertionError as error:
        raise AssertionError(f"{error}{_out_hint(out, q, k, v, tol, block, scale, nonfinite_hint)}") from None


def _out_hint(out, q, k, v, tol, block, scale, nonfinite_hint) -> str:
    """`_check_out`'s hint, the first signature that fits."""
    if hint := unwritten(out, "O"):
        return hint
    if not torch.isfinite(out).all():
        return nonfinite_hint
    if rel_error(out, reference_attention(q, k, v, scale=scale * math.log(2))) <= tol:
        return LOG2E_HINT
    default = q.shape[-1] ** -0.5
    signatures = [(1.0, NO_SCALE_HINT), (scale * scale, SCALE_TWICE_HINT), (default, IGNORED_SCALE_HINT)]
    for wrong_scale, hint in signatures:     # the output of attention with another scale: which one tells the slip
        if math.isclose(wrong_scale, scale):
            continue
        if rel_error(out, reference_attention(q, k, v, scale=wrong_scale)) <= tol:
            return hint
    if k.shape[-2] > block:      # the rescale only matters from the second key block on
        return RESCALE_HINT
    return ""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("B,H,N,D", [(1, 1, 32, 16), (2, 2, 64, 32), (1, 2, 96, 64)])
def test_output_and_logsumexp_match_float64(exercise, B, H, N, D, dtype):
    q, k, v = (torch.randn(B, H, N, D, device=DEVICE, dtype=dtype) for _ in range(3))
    out, lse = exercise.flash_forward(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (B, H, N) and lse.dtype == torch.float32
    _check_out(out, q, k, v, TOL[dtype], exercise.BLOCK)
    _check_lse(lse, q, k, TOL[dtype])


def test_large_scores_need_the_running_max(exercise):
    """Scores reach |S| ≈ 140–200 (S = 10·q·k with q·k of standard deviation 4), far past
    ln(fp32 max) ≈ 88.7 where e^S overflows fp32: only a kernel that subtracts the running
    max survives."""
    q, k, v = (torch.randn(1, 2, 64, 16, device=DEVICE) for _ in range(3))
    q = q * 40
    largest = (q @ k.transpose(-1, -2) / 4).max().item()
    assert largest > 100, f"test inputs: the largest score {largest:.0f} would not overflow e^S in fp32"
    out, lse = exercise.flash_forward(q, k, v)
    _check_out(out, q, k, v, TOL[torch.float32], exercise.BLOCK)
    _check_lse(lse, q, k, TOL[torch.float32])


def negative_rows(B, H, N, D, device):
    """q, k, v where about half of the rows (at least one per head) have every score below −120:
    q's first feature an integer 25–40 in those rows, k's an integer −28 to −32 (exact in fp16 and
    TF32), so q·k/√D ≈ −170 to −330 (D = 16). Softmax does not change under the shift, but a
    running max started at 0 makes e^(S − 0) = 0 for every key of those rows."""
    q, k, v = (torch.randn(B, H, N, D, device=device) for _ in range(3))
    rows = torch.rand(B, H, N, device=device) < 0.5
    rows[..., torch.randint(0, N, ())] = True
    q[..., 0] = torch.where(rows, torch.randint(25, 41, (B, H, N), device=device).float(), q[..., 0])
    k[..., 0] = -torch.randint(28, 33, (B, H, N), device=device).float()
    largest = (q @ k.transpose(-1, -2) / math.sqrt(D)).amax(-1)[rows].max().item()
    assert largest < -120, f"test inputs: a chosen row's largest score {largest:.0f} is not far below 0"
    return q, k, v


def test_rows_of_very_negative_scores(exercise):
    """Rows whose every score is below −120 (e^S underflows fp32 below ≈ −103): the running max
    must start at −inf, so that the first block sets it to the row's max; one started at 0 stays
    0, e^S = 0 for every key, ℓ = 0 and O = 0/0 = NaN. (Scores of size 200 lose about 2e-5 to
    fp32 rounding in S − m, hence the wider tolerance on CPU.)"""
    q, k, v = negative_rows(1, 2, 64, 16, DEVICE)
    out, lse = exercise.flash_forward(q, k, v)
    tol = 1e-4 if DEVICE == "cpu" else TF32_TOLERANCE
    _check_out(out, q, k, v, tol, exercise.BLOCK, nonfinite_hint=MAX_INIT_HINT)
    _check_lse(lse, q, k, tol)


def test_scale(exercise):
    q, k, v = (torch.randn(1, 1, 32, 16, device=DEVICE) for _ in range(3))
    out, _ = exercise.flash_forward(q, k, v, scale=0.7)
    _check_out(out, q, k, v, TOL[torch.float32], exercise.BLOCK, scale=0.7)


def test_rejects_a_length_that_is_not_a_block_multiple(exercise):
    q = torch.randn(1, 1, 33, 16, device=DEVICE)
    with pytest.raises(ValueError, match="^q:"):
        exercise.flash_forward(q, q, q)
