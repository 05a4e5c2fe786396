"""Tests for exercise 05b (forward kernel: causal masking, skipped tiles, any N)."""

import math

import pytest
import torch

from flashlab import assert_close, reference_attention
from flashlab.reference.float64 import TF32_TOLERANCE, reference_logsumexp, rel_error
from tests.exercises.hints import require, unwritten
from tests.exercises.padded_launch import PaddedLaunch, run_padded, tile_reach, written_outside

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5 if DEVICE == "cpu" else TF32_TOLERANCE, torch.float16: 3e-3}

RAGGED_HINT = ("\nhint: Nk = {n_k} is not a multiple of BLOCK_N = {block}, and the same call passes with "
               "Nk rounded up to one: mask the ragged end of the keys, load K and V with "
               "mask=cols < n_k and set the scores of keys cols ≥ n_k to −inf before the row max")
CAUSAL_HINT = ("\nhint: the same call without is_causal passes, so the causal part is wrong: the loop bound "
               "hi = min(Nk, (start_m + 1)·BLOCK_M) and the mask cols <= rows inside the tile "
               "(key j ≤ query i: `<=` keeps the diagonal)")
BOUND_SHORT_HINT = ("\nhint: each query block reads the key blocks before its own and stops short of its diagonal "
                    "block: rows of block b see keys < b·BLOCK_M only (block 0 none: O = 0 or NaN there). The causal "
                    "loop runs to the block's last row, hi = min(Nk, (start_m + 1)·BLOCK_M)")

MAX_INIT_HINT = ("\nhint: the same call passes with ordinary scores, and fails where every score of a row is far "
                 "below 0: e^(S − m) underflows fp32 to 0 for S − m below ≈ −88 (−103 with subnormals), so "
                 "ℓ = 0, unless m is the row's true running max. Start it at −inf, m_i = tl.full([BLOCK_M], "
                 "-float(\"inf\"), tl.float32), not at 0 (tl.zeros), and update m' = max(m, rowmax S)")


NAN_WITHOUT_SENTINELS = ("the output holds NaN even with every key finite, so the NaN is not from reading the masked "
                         "tiles: some row has no key left (ℓ = 0, O = 0/0). With causal masking, query i must keep "
                         "key i: cols <= rows, not cols < rows, which leaves row 0 with none "
                         "(test_matches_float64's failures say more)")


# what lies after each tensor when the kernel runs (`PaddedLaunch`): NaN after Q, K and V, so a load past the end
# (keys ≥ Nk of the last head: 0 · NaN = NaN in P V) shows in every run, not only when the memory there happens
# to hold a NaN; after O and L a value no store writes, so a store past the end is named
PAST_THE_END = {"Q": float("nan"), "K": float("nan"), "V": float("nan")}
STORED_NOTHING = 7.0


def _launch_padded(kernel, grid, args, kwargs):
    """flash_forward_kernel on copies of its tensors inside larger buffers (`run_padded`), copied back; fails if
    it stored outside O or L."""
    copies = run_padded(kernel, grid, args, kwargs, lambda name: PAST_THE_END.get(name, STORED_NOTHING),
                        extra_reach=tile_reach(kernel, grid, args, kwargs))
    problems = []
    for name, (t, fill, buffer, inside, copy) in copies.items():
        t.copy_(copy)
        if name in ("O", "L"):
            written = written_outside(buffer, inside, fill)
            if written:
                problems.append(f"flash_forward_kernel stored {written} values past the end of {name}: mask the "
                                "store with the rows < n_q (mask=offs_m < n_q)")
    require(not problems, "; ".join(problems))


@pytest.fixture
def exercise(exercise, monkeypatch):
    """conftest.py's `exercise`, with flash_forward_kernel launched through `PaddedLaunch`."""
    monkeypatch.setattr(exercise, "flash_forward_kernel", PaddedLaunch(exercise.flash_forward_kernel, _launch_padded))
    return exercise


def _passes(exercise, q, k, v, is_causal, tol):
    """Whether the exercise's O matches float64 on these inputs."""
    out, _ = exercise.flash_forward(q, k, v, is_causal=is_causal)
    want = reference_attention(q, k, v, is_causal=is_causal)
    return bool(torch.isfinite(out).all()) and rel_error(out, want) <= tol


