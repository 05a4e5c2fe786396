"""Tests for exercise 05 (flash-attention forward kernel, non-causal, N a multiple of the
block). On a CPU they run in Triton's interpreter, so the sizes are small."""

import functools
import math

import pytest
import torch

from flashlab import assert_close, reference_attention
from flashlab.reference.float64 import TF32_TOLERANCE, reference_logsumexp, rel_error
from tests.exercises.hints import unwritten
from tests.exercises.padded_launch import PaddedLaunch, launch_guarded

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 tl.dot runs exact in the interpreter but through TF32 tensor cores on a GPU
TOL = {torch.float32: 1e-5 if DEVICE == "cpu" else TF32_TOLERANCE, torch.float16: 3e-3}

RESCALE_HINT = ("\nhint: N spans several key blocks here and the output is none of the known slips' (no hint "
                "names it): run one key block (N = BLOCK); if that passes, look at what carries from one key block "
                "to the next: m, ℓ and the accumulator, their rescale by α = e^(m − m'), the K/V offsets")
# what the block loop gives with one slip, named by `_loop_slips`' keys
LOOP_HINTS = {
    "acc": ("the output is what the loop gives when ℓ is rescaled by α = e^(m − m') but the accumulator is not: "
            "its old terms were exponentiated with the old max, so acc' = α·acc + P̃ V, like ℓ' = α·ℓ + rowsum P̃"),
    "l": ("each row of O is the right row times its own constant below 1, as when the accumulator is rescaled by "
          "α = e^(m − m') and ℓ is not: ℓ' = α·ℓ + rowsum P̃, like acc' = α·acc + P̃ V"),
    "divide": ("each row of O is the right row times ℓ_i = Σ_j e^(S_ij − m_i), the softmax's denominator: divide "
               "the accumulator by ℓ once, after the loop, O = acc / ℓ"),
    "shift": ("the output is what the loop gives with P̃ = e^S instead of e^(S − m'): exponentiate the scores less "
              "the new running max, P̃ = e^(S − m'), so that ℓ and the accumulator hold no e^m"),
    "first block": ("each query block's output is attention over the first key block alone, read again at every "
                     "step: the K and V offsets do not move with the loop; load the rows start_n + offs_n"),
    "own block": ("each query block's output is attention over the key block of its own index alone: K and V are "
                  "loaded at the query rows (offs_m); load the key rows start_n + offs_n"),
}
ROW_FACTOR_HINT = ("\nhint: each row of O is the right row times its own constant ({low:.3g} to {high:.3g}): the "
                   "weights' sum is off. Check ℓ: the sum of e^(S_ij − m) over the keys j of row i (axis 1), "
                   "rescaled by α = e^(m − m') like the accumulator, and O = acc / ℓ")
ALPHA_HINT = ("\nhint: every entry of O is NaN or inf although no score exceeds {top:.0f} (e^S overflows fp32 only "
              "past ≈ 88.7). The first key block makes it, where m = −inf: α = e^(m − m') = e^(−inf) = 0 there, "
              "while e^(m' − m) = +inf and 0·inf = NaN. Was α's sign flipped?")
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
        raise AssertionError(f"{error}{unwritten(lse, 'L') or _lse_hint(lse, q, k, tol)}") from None


