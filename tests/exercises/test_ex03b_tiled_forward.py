"""Tests for exercise 03b (tiled forward): float64 reference, odd sizes, causal, and
no Nq × Nk tensor."""

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from flashlab import TOLERANCE, assert_close, reference_attention, rel_error
from flashlab.lessons.instrument import LargestTensor
from tests.exercises.causal_tilings import CAUSAL_TILINGS, differing_rows
from tests.exercises.hints import require

CASES = [(1, 1, 16), (17, 17, 16), (100, 37, 8), (37, 100, 8), (260, 260, 16)]


class KeyBlockReads(TorchDispatchMode):
    """Counts, per block of ``block_n`` key rows, the operations that read part of K: of ``k``
    itself (through any view: slices, splits, transposes) or of a tensor made from all of K
    (``k.float() * scale`` or a transposed ``.contiguous()`` copy made before the loops), whose
    elements are followed back to the key row they came from. Views themselves read nothing; an
    operation reading every key block at once (such a cast, scaling or copy) is the same however
    many tiles are visited, so it is not counted, and its result is followed in turn."""

    def __init__(self, k: torch.Tensor, block_n: int):
        super().__init__()
        self.block_n, self.n_blocks = block_n, -(-k.shape[-2] // block_n)
        self.rows: dict[int, torch.Tensor] = {}   # storage address → key row of each element there (−1: none)
        self.followed: list[torch.Tensor] = []    # kept alive: their memory must not be reused by other tensors
        self.reads: Counter = Counter()
        self._follow(k, torch.arange(k.shape[-2])[:, None].expand(k.shape))

    def _follow(self, t: torch.Tensor, rows: torch.Tensor) -> None:
        storage = t.untyped_storage()
        flat = torch.full((storage.nbytes() // t.element_size(),), -1)
        flat.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(rows)
        self.rows[storage.data_ptr()] = flat
        self.followed.append(t)

    def _rows_of(self, t: torch.Tensor) -> torch.Tensor | None:
        flat = self.rows.get(t.untyped_storage().data_ptr())
        if flat is None or not t.numel() or flat.numel() * t.element_size() != t.untyped_storage().nbytes():
            return None
        return flat.as_strided(t.shape, t.stride(), t.storage_offset())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.is_view:
            return result
        whole = None
        for t in tree_leaves((args, kwargs)):
            rows = self._rows_of(t) if isinstance(t, torch.Tensor) else None
            if rows is not None:
                blocks = set((rows[rows >= 0] // self.block_n).unique().tolist())
                if len(blocks) < self.n_blocks:
                    self.reads.update(blocks)
                else:
                    whole = rows
        if whole is not None:               # a tensor made from all of K: follow its elements too
            for out in tree_leaves(result):
                if isinstance(out, torch.Tensor) and out.shape == whole.shape and self._rows_of(out) is None:
                    self._follow(out, whole)
        return result


def _tiled_with_slip(q, k, v, is_causal, scale, block_m, block_n, slip):
    """The output of the tiled forward computed here in float64 with one usual slip: "acc" (the accumulator
    not rescaled by α = e^(m − m')) or "max" (P̃ = e^S, the running max not subtracted; l and acc still
    rescaled by α). Which tiles are skipped does not matter: a fully masked tile adds nothing either way."""
    q, k, v = q.double(), k.double(), v.double()
    outs = []
    for i in range(0, q.shape[-2], block_m):
        s_rows = q[..., i:i + block_m, :] @ k.transpose(-1, -2) * scale
        if is_causal:
            above = torch.arange(k.shape[-2])[None, :] > torch.arange(i, i + s_rows.shape[-2])[:, None]
            s_rows = s_rows.masked_fill(above, -torch.inf)
        m = torch.full(s_rows.shape[:-1], -torch.inf, dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros(*s_rows.shape[:-1], v.shape[-1], dtype=torch.float64)  # noqa: E741
        for j in range(0, k.shape[-2], block_n):
            s = s_rows[..., j:j + block_n]
            m_new = torch.maximum(m, s.amax(-1))
            shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s) if slip == "max" else torch.exp(s - shift[..., None])
            alpha = torch.exp(m - shift)
            l = l * alpha + p.sum(-1)  # noqa: E741
            acc = (acc if slip == "acc" else acc * alpha[..., None]) + p @ v[..., j:j + block_n, :]
            m = m_new
        outs.append(acc / l[..., None])
    return torch.cat(outs, -2)


FORWARD_SLIPS = {
    "acc": "the accumulator was not rescaled: when the running max grows from m to m', the sum of P̃ V so far "
           "was weighed by e^(S − m), so multiply it by α = e^(m − m') as you do l: acc = α·acc + P̃ V",
    "max": "P̃ = e^S: the running max is not subtracted in the tile, while l and acc are rescaled by "
           "α = e^(m − m') as if it were. Take P̃ = exp(S − m') with m' = max(m, rowmax S), the new running max",
}


def _forward_hint(out, lse, q, k, v, is_causal, block_m, block_n, scale=None) -> str:
    """``"\\nhint: …"`` when ``out`` is what a usual slip of the tiled loop gives, or ``lse`` is log l without
    the running max (``lse`` None: not checked); else ``""``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    right = reference_attention(q.double(), k.double(), v.double(), is_causal=is_causal, scale=scale)
    for slip, hint in FORWARD_SLIPS.items():
        wrong = _tiled_with_slip(q, k, v, is_causal, scale, block_m, block_n, slip)
        if rel_error(wrong, right) > 1e-3 and rel_error(out.double(), wrong) <= 1e-4:
            return f"\nhint: {hint}"
    if lse is not None:
        scores = q.double() @ k.double().transpose(-1, -2) * scale
        if is_causal:
            scores = scores.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril().logical_not(),
                                        -torch.inf)
        log_l = torch.logsumexp(scores, -1) - scores.amax(-1)        # log Σ_j e^(S_ij − m_i), the final m
        if rel_error(lse.double(), log_l) <= 1e-4:
            return ("\nhint: lse = log l: l was summed against the running max, l = Σ_j e^(S_ij − m), so "
                    "log Σ_j e^(S_ij) = m + log l; add m back")
    return ""


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", CASES)
def test_matches_reference(exercise, Nq, Nk, D, is_causal):
    q, k, v = torch.randn(2, 2, Nq, D), torch.randn(2, 2, Nk, D), torch.randn(2, 2, Nk, D)
    out, lse = exercise.tiled_attention_forward(q, k, v, is_causal=is_causal, block_m=32, block_n=64)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == q.shape[:-1]
    assert lse.dtype == torch.float32, "lse in float32 for float32 inputs"
    scores = (q.double() @ k.double().transpose(-1, -2)) * D ** -0.5
    if is_causal:
        scores = scores.masked_fill(torch.ones(Nq, Nk, dtype=torch.bool).tril().logical_not(), -torch.inf)
    try:
        assert_close(out, reference_attention(q, k, v, is_causal=is_causal))
        assert_close(lse, torch.logsumexp(scores, -1), what="lse")
    except AssertionError as error:
        raise AssertionError(f"{error}{_forward_hint(out, lse, q, k, v, is_causal, 32, 64)}") from None


@pytest.mark.parametrize("is_causal", [False, True])
def test_rows_of_very_negative_scores(exercise, is_causal):
    """In about half of the rows every score is below −120 (q's first feature an integer 25–40,
    k's −28 to −32): e^S underflows fp32 there (below ≈ −103), so the running max must start at
    −inf; one started at 0 stays 0, e^(S − 0) = 0 for every key and O = 0/0 = NaN. Scores of size
    200 lose about 2e-5 to fp32 rounding in S − m, hence the wider tolerance."""
    n_q, n_k, d = 40, 70, 16
    q = torch.randn(1, 2, n_q, d)
    k, v = torch.randn(1, 2, n_k, d), torch.randn(1, 2, n_k, d)
    rows = torch.rand(1, 2, n_q) < 0.5
    rows[..., torch.randint(0, n_q, ())] = True
    q[..., 0] = torch.where(rows, torch.randint(25, 41, (1, 2, n_q)).float(), q[..., 0])
    k[..., 0] = -torch.randint(28, 33, (1, 2, n_k)).float()
    largest = (q @ k.transpose(-1, -2) * d ** -0.5).amax(-1)[rows].max().item()
    assert largest < -120, f"test inputs: a chosen row's largest score {largest:.0f} is not far below 0"
    out, lse = exercise.tiled_attention_forward(q, k, v, is_causal=is_causal, block_m=16, block_n=32)
    want = reference_attention(q, k, v, is_causal=is_causal)
    try:
        assert_close(out, want, tol=1e-4)
    except AssertionError as error:
        bad = (~torch.isfinite(out)).any(-1) | (out == 0).all(-1)          # per (batch, head, query row)
        scores = q.double() @ k.double().transpose(-1, -2) * d ** -0.5
        if is_causal:
            scores = scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril().logical_not(), -torch.inf)
        # the rows with ordinary scores: a running max started at 0 leaves them right (any common shift cancels)
        ordinary_right = rel_error(out[~rows], want[~rows]) <= 1e-4 and rel_error(
            lse[~rows], torch.logsumexp(scores, -1)[~rows]) <= 1e-4
        if is_causal and bad.nonzero()[:, -1].unique().tolist() == [0]:
            hint = ("\nhint: only query row 0 is NaN or 0: query i must see keys 0..i, its own key included (mask "
                    "where kj > qi, not kj >= qi); with key 0 masked, row 0 has no key at all (0/0)")
        elif bad.any() and not ordinary_right:
            hint = ("\nhint: NaN or 0 in rows whose every score is far below 0 (e^S underflows fp32 to 0 below "
                    "≈ −103), and the rows with ordinary scores are wrong too (output or lse): the exponentials "
                    "must be taken against the running max, P̃ = exp(S − m') with m' = max(m, rowmax S), so each "
                    "row's largest term is e⁰ = 1; l and acc are rescaled by exp(m − m')"
                    + _forward_hint(out, None, q, k, v, is_causal, 16, 32))
        elif bad.any():
            hint = ("\nhint: NaN or 0 in rows whose every score is far below 0: e^(S − m) underflows fp32 to 0 for "
                    "S − m below ≈ −88 (−103 with subnormals), so l = 0, unless m is the row's true running max. "
                    "Start it at −inf (torch.full(…, -torch.inf)), not at 0 (torch.zeros), and update "
                    "m' = max(m, rowmax S)")
        else:
            hint = ""
        raise AssertionError(f"{error}{hint}") from None


def test_half_precision_inputs(exercise):
    q, k, v = (torch.randn(1, 2, 50, 16, dtype=torch.float16) for _ in range(3))
    out, lse = exercise.tiled_attention_forward(q, k, v, block_m=16, block_n=16)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32, "out in q's dtype, lse in float32"
    assert_close(out, reference_attention(q, k, v), dtype=torch.float16)


def test_never_forms_the_score_matrix(exercise):
    q, k, v = (torch.randn(1, 2, 300, 16) for _ in range(3))
    with LargestTensor() as largest:
        exercise.tiled_attention_forward(q, k, v, block_m=32, block_n=32)
    # anything bigger than an output-sized tensor or a (B·H) × tile would be a full N×N row band
    assert largest.numel <= max(q.numel(), 2 * 32 * 32), f"found a tensor of shape {largest.shape}"


def _key_block_reads(exercise, is_causal, n=128, block=32):
    q, k, v = (torch.randn(1, 2, n, 16) for _ in range(3))
    with KeyBlockReads(k, block) as counter:
        exercise.tiled_attention_forward(q, k, v, is_causal=is_causal, block_m=block, block_n=block)
    return [counter.reads[j] for j in range(n // block)]


def test_causal_skips_key_blocks_above_the_diagonal(exercise):
    """128 queries and keys in blocks of 32: query block i needs key blocks 0..i only, so
    key block j is visited by 4 − j query blocks: fewer and fewer as j grows. Without
    skipping every key block is visited 4 times (counted as reads of K's rows, or of the
    rows of a tensor made from all of K, such as K · scale computed before the loops)."""
    reads = _key_block_reads(exercise, is_causal=True)
    assert all(reads), (
        f"operations reading each key block of K: {reads}; every key block is needed by some query. Compute each "
        "tile's scores from one block of keys, k[..., j:j + block_n, :] (or the same rows of a tensor made from all "
        "of K, such as K · scale), never from all the keys at once")
    assert all(a > b for a, b in zip(reads, reads[1:])), (
        f"operations reading key blocks 0..3 of K: {reads}, but a causal run must skip the key blocks "
        "entirely above the diagonal (key block j is needed by query blocks j..3 only): for the query block "
        "starting at row i, stop the key loop at min(Nk, i + its number of rows)")


def test_causal_never_reads_keys_past_the_last_query(exercise):
    """40 queries, 300 keys, causal: keys ≥ 40 are masked for every query, and the key
    blocks past the last query block must never be read. Their values hold NaN: a loop
    that reads them and masks afterwards returns NaN (0 · NaN = NaN in P V)."""
    q = torch.randn(1, 2, 40, 16)
    k, v = torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16)
    v[:, :, 64:] = float("nan")                   # past the block of keys 32..63 (block_n = 32)
    out, _ = exercise.tiled_attention_forward(q, k, v, is_causal=True, block_m=16, block_n=32)
    bad_rows = (~torch.isfinite(out)).any(-1).any(0).any(0).nonzero().flatten().tolist()
    require(bad_rows != [0], (
        "query row 0 came out non-finite and no other row did: query i must see keys 0..i, its own key included "
        "(mask the scores where kj > qi, not kj >= qi); with key 0 masked, row 0 has no key at all (0/0)"))
    require(not bad_rows, (f"query rows {bad_rows[:8]}{' …' if len(bad_rows) > 8 else ''} came out non-finite: the "
                          "loop visited key blocks that lie entirely above the diagonal (their values hold NaN here)"))
    assert_close(out, reference_attention(q, k[:, :, :40], v[:, :, :40], is_causal=True))


@pytest.mark.parametrize("Nq,Nk,block_m,block_n", CAUSAL_TILINGS)
def test_causal_tiles_cut_by_the_diagonal_are_computed(exercise, Nq, Nk, block_m, block_n):
    """Causal: stop a query block's key loop only after the block's last row (i + rows − 1); a tile
    the diagonal cuts, even at one corner, is computed and masked. A learner's loop that broke at the
    block's first row passed every square tiling and was off by 0.3–0.7 at block_m = 64, block_n = 32."""
    q, k, v = (torch.randn(1, 2, n, 8, dtype=torch.float64) for n in (Nq, Nk, Nk))
    # first without causal: these tilings must work at all, or the causal message below would blame the loop
    # bounds for a mistake in the tiles (a learner's trial: the accumulator not rescaled got the bounds' hint)
    out, _ = exercise.tiled_attention_forward(q, k, v, block_m=block_m, block_n=block_n)
    try:
        assert_close(out, reference_attention(q, k, v), dtype=torch.float64,
                     what=f"output (not causal, Nq={Nq}, Nk={Nk}, block_m={block_m}, block_n={block_n})")
    except AssertionError as error:
        raise AssertionError(f"{error}{_forward_hint(out, None, q, k, v, False, block_m, block_n)}") from None
    out, lse = exercise.tiled_attention_forward(q, k, v, is_causal=True, block_m=block_m, block_n=block_n)
    want = reference_attention(q, k, v, is_causal=True)
    rows = differing_rows(out, want)
    require(not rows, (
        f"query rows {rows} differ from the float64 reference (causal, Nq={Nq}, Nk={Nk}, block_m={block_m}, "
        f"block_n={block_n}). A query block's key loop must run to its last row's key, min(Nk, i + rows) with rows "
        "that block's real height (the last block may be cut short), not stop at its first row i; a tile the "
        "diagonal cuts is computed with the mask kj > qi"))


def test_float64_inputs_keep_float64(exercise):
    q, k, v = (torch.randn(1, 1, 45, 8, dtype=torch.float64) for _ in range(3))
    out, lse = exercise.tiled_attention_forward(q, k, v, is_causal=True, block_m=16, block_n=16)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    try:
        assert_close(out, reference_attention(q, k, v, is_causal=True), dtype=torch.float64)
    except AssertionError as error:
        raise AssertionError(f"{error}{_forward_hint(out, None, q, k, v, True, 16, 16)}") from None


def test_scale_argument(exercise):
    """An explicit scale replaces the default 1/√D, in the output and in the log-sum-exp."""
    q, k, v = torch.randn(1, 2, 40, 16), torch.randn(1, 2, 50, 16), torch.randn(1, 2, 50, 16)
    for is_causal in (False, True):
        out, lse = exercise.tiled_attention_forward(q, k, v, is_causal=is_causal, scale=0.7, block_m=16, block_n=16)
        err = rel_error(out, reference_attention(q, k, v, is_causal=is_causal, scale=0.7))
        hint = ""
        if rel_error(out, reference_attention(q, k, v, is_causal=is_causal)) <= TOLERANCE[torch.float32]:
            hint = "; it matches the default scale 1/√D = 0.25: use the scale argument (1/√D only when it is None)"
        assert err <= TOLERANCE[torch.float32], (
            f"output with scale=0.7 (is_causal={is_causal}): relative error {err:.1e} exceeds "
            f"{TOLERANCE[torch.float32]:.0e}{hint}")
        scores = (q.double() @ k.double().transpose(-1, -2)) * 0.7
        if is_causal:
            scores = scores.masked_fill(torch.ones(40, 50, dtype=torch.bool).tril().logical_not(), -torch.inf)
        assert_close(lse, torch.logsumexp(scores, -1), what=f"lse with scale=0.7, is_causal={is_causal}")


@pytest.mark.parametrize("is_causal", [False, True])
def test_value_width_may_differ(exercise, is_causal):
    """v may have its own width Dv ≠ D: out is (..., Nq, Dv), and so is the accumulator."""
    q, k, v = torch.randn(2, 37, 16), torch.randn(2, 50, 16), torch.randn(2, 50, 24)
    try:
        out, lse = exercise.tiled_attention_forward(q, k, v, is_causal=is_causal, block_m=16, block_n=16)
    except NotImplementedError:          # a RuntimeError too: the stub, reported as not started
        raise
    except RuntimeError as err:
        raise AssertionError(
            f"with q, k of width D = 16 and v of width Dv = 24 it raised {err}: the accumulator and out take v's "
            "width, (..., rows, Dv) and (..., Nq, Dv) with Dv = v.shape[-1], not q's") from err
    assert out.shape == (2, 37, 24), (
        f"out has shape {tuple(out.shape)}, expected (2, 37, 24): out is (..., Nq, Dv) with Dv = v.shape[-1] "
        "(allocate it from v's width, not like q)")
    assert lse.shape == (2, 37)
    assert_close(out, reference_attention(q, k, v, is_causal=is_causal))


def test_half_precision_accumulates_in_float32(exercise):
    """fp16 inputs, 2048 keys in blocks of 16: the values are +4 for the first half of the keys
    and −4 for the second (plus noise), so the running sum of P V climbs to ~4000 and cancels
    back to a small output. Kept in fp16 (11 bits), every update rounds that sum by up to 2, and
    the output is off by 1-3e-2; kept in float32 it is off by the output's own rounding (2e-4)."""
    q, k = torch.randn(1, 2, 16, 16).half(), torch.randn(1, 2, 2048, 16).half()
    v = torch.randn(1, 2, 2048, 16)
    v[..., :1024, :] += 4
    v[..., 1024:, :] -= 4
    v = v.half()
    out, _ = exercise.tiled_attention_forward(q, k, v, block_m=16, block_n=16)
    err = rel_error(out, reference_attention(q, k, v))
    assert err <= TOLERANCE[torch.float16], (
        f"fp16 inputs, 2048 keys whose values sum to ~4000 and cancel: output relative error {err:.1e} exceeds "
        f"{TOLERANCE[torch.float16]:.0e}. Keep m, l and the accumulator in float32 (float64 for float64 inputs) "
        "whatever q's dtype, and round only the final output to q's dtype")
