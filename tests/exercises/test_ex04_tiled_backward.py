"""Tests for exercise 04 (tiled backward with recomputation)."""

import pytest
import torch

from flashlab import TOLERANCE, assert_close, reference_attention, reference_gradients, rel_error
from flashlab.lessons.instrument import LargestTensor
from tests.exercises.causal_tilings import CAUSAL_TILINGS, differing_rows
from tests.exercises.hints import backward_mistake


def _forward(q, k, v, is_causal, scale=None):
    """O and the log-sum-exp from the float64 reference (so ex04 does not need ex03b)."""
    out = reference_attention(q, k, v, is_causal=is_causal, scale=scale)
    scores = q.double() @ k.double().transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -torch.inf)
    return out.to(q.dtype), torch.logsumexp(scores, -1).to(torch.float64 if q.dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", [(1, 1, 8), (17, 17, 16), (45, 20, 8), (20, 45, 8), (260, 260, 16)])
def test_gradients_match_reference(exercise, Nq, Nk, D, is_causal):
    q, k, v = torch.randn(1, 2, Nq, D), torch.randn(1, 2, Nk, D), torch.randn(1, 2, Nk, D)
    out, lse = _forward(q, k, v, is_causal)
    grad_out = torch.randn_like(out)
    grads = exercise.tiled_attention_backward(q, k, v, out, lse, grad_out, is_causal=is_causal,
                                              block_m=64, block_n=32)
    for name, got, want in zip("qkv", grads, reference_gradients(q, k, v, grad_out, is_causal=is_causal)):
        assert got.dtype == torch.float32
        # fp32 recomputation of P from an fp32 lse: errors of about 1e-7, bound 1e-5
        try:
            assert_close(got, want, what=f"d{name}")
        except AssertionError as error:
            hint = backward_mistake(name, got, q, k, v, grad_out, is_causal) or _lse_ignored(
                exercise, grads, q, k, v, out, lse, grad_out, is_causal)
            raise AssertionError(f"{error}{hint}") from None




@pytest.mark.parametrize("Nq,Nk,block_m,block_n", CAUSAL_TILINGS)
def test_causal_tiles_cut_by_the_diagonal_are_computed(exercise, Nq, Nk, block_m, block_n):
    """Causal: skip a tile only when it lies wholly above the diagonal (its first key comes after
    the query block's last row); a tile the diagonal cuts, even at one corner, is computed and
    masked. Block sizes chosen so the diagonal cuts tiles at different offsets."""
    q, k, v = (torch.randn(1, 2, n, 8, dtype=torch.float64) for n in (Nq, Nk, Nk))
    grad_out = torch.randn(1, 2, Nq, 8, dtype=torch.float64)
    out, lse = _forward(q, k, v, False)      # first without causal: these tilings must work at all
    grads = exercise.tiled_attention_backward(q, k, v, out, lse, grad_out, block_m=block_m, block_n=block_n)
    for name, got, want in zip("qkv", grads, reference_gradients(q, k, v, grad_out)):
        assert got.dtype == torch.float64, f"d{name} is {got.dtype}: return gradients in the dtypes of q, k, v"
        try:
            assert_close(got, want, dtype=torch.float64,
                         what=f"d{name} (not causal, Nq={Nq}, Nk={Nk}, block_m={block_m}, block_n={block_n})")
        except AssertionError as error:
            raise AssertionError(f"{error}{backward_mistake(name, got, q, k, v, grad_out, False)}") from None
    out, lse = _forward(q, k, v, True)
    grads = exercise.tiled_attention_backward(q, k, v, out, lse, grad_out, is_causal=True,
                                              block_m=block_m, block_n=block_n)
    for name, got, want in zip("qkv", grads, reference_gradients(q, k, v, grad_out, is_causal=True)):
        rows = differing_rows(got, want)
        if not rows:
            continue
        axis = "query" if name == "q" else "key"
        said = (f"d{name}: {axis} rows {rows} differ from the float64 reference (causal, Nq={Nq}, Nk={Nk}, "
                f"block_m={block_m}, block_n={block_n}).")
        mask_hint = backward_mistake(name, got, q, k, v, grad_out, True, tol=1e-9)
        if mask_hint:                             # the mask's mistake, whatever the tiles: not the skipping
            raise AssertionError(f"{said}{mask_hint}")
        for rule, why in SKIP_RULES.items():
            wrong = _with_tiles_skipped(q, k, v, grad_out, block_m, block_n, rule)["qkv".index(name)]
            if differing_rows(wrong, want) and not differing_rows(got, wrong):
                raise AssertionError(f"{said}\nhint: {why}")
        raise AssertionError(
            f"{said} Skip a tile only when it lies wholly above the diagonal: its first key j comes after the query "
            "block's last row i + rows − 1 (rows = that block's real height, which the last block may cut short). "
            "A tile the diagonal cuts, even at one corner, must be computed with the mask kj > qi")


# the usual off-by-ones of causal tile skipping, each as (first key j, first row i, last row i + rows − 1) → skip?
SKIP_RULES = {
    lambda j, first, last: j >= last: (
        "the tile whose first key j is the query block's last row was skipped (j >= i + rows − 1): that tile "
        "holds the diagonal entry (last row, key j), which the row sees. Skip only when j > i + rows − 1"),
    lambda j, first, last: j > first: (
        "tiles were skipped from the query block's first row (j > i): its later rows see keys past i. Skip only "
        "when j > i + rows − 1, the block's last row"),
}


def _with_tiles_skipped(q, k, v, grad_out, block_m, block_n, skip):
    """(dQ, dK, dV) in float64 of causal attention whose tiles ``skip(j, i, i + rows − 1)`` are left out
    (their P taken as 0), the mask otherwise right: what a loop with that skipping rule returns."""
    q, k, v, grad_out = (t.double() for t in (q, k, v, grad_out))
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5
    keep = torch.ones(n_q, n_k, dtype=torch.bool).tril()
    for i in range(0, n_q, block_m):
        last = min(i + block_m, n_q) - 1
        for j in range(0, n_k, block_n):
            if skip(j, i, last):
                keep[i:last + 1, j:j + block_n] = False
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(), -torch.inf)
    p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True)).masked_fill(~keep, 0.0)   # the right P, tiles left out
    delta = (grad_out * reference_attention(q, k, v, is_causal=True)).sum(-1, keepdim=True)
    ds = p * (grad_out @ v.transpose(-1, -2) - delta)
    return ds @ k * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ grad_out


