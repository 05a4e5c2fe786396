"""Tests for exercise 01 (attention from einsum), against the float64 reference.

Run against your work: ``pytest tests/exercises/test_ex01_naive_attention.py``;
against the reference answers: ``pytest --impl=solutions tests/exercises/test_ex01_naive_attention.py``.
"""

import pytest
import torch

from flashlab import assert_close, reference_attention, reference_gradients
from tests.exercises.hints import require


def test_scores_match_matmul(exercise):
    q, k = torch.randn(2, 3, 17, 8, dtype=torch.float64), torch.randn(2, 3, 5, 8, dtype=torch.float64)
    scores = exercise.attention_scores(q, k, 0.25)
    assert scores.shape == (2, 3, 17, 5)
    assert_close(scores, (q @ k.transpose(-1, -2)) * 0.25, what="scores")
    assert exercise.attention_scores(q.float(), k.float(), 0.25).dtype == torch.float32, "scores in q's dtype"


def test_value_width_may_differ(exercise):
    """v may have its own width Dv: the output is (..., Nq, Dv); the default scale uses q's D."""
    q, k = torch.randn(2, 7, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    v = torch.randn(2, 5, 3, dtype=torch.float64)
    out = exercise.attention(q, k, v)
    assert out.shape == (2, 7, 3)
    try:
        assert_close(out, reference_attention(q, k, v))
    except AssertionError as error:
        raise AssertionError(f"{error}{_usual_mistake(out, q, k, v, False)}") from None


@pytest.mark.parametrize("n_queries,n_keys", [(1, 1), (4, 4), (3, 7), (7, 3)])
def test_causal_mask_is_top_left_aligned(exercise, n_queries, n_keys):
    mask = exercise.causal_mask(n_queries, n_keys)
    require(isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.shape == (n_queries, n_keys),
            f"causal_mask({n_queries}, {n_keys}): expected a bool tensor of shape ({n_queries}, {n_keys}), got "
            + (f"{mask.dtype}, shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__))
    i = torch.arange(n_queries)[:, None]
    j = torch.arange(n_keys)[None, :]
    want = j <= i
    if not torch.equal(mask, want):
        row = int((mask != want).any(1).nonzero()[0])
        seen = mask[row].nonzero().flatten().tolist()
        raise AssertionError(
            f"causal_mask({n_queries}, {n_keys}): query {row} must see exactly keys 0..{min(row, n_keys - 1)} "
            f"(True where key j ≤ query i, top-left aligned), but it sees keys {seen}.\n"
            f"got (1 = True):\n{mask.int()}\nexpected:\n{want.int()}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("n_queries,n_keys,head_dim", [(1, 1, 4), (17, 17, 16), (17, 33, 8),
                                                        (64, 20, 32)])
def test_attention_matches_reference(exercise, dtype, is_causal, n_queries, n_keys, head_dim):
    q = torch.randn(2, 3, n_queries, head_dim, dtype=dtype)
    k = torch.randn(2, 3, n_keys, head_dim, dtype=dtype)
    v = torch.randn(2, 3, n_keys, head_dim, dtype=dtype)
    out = exercise.attention(q, k, v, is_causal=is_causal)
    assert out.shape == (2, 3, n_queries, head_dim) and out.dtype == dtype
    try:
        assert_close(out, reference_attention(q, k, v, is_causal=is_causal), dtype=dtype)
    except AssertionError as error:
        raise AssertionError(f"{error}{_usual_mistake(out, q, k, v, is_causal)}") from None


def _usual_mistake(out, q, k, v, is_causal) -> str:
    """``"\\nhint: …"`` when ``out`` is what a usual slip gives (computed here in float64), else ``""``."""
    q, k, v = q.double(), k.double(), v.double()
    d = q.shape[-1]
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    scores = q @ k.transpose(-1, -2)

    def attend(s, masked=is_causal):
        return torch.softmax(s.masked_fill(~keep, -torch.inf) if masked else s, -1) @ v
    slips = {
        "scores scaled by 1/d, not 1/√d": (attend(scores / d), f"the default scale is 1/√d = 1/√{d}, d = "
                                           "q.shape[-1]: it keeps the scores' spread about 1 whatever d"),
        "scores not scaled": (attend(scores), "scale the scores by 1/√d (d = q.shape[-1]) before the softmax"),
        "masked scores set to 0 (multiplied by the mask), not −inf": (
            torch.softmax(scores * d ** -0.5 * keep, -1) @ v,
            "exp(0) = 1 still weighs a masked key; give masked scores −inf (masked_fill(~mask, -inf)), so that "
            "exp(−inf) = 0"),
    }
    masked = scores * d ** -0.5
    if is_causal:
        masked = masked.masked_fill(~keep, -torch.inf)
    slips["softmax taken over the queries (dim=-2), not over the keys"] = (
        torch.softmax(masked, -2) @ v,
        "each query's weights P_ij must sum to 1 over the keys j, the last dimension of S (..., Nq, Nk): "
        "softmax(scores, dim=-1). (With the causal mask, a column of S whose every entry is −inf then gives NaN)")
    for what, (wrong, fix) in slips.items():
        right = attend(scores * d ** -0.5)
        if not torch.allclose(wrong, right, equal_nan=True) and torch.allclose(out.double(), wrong, atol=1e-4,
                                                                               equal_nan=True):
            return f"\nhint: that is attention with its {what}: {fix}"
    return ""


def test_attention_scale_and_gradients(exercise):
    q, k, v = (torch.randn(1, 2, 9, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = exercise.attention(q, k, v, scale=0.3)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    try:
        assert_close(out, reference_attention(q, k, v, scale=0.3))
    except AssertionError as error:
        with torch.no_grad():
            ignored = torch.equal(out, exercise.attention(q, k, v))
        hint = (f"\nhint: with scale=0.3 you return what you return with the default 1/√D = {8 ** -0.5:.3f}: use the "
                "scale argument (1/√D only when it is None)") if ignored else ""
        raise AssertionError(f"{error}{hint}") from None
    ref_grads = reference_gradients(q, k, v, grad_out, scale=0.3)
    for name, g, rg in zip("qkv", grads, ref_grads):
        assert_close(g, rg, what=f"d{name}")


def test_large_scores_do_not_overflow(exercise):
    """Scores of about ±1000: e^S overflows (e^710 is inf even in float64) unless the row max is
    subtracted before the exponential, as torch.softmax does; the result itself is ordinary."""
    q = torch.randn(1, 2, 9, 16, dtype=torch.float64) * 30
    k = torch.randn(1, 2, 11, 16, dtype=torch.float64) * 30
    v = torch.randn(1, 2, 11, 16, dtype=torch.float64)
    out = exercise.attention(q, k, v)
    biggest = (q @ k.transpose(-1, -2) * 16 ** -0.5).amax(-1).max().item()
    require(torch.isfinite(out).all(), (
        f"scores up to {biggest:.0f} gave inf or NaN: exp(S) overflows (inf / inf = NaN) or, shifted by one maximum "
        "for the whole tensor, underflows to 0 in rows whose scores lie far below it (0 / 0 = NaN). Subtract each "
        "row's own maximum before the exponential (S − S.amax(-1, keepdim=True): exp ≤ 1 and each row's largest term "
        "is 1, the same softmax), or use torch.softmax(scores, dim=-1)"))
    assert_close(out, reference_attention(q, k, v), dtype=torch.float64)