def _hint(exercise, q, k, v, is_causal, tol):
    """The signature of a failure, found by running the exercise on related inputs: passing with
    Nk a block multiple (the ragged-end key mask), passing without the causal mask (loop bounds
    or the diagonal)."""
    n_k, block = k.shape[-2], exercise.BLOCK
    if n_k % block:
        extra = block - n_k % block
        more = [torch.cat([t, torch.randn(*t.shape[:-2], extra, t.shape[-1], device=t.device, dtype=t.dtype)], -2)
                for t in (k, v)]
        if _passes(exercise, q, *more, is_causal, tol):
            return RAGGED_HINT.format(n_k=n_k, block=block)
    if is_causal and _stops_before_diagonal(exercise, q, k, v, tol):
        return BOUND_SHORT_HINT
    if is_causal and _passes(exercise, q, k, v, False, tol):
        return CAUSAL_HINT
    return ""


def _stops_before_diagonal(exercise, q, k, v, tol) -> bool:
    """Whether the exercise's causal O is attention over the keys before each query block's own key block
    (0 or NaN in rows that see none): the loop bound one block short. Where every query is in block 0 (no row
    would see a key), the exercise runs again on three blocks' worth of fresh rows, which tell it apart."""
    block, n_q, n_k = exercise.BLOCK, q.shape[-2], k.shape[-2]
    keep = torch.arange(n_k)[None, :] < (torch.arange(n_q) // block * block)[:, None]
    if not keep.any():
        if n_q > block:
            return False
        q, k, v = (torch.randn(*t.shape[:-2], 3 * block - 5, t.shape[-1], device=t.device, dtype=t.dtype)
                   for t in (q, k, v))
        return _stops_before_diagonal(exercise, q, k, v, tol)
    out, _ = exercise.flash_forward(q, k, v, is_causal=True)
    q64, k64, v64 = (t.double().cpu() for t in (q, k, v))
    scores = (q64 @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~keep, -torch.inf)
    want = (torch.softmax(scores, -1) @ v64).nan_to_num(0.0)
    return rel_error(out.double().cpu().nan_to_num(0.0), want) <= tol


def _check(exercise, out, lse, q, k, v, is_causal, tol):
    """assert_close of O and L, with a hint where the failure has a known signature."""
    try:
        assert_close(out, reference_attention(q, k, v, is_causal=is_causal), tol=tol)
        assert_close(lse, reference_logsumexp(q, k, is_causal), tol=tol, what="lse")
    except AssertionError as error:
        hint = unwritten(out, "O") or unwritten(lse, "L") or _hint(exercise, q, k, v, is_causal, tol)
        raise AssertionError(f"{error}{hint}") from None


def _check_output(exercise, out, q, k, v):
    """O of a causal call against float64, with `_hint`'s hint where the failure has a known signature
    (these tests are about which tiles are read; a wrong diagonal fails here too)."""
    try:
        assert_close(out, reference_attention(q, k, v, is_causal=True), tol=TOL[torch.float32])
    except AssertionError as error:
        hint = unwritten(out, "O") or _hint(exercise, q, k, v, True, TOL[torch.float32])
        raise AssertionError(f"{error}{hint}") from None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", [(1, 1, 16), (17, 17, 16), (100, 100, 32), (40, 70, 16), (70, 40, 64)])
def test_matches_float64(exercise, Nq, Nk, D, is_causal, dtype):
    q = torch.randn(2, 2, Nq, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(2, 2, Nk, D, device=DEVICE, dtype=dtype) for _ in range(2))
    out, lse = exercise.flash_forward(q, k, v, is_causal=is_causal)
    assert out.shape == q.shape and lse.shape == (2, 2, Nq)
    _check(exercise, out, lse, q, k, v, is_causal, TOL[dtype])


def test_causal_skips_tiles_above_the_diagonal(exercise):
    """40 queries, 300 keys, causal: keys ≥ 40 are masked for every query, and whole key
    blocks past the last query block must never be read. They hold NaN here: a kernel that
    reads them and masks afterwards returns NaN (0 · NaN = NaN in P V)."""
    q = torch.randn(1, 2, 40, 16, device=DEVICE)
    k, v = (torch.randn(1, 2, 300, 16, device=DEVICE) for _ in range(2))
    finite_out, _ = exercise.flash_forward(q, k, v, is_causal=True)
    require(torch.isfinite(finite_out).all(), NAN_WITHOUT_SENTINELS)
    k[:, :, 128:], v[:, :, 128:] = float("nan"), float("nan")   # beyond any block size up to 128
    out, _ = exercise.flash_forward(q, k, v, is_causal=True)
    require(torch.isfinite(out).all(), "the kernel read key tiles that causal masking makes useless")
    _check_output(exercise, out, q, k[:, :, :40], v[:, :, :40])


def test_each_query_block_stops_at_its_own_diagonal(exercise):
    """The kernel alone, only program 0 (queries 0..31) launched, 64 queries and keys:
    it needs keys 0..31, so it must stop there, not at Nq or Nk. Keys 32..63 hold NaN in V:
    reading them gives NaN (0 · NaN in P V)."""
    block, n, d = exercise.BLOCK, 2 * exercise.BLOCK, 16
    q, k, v = (torch.randn(1, n, d, device=DEVICE) for _ in range(3))
    exercise.flash_forward(q[None], k[None], v[None])   # a stub launcher raises: "not started", not a failure

    def block_0(v):
        out = torch.zeros(1, n, d, device=DEVICE)
        lse = torch.zeros(1, n, device=DEVICE)
        exercise.flash_forward_kernel[(1, 1)](q, k, v, out, lse, n, n, d ** -0.5, HEAD_DIM=d, IS_CAUSAL=True,
                                              BLOCK_M=block, BLOCK_N=block)
        return out

    require(torch.isfinite(block_0(v)[:, :block]).all(), NAN_WITHOUT_SENTINELS)
    v[:, block:] = float("nan")
    out = block_0(v)
    require(torch.isfinite(out[:, :block]).all(),
            "query block 0 read key blocks past its last query: stop at min(Nk, (start_m + 1)·BLOCK_M)")
    _check_output(exercise, out[None, :, :block], q[None, :, :block], k[None, :, :block], v[None, :, :block])


@pytest.mark.parametrize("is_causal", [False, True])
def test_rows_of_very_negative_scores(exercise, is_causal):
    """Nq = 40, Nk = 70; in about half of the rows every score is below −120 (q's first feature an
    integer 25–40, k's −28 to −32): e^S underflows fp32 there, so the running max must start at
    −inf; one started at 0 stays 0 and gives ℓ = 0 in those rows (O = 0/0, or 0 with ℓ guarded).
    Scores of size 200 lose about 2e-5 to fp32 rounding in S − m, hence the wider tolerance."""
    n_q, n_k, d = 40, 70, 16
    q = torch.randn(1, 2, n_q, d, device=DEVICE)
    k, v = (torch.randn(1, 2, n_k, d, device=DEVICE) for _ in range(2))
    plain = q.clone()
    rows = torch.rand(1, 2, n_q, device=DEVICE) < 0.5
    rows[..., torch.randint(0, n_q, ())] = True
    q[..., 0] = torch.where(rows, torch.randint(25, 41, (1, 2, n_q), device=DEVICE).float(), q[..., 0])
    k[..., 0] = -torch.randint(28, 33, (1, 2, n_k), device=DEVICE).float()
    largest = (q @ k.transpose(-1, -2) / math.sqrt(d)).amax(-1)[rows].max().item()
    assert largest < -120, f"test inputs: a chosen row's largest score {largest:.0f} is not far below 0"
    out, lse = exercise.flash_forward(q, k, v, is_causal=is_causal)
    tol = 1e-4 if DEVICE == "cpu" else TF32_TOLERANCE
    try:
        assert_close(out, reference_attention(q, k, v, is_causal=is_causal), tol=tol)
        assert_close(lse, reference_logsumexp(q, k, is_causal), tol=tol, what="lse")
    except AssertionError as error:
        hint = MAX_INIT_HINT if _passes(exercise, plain, k, v, is_causal, tol) else ""
        raise AssertionError(f"{error}{hint}") from None