def test_never_forms_the_score_matrix(exercise):
    q, k, v = (torch.randn(1, 2, 300, 16) for _ in range(3))
    out, lse = _forward(q, k, v, False)
    with LargestTensor() as largest:
        exercise.tiled_attention_backward(q, k, v, out, lse, torch.randn_like(out), block_m=32, block_n=32)
    assert largest.numel <= max(q.numel(), 2 * 32 * 32), f"found a tensor of shape {largest.shape}"


def test_float64_gradients_stay_float64(exercise):
    q, k, v = (torch.randn(1, 1, 40, 8, dtype=torch.float64) for _ in range(3))
    out, lse = _forward(q, k, v, True)
    grad_out = torch.randn_like(out)
    grads = exercise.tiled_attention_backward(q, k, v, out, lse, grad_out, is_causal=True)
    for name, got, want in zip("qkv", grads, reference_gradients(q, k, v, grad_out, is_causal=True)):
        assert got.dtype == torch.float64, f"d{name}: return gradients in the dtypes of q, k, v"
        try:
            assert_close(got, want, dtype=torch.float64, what=f"d{name}")
        except AssertionError as error:
            raise AssertionError(f"{error}{backward_mistake(name, got, q, k, v, grad_out, True)}") from None


LSE_HINT = ("\nhint: recompute P = exp(S − lse) with the lse passed in. Given lse + log 2, every P, and so every "
            "gradient, halves; a backward that normalises P itself (a softmax per tile or per row, its own row "
            "sums) ignores lse, and does not")


def _lse_ignored(exercise, grads, q, k, v, out, lse, grad_out, is_causal) -> str:
    """`LSE_HINT` when the gradients do not halve as lse grows by log 2 (they would, were P exp(S − lse))."""
    halved = exercise.tiled_attention_backward(q, k, v, out, lse + torch.log(torch.tensor(2.0)), grad_out,
                                               is_causal=is_causal, block_m=64, block_n=32)
    return "" if all(rel_error(a, b / 2) <= 1e-4 for a, b in zip(halved, grads)) else LSE_HINT


def test_recomputes_p_from_the_given_logsumexp(exercise):
    """P = exp(S − lse) with the lse passed in: with lse + log 2 every P halves, and so does
    every gradient (dS = P ∘ (dP − D) is linear in P). A backward that recomputes its own
    normaliser instead of using lse does not halve."""
    q, k, v = (torch.randn(1, 2, 40, 8, dtype=torch.float64) for _ in range(3))
    out, lse = _forward(q, k, v, False)
    grad_out = torch.randn_like(out)
    full = exercise.tiled_attention_backward(q, k, v, out, lse, grad_out)
    halved = exercise.tiled_attention_backward(q, k, v, out, lse + torch.log(torch.tensor(2.0)), grad_out)
    for name, a, b in zip("qkv", halved, full):
        try:
            assert_close(a, b / 2, tol=1e-6, what=f"d{name} with lse + log 2")  # dS sums cancel: ~1e-9
        except AssertionError as error:
            raise AssertionError(f"{error}{LSE_HINT}") from None


@pytest.mark.parametrize("is_causal", [False, True])
def test_scale_argument(exercise, is_causal):
    """An explicit scale replaces the default 1/√D: S = Q Kᵀ · scale, dQ = dS K · scale, dK = dSᵀ Q · scale."""
    q, k, v = (torch.randn(1, 2, 40, 8, dtype=torch.float64) for _ in range(3))
    out, lse = _forward(q, k, v, is_causal, scale=0.6)
    grad_out = torch.randn_like(out)
    grads = exercise.tiled_attention_backward(q, k, v, out, lse, grad_out, is_causal=is_causal, scale=0.6,
                                              block_m=16, block_n=16)
    wants = reference_gradients(q, k, v, grad_out, is_causal=is_causal, scale=0.6)
    default = 8 ** -0.5
    ignored = all(torch.equal(a, b) for a, b in zip(grads, exercise.tiled_attention_backward(
        q, k, v, out, lse, grad_out, is_causal=is_causal, scale=default, block_m=16, block_n=16)))
    for name, got, want in zip("qkv", grads, wants):
        err = rel_error(got, want)
        hint = (f". Your gradients with scale=0.6 equal those with scale={default:.3f}: use the scale argument "
                "(1/√D only when it is None) in S = Q Kᵀ · scale and in dQ = dS K · scale, dK = dSᵀ Q · scale"
                if ignored else ". If test_gradients_match_reference (the default scale) fails too, the mistake is "
                "not the scale: fix that test first")
        assert err <= TOLERANCE[torch.float64], (
            f"d{name} with scale=0.6 (default 1/√D = {default:.3f}, is_causal={is_causal}): relative error "
            f"{err:.1e} exceeds {TOLERANCE[torch.float64]:.0e}{hint}")