def _lse_hint(lse, q, k, tol) -> str:
    """`_check_lse`'s hint: L as a known wrong formula of m (the row max of S) and ℓ = Σ_j e^(S_j − m), or as
    a·m + b·ln ℓ with a or b not 1 (a log base mixed in)."""
    scores = q.double().cpu() @ k.double().cpu().transpose(-1, -2) / math.sqrt(q.shape[-1])
    m = scores.amax(-1)
    log_l = torch.log(torch.exp(scores - m[..., None]).sum(-1))
    got = lse.double().cpu()
    formulas = [
        ((m + log_l) * math.log2(math.e), "L must be in natural log units: multiply the base-2 value by ln 2"),
        (log_l, "L = m + ln ℓ: add the running max back"),
        (2 * m + log_l, "L = m + ln ℓ holds m twice: with P̃ = e^S (not shifted by m), ℓ = Σ e^S already holds "
                        "e^m. Exponentiate S − m', and L = m + ln ℓ"),
    ]
    for wrong, hint in formulas:
        if rel_error(got, wrong) <= tol:
            return f"\nhint: {hint}"
    if not torch.isfinite(got).all():
        return ""
    terms = torch.stack([m.flatten(), log_l.flatten()], -1)
    a, b = torch.linalg.lstsq(terms, got.flatten()[:, None]).solution.flatten().tolist()
    if rel_error(got, a * m + b * log_l) <= tol and max(abs(a - 1), abs(b - 1)) > 0.01:
        return (f"\nhint: L = {a:.3f}·m + {b:.3f}·ln ℓ here (m the row's max score, ℓ = Σ_j e^(S_j − m)); it should "
                f"be m + ln ℓ. A factor log₂e ≈ 1.443 or ln 2 ≈ 0.693 on a term says that term is in another log "
                f"base: keep both in natural log (in an exp2 kernel, L = (m₂ + log₂ ℓ)·ln 2)")
    return ""


def _check_out(out, q, k, v, tol, block, scale=None, nonfinite_hint=OVERFLOW_HINT):
    """assert_close of O against float64 attention, with a hint where the failure has the
    signature of a known mistake: inf/NaN (``nonfinite_hint``, or α's sign when every entry is NaN with small
    scores), the output of attention with the scores scaled by ln 2 (exp2 without log2 e) or by another scale
    (none, twice, the default in place of the one passed), the output of the block loop with one slip
    (`_loop_slips`), rows off by a factor each, or (N > one key block) none of these."""
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
        top = (q.double() @ k.double().transpose(-1, -2)).amax().item() * scale
        if not torch.isfinite(out).any() and top < 88:
            return ALPHA_HINT.format(top=top)
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
    for slip, candidate in _loop_slips(q, k, v, scale, block).items():
        right = reference_attention(q, k, v, scale=scale).double().cpu()
        if rel_error(candidate, right) > 10 * tol and rel_error(out.double().cpu(), candidate) <= tol:
            return f"\nhint: {LOOP_HINTS[slip]}"
    if hint := _row_factor_hint(out, reference_attention(q, k, v, scale=scale), tol):
        return hint
    if k.shape[-2] > block:      # what carries between key blocks only matters from the second one on
        return RESCALE_HINT
    return ""


def _loop_slips(q, k, v, scale, block) -> dict:
    """O in float64 of the kernel's loop over key blocks of ``block`` keys with one slip each (`LOOP_HINTS`)."""
    q, k, v = (t.double().cpu() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) * scale
    slips = {}
    for slip in ("acc", "l", "divide", "shift"):
        m = torch.full(scores.shape[:-1], -torch.inf, dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros_like(q)
        for j in range(0, k.shape[-2], block):
            s = scores[..., j:j + block]
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s) if slip == "shift" else torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = (l if slip == "l" else l * alpha) + p.sum(-1)
            acc = (acc if slip == "acc" else acc * alpha[..., None]) + p @ v[..., j:j + block, :]
            m = m_new
        slips[slip] = acc if slip == "divide" else acc / l[..., None]
    slips["first block"] = torch.softmax(scores[..., :block], -1) @ v[..., :block, :]
    if q.shape[-2] == k.shape[-2] and q.shape[-2] % block == 0:
        rows = [slice(i, i + block) for i in range(0, q.shape[-2], block)]
        slips["own block"] = torch.cat([torch.softmax(scores[..., r, r], -1) @ v[..., r, :] for r in rows], -2)
    return slips


def _row_factor_hint(out, want, tol) -> str:
    """`ROW_FACTOR_HINT` when each row of ``out`` is the row of ``want`` times a constant of its own (not all 1)."""
    out, want = out.double().cpu(), want.double().cpu()
    factor = (out * want).sum(-1, keepdim=True) / (want * want).sum(-1, keepdim=True).clamp(min=1e-300)
    if rel_error(out, factor * want) > tol or (factor - 1).abs().max() <= 10 * tol:
        return ""
    return ROW_FACTOR_HINT.format(low=factor.min().item(), high=factor.max().item())


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
