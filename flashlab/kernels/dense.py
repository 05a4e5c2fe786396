"""FlashAttention in Triton: the forward kernel and the two backward kernels.

The algorithm is notebook 03/04's tiled attention; here each tile really lives on chip.

Forward, one program per (block of BLOCK_M queries, batch·head):
    load Q_i once; for each key block j (causal: only j up to the diagonal)
        S = Q_i K_jᵀ · scale·log2(e)          (exponents in base 2: exp2 is one instruction;
                                               soft-capped, masked: `flashlab.kernels.tile`)
        m' = max(m, rowmax S);  P̃ = 2^(S − m');  l' = l·2^(m − m') + rowsum P̃
        acc' = acc·2^(m − m') + P̃ V_j
    O_i = acc / l;  L_i = m + log2 l  (base-2 log-sum-exp, +inf for a row with no key)

Every rule a tile follows (scores, soft-capping, which keys a query sees, the attn_mask, dropout,
the online-softmax update, the log-sum-exp) is `flashlab.kernels.tile`'s, shared with the other
kernel families; this module walks the tiles.

Tiles that need no mask (whole blocks, below the causal diagonal, no attn_mask) run on an
unchecked fast path in all three kernels; the rest are checked.

Sliding windows (HAS_WINDOW): query i sees key j iff i + band_lo ≤ j ≤ i + band_hi
(`flashlab.reference.naive.window_band` turns attention's ``window=(left, right)`` into that band,
causality folded in). The key
loops of the forward and the dQ pass, and the query loop of the dK/dV pass, run only over the
tiles the band touches; the tiles wholly inside it take the fast path, the band's two edges
are masked, everything else is never read. The work then grows with the window, not with N.

Backward:
    preprocess   D_i = rowsum(dO_i ∘ O_i)
    dK/dV pass   one program per key block (and k/v head): K_j, V_j stay on chip while all
                 query blocks (of every q head of the group, for GQA) stream past:
                 P = 2^(S − L), dV_j += Pᵀ dO_i, dP = dO_i V_jᵀ, dS = P ∘ (dP − D_i),
                 dK_j += dSᵀ Q_i · scale
    dQ pass      one program per query block: dQ_i += dS K_j · scale
No atomics: every output tile has exactly one writer, so results are deterministic.

Dropout (FlashAttention's way): entry (b, h, i, j) of P is kept iff a Philox random number,
keyed by (seed, b·H + h) and counted by i·Nk + j, is ≥ p. Every kernel that needs the
bit for (b, h, i, j) regenerates it, so the N×N mask is never stored:
    forward      acc += (P̃ ∘ Z) V_j, and O = acc / (l·(1 − p))   (l sums the undropped P̃)
    backward     dV += (P ∘ Z/(1−p))ᵀ dO,  dP = (dO Vᵀ) ∘ Z/(1−p),  dS = P ∘ (dP − D)
D = rowsum(dO ∘ O) still equals rowsum(P ∘ dP) because O already holds the dropped P.
With soft-capping (SOFTCAP) dS is multiplied by the cap's derivative before dQ and dK.

Masks are read tile by tile through their strides; broadcast dimensions have stride 0,
so a (B, 1, 1, Nk) key-padding mask is never expanded in memory.

Layout, as in Triton's fused-attention tutorial: each program shifts its base pointers (Q, K,
V, the mask, L, D; the outputs where it stores them) to its own batch and head, once; the
helpers then take those pointers (or pointer tiles) with the one stride they step along. Every tensor's head
dimension is contiguous (stride 1, arranged by the launcher), and L and D are contiguous
(B, H, Nq) tensors, so neither needs strides of its own. The key range of a query block
(`_key_range`) is one helper shared by the forward and the dQ pass; `_query_range` is the
dK/dV pass's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tile import (
    clean_range,
    dot,
    dot_acc,
    dropout_keep,
    finish_rows,
    key_value_gradients,
    l_fix,
    mask_tile_ptrs,
    masked_scores,
    online_softmax_step,
    scores,
    soft_cap_grad,
)

SKIPPED, MASKED, FULL = 0, 1, 2   # what the causal forward does with a (query block, key block) tile


def causal_tile_plan(n_q: int, n_k: int, block_m: int, block_n: int, band=None) -> list[list[int]]:
    """For causal attention (no attn_mask), what `flash_forward_kernel` does with each
    (query block, key block) tile: SKIPPED (its loop stops before the tile), FULL (computed
    on the unchecked path: the tile ends before the block's first query and inside Nk) or
    MASKED (computed with bounds and causal masks). Rows are query blocks, columns key
    blocks. The bounds are the kernel's own (`_key_range`, which tests/kernels/test_flash_triton.py
    runs against this): ``hi = min(n_k, (start_m + 1)·BLOCK_M)`` and ``clean_hi`` = the
    block's first query rounded down to a BLOCK_N multiple.

    With a window, ``band`` = (band_lo, band_hi) as the kernels take it (query i sees keys
    i + band_lo … i + band_hi; `flashlab.reference.naive.window_band` makes it from attention's
    ``window`` and ``is_causal``): a tile is visited iff some query of the block (inside Nq)
    sees some key of it, and FULL iff it lies inside Nk and every query of the block sees
    every key of it."""
    plan = []
    for start_m in range(0, n_q, block_m):
        hi = min(n_k, start_m + block_m)
        last = min(start_m + block_m, n_q) - 1
        row = []
        for start_n in range(0, n_k, block_n):
            if band is not None:
                band_lo, band_hi = band
                end = min(start_n + block_n, n_k) - 1
                seen = band_lo <= band_hi and start_n <= last + band_hi and end >= start_m + band_lo
                whole = (start_n + block_n <= n_k and start_n >= last + band_lo
                         and start_n + block_n - 1 <= start_m + band_hi)
                row.append(FULL if whole else MASKED if seen else SKIPPED)
            elif start_n >= hi:
                row.append(SKIPPED)
            elif start_n + block_n <= start_m and start_n + block_n <= n_k:
                row.append(FULL)
            else:
                row.append(MASKED)
        plan.append(row)
    return plan


@triton.jit
def _key_range(start_m, n_q, n_k, band_lo, band_hi, IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
               HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The key blocks query block ``start_m`` visits, in the forward and in the dQ pass:
    [lo, clean_lo) checked, [clean_lo, clean_hi) on the unchecked fast path, [clean_hi, hi)
    checked, the rest skipped. Without a window lo = clean_lo = 0.

    Causal: keys past the block's last query are skipped, hi = min(Nk, (start_m + 1)·BLOCK_M).
    Fast path: whole key blocks inside Nk and (causal) entirely at or below the diagonal,
    i.e. ending at or before the block's first query. With an attn_mask every tile is checked.

    Window (causality folded into the band by the launcher, IS_CAUSAL False): the block's
    queries first..last (inside Nq) see keys first + band_lo … last + band_hi, so lo is that
    first key's tile and hi one past the last key; an empty band visits nothing. The fast
    path is `clean_range`'s: tiles every query of the block sees whole."""
    if HAS_WINDOW:
        first = start_m * BLOCK_M
        last = tl.minimum(first + BLOCK_M, n_q) - 1
        key_first = tl.maximum(0, first + band_lo)
        key_end = tl.minimum(n_k, last + band_hi + 1)
        lo = (key_first // BLOCK_N) * BLOCK_N
        hi = tl.where((key_first < key_end) & (band_lo <= band_hi), key_end, lo)
        clean_lo, clean_hi = clean_range(lo, hi, first, last, 0, -band_lo, band_hi, n_k, BLOCK_N)
        if HAS_MASK:
            clean_lo = hi
            clean_hi = hi
    else:
        lo = 0
        hi = n_k
        if IS_CAUSAL:
            hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)
        clean_lo = 0
        clean_hi = 0
        if not HAS_MASK:
            clean_hi = (n_k // BLOCK_N) * BLOCK_N
            if IS_CAUSAL:
                clean_hi = tl.minimum(clean_hi, (start_m * BLOCK_M // BLOCK_N) * BLOCK_N)
    return lo, clean_lo, clean_hi, hi


@triton.jit
def _query_range(start_n, n_q, n_k, band_lo, band_hi, IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
                 HAS_WINDOW: tl.constexpr, FAST_PATH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The query blocks the dK/dV pass streams past key block ``start_n``: [lo, clean_lo)
    checked (the causal diagonal), [clean_lo, clean_hi) on the unchecked fast path, [clean_hi,
    hi) checked (the ragged end of Nq; a window's far edge). hi = Nq without a window. Without
    FAST_PATH, clean_lo = clean_hi = hi: one checked loop.

    Causal: earlier query blocks see none of these keys, lo = the block holding query start_n.
    Fast path: whole query blocks inside Nq whose first query is at or past this key block's
    last key (causal), with a whole key block and no attn_mask. (Branches only on constexprs;
    the runtime test goes through tl.where.)

    Window: key j is seen by queries j − band_hi … j − band_lo, so the block's keys start_n..last
    (inside Nk) by queries start_n − band_hi … last − band_lo: lo and hi as in `_key_range`, the
    roles of queries and keys swapped (and so `clean_range`'s band)."""
    if HAS_WINDOW:
        last_n = tl.minimum(start_n + BLOCK_N, n_k) - 1
        query_first = tl.maximum(0, start_n - band_hi)
        query_end = tl.minimum(n_q, last_n - band_lo + 1)
        lo = (query_first // BLOCK_M) * BLOCK_M
        hi = tl.where((query_first < query_end) & (band_lo <= band_hi), query_end, lo)
        clean_lo, clean_hi = clean_range(lo, hi, start_n, last_n, 0, band_hi, -band_lo, n_q, BLOCK_M)
        if HAS_MASK:
            clean_lo = hi
            clean_hi = hi
    else:
        lo = 0
        if IS_CAUSAL:
            lo = (start_n // BLOCK_M) * BLOCK_M
        hi = n_q
        full_end = (n_q // BLOCK_M) * BLOCK_M
        first_clean = lo
        if IS_CAUSAL:
            first_clean = tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M   # first query ≥ last key
        if HAS_MASK:
            first_clean = n_q
        clean_lo = tl.minimum(tl.where(start_n + BLOCK_N <= n_k, first_clean, n_q), full_end)
        if IS_CAUSAL:
            clean_lo = tl.maximum(clean_lo, lo)
        clean_hi = tl.maximum(clean_lo, full_end)
    if not FAST_PATH:
        clean_lo = hi
        clean_hi = hi
    return lo, clean_lo, clean_hi, hi


@triton.jit(do_not_specialize=["seed"])
def dropout_mask_kernel(KEEP, seed, n_q, n_k, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Writes Z for (B·H, Nq, Nk) as uint8, so tests can see the mask the kernels use."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    zh = tl.program_id(2)
    keep = dropout_keep(seed, zh, offs_m, cols, n_k, dropout_p)
    ok = (offs_m < n_q)[:, None] & (cols < n_k)[None, :]
    tl.store(KEEP + (zh.to(tl.int64) * n_q + offs_m[:, None]) * n_k + cols[None, :], keep.to(tl.uint8), mask=ok)


@triton.jit
def _load_whole_rows(ptrs, d_ok, EVEN_D: tl.constexpr):
    """A tile whose rows are all in bounds (the fast path): no mask at all when D is a power of
    two, else only the padded head dimensions masked."""
    if EVEN_D:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=d_ok[None, :], other=0.0)


@triton.jit
def _key_block(q, k_ptrs, v_ptrs, mask_ptrs, rows, cols, d_ok, n_q, n_k,
               qk_scale, softcap, band_lo, band_hi,
               CHECKED: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,
               MASK_IS_BOOL: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr,
               INPUT_PRECISION: tl.constexpr):
    """K_j, V_j and S = Q K_jᵀ (base 2) for the key block ``cols``, its tiles at ``k_ptrs``,
    ``v_ptrs`` and ``mask_ptrs``, as the forward and the dQ pass both stream them; and the capped
    scores before the mask (`tile.masked_scores`). CHECKED=False is the fast path for tiles known
    to need no masking at all (inside Nk, below the causal diagonal, no attn_mask): no bounds
    checks, no −inf fills."""
    if CHECKED:
        kv_ok = (cols < n_k)[:, None] & d_ok[None, :]
        k = tl.load(k_ptrs, mask=kv_ok, other=0.0)
        s, capped = masked_scores(q, k, mask_ptrs, rows, cols, n_q, n_k, qk_scale, softcap, band_lo, band_hi,
                                  IS_CAUSAL, HAS_WINDOW, HAS_MASK, MASK_IS_BOOL, SOFTCAP, INPUT_PRECISION)
        v = tl.load(v_ptrs, mask=kv_ok, other=0.0)
    else:
        k = _load_whole_rows(k_ptrs, d_ok, EVEN_D)
        v = _load_whole_rows(v_ptrs, d_ok, EVEN_D)
        s = scores(q, k, qk_scale, softcap, SOFTCAP, INPUT_PRECISION)
        capped = s
    return k, v, s, capped


@triton.jit
def _forward_tiles(acc, l_i, m_i, q,
                   k_ptrs, v_ptrs, mask_ptrs, stride_kn, stride_vn, stride_mn,
                   offs_m, d_ok, lo, hi, n_q, n_k,
                   qk_scale, softcap, band_lo, band_hi, seed, zh, dropout_p,
                   CHECKED: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,
                   MASK_IS_BOOL: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, EVEN_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Folds key blocks lo, lo + BLOCK_N, … < hi into the online-softmax state (acc, l, m);
    ``k_ptrs``, ``v_ptrs``, ``mask_ptrs`` are the tiles of key block 0, one key row apart
    by ``stride_kn``, ``stride_vn``, ``stride_mn``. CHECKED as in `_key_block`."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k, v, s, _ = _key_block(q, k_ptrs + start_n * stride_kn, v_ptrs + start_n * stride_vn,
                                mask_ptrs + start_n * stride_mn, offs_m, cols, d_ok, n_q, n_k,
                                qk_scale, softcap, band_lo, band_hi,
                                CHECKED, IS_CAUSAL, HAS_WINDOW, HAS_MASK, MASK_IS_BOOL, SOFTCAP, EVEN_D,
                                INPUT_PRECISION)
        keep = s                                         # (unused without dropout)
        if DROPOUT:
            keep = dropout_keep(seed, zh, offs_m, cols, n_k, dropout_p)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, keep, qk_scale,
                                            DROPOUT, False, CHECKED, INPUT_PRECISION)
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["seed"])
def flash_forward_kernel(
    Q, K, V, MASK, O, L,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
    stride_mz, stride_mh, stride_mm, stride_mn, stride_oz, stride_oh, stride_om,
    H, n_q, n_k, head_dim, GROUP,
    qk_scale, softcap, band_lo, band_hi, seed, dropout_p, l_fix_offset,
    IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr,
    MASK_ROW_SHARED: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    # A 1-D grid of cdiv(Nq, BLOCK_M)·B·H programs, query blocks varying fastest (programs of
    # one head run together and share its K/V in L2). CUDA caps grid dims 1 and 2 at 65535,
    # which B·H passes easily (8192 TSP instances × 8 heads); dim 0 allows 2³¹ − 1.
    num_m = tl.cdiv(n_q, BLOCK_M)
    start_m = tl.program_id(0) % num_m
    if IS_CAUSAL:  # each head's longest programs (last query blocks) first, meant to fill the last wave better
        start_m = num_m - 1 - start_m
    zh = tl.program_id(0) // num_m
    z, h = zh // H, zh % H
    kv_h = h // GROUP                                   # GQA: q heads h share k/v head h // GROUP
    # this program's (batch, head): every input's base pointer shifted once (the outputs' where
    # they are stored: a pointer shifted here would sit in registers through the whole loop)
    Q += z * stride_qz + h * stride_qh
    K += z * stride_kz + kv_h * stride_kh
    V += z * stride_vz + kv_h * stride_vh
    MASK += z * stride_mz + h * stride_mh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim                            # head dims that are not powers of two
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m < n_q)[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_ptrs = K + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :]
    mask_ptrs = mask_tile_ptrs(MASK, offs_m, offs_n, stride_mm, stride_mn, MASK_ROW_SHARED)

    lo, clean_lo, clean_hi, hi = _key_range(start_m, n_q, n_k, band_lo, band_hi, IS_CAUSAL, HAS_MASK, HAS_WINDOW,
                                            BLOCK_M, BLOCK_N)
    # three runs of key blocks: [lo, clean_lo) checked (a window's near edge; empty without one),
    # [clean_lo, clean_hi) on the unchecked fast path, [clean_hi, hi) checked (the diagonal, Nk's end)
    for part in tl.static_range(3):
        if part == 0:
            a, b = lo, clean_lo
        elif part == 1:
            a, b = clean_lo, clean_hi
        else:
            a, b = clean_hi, hi
        if part != 0 or HAS_WINDOW:
            acc, l_i, m_i = _forward_tiles(acc, l_i, m_i, q,
                                           k_ptrs, v_ptrs, mask_ptrs, stride_kn, stride_vn, stride_mn,
                                           offs_m, d_ok, a, b, n_q, n_k,
                                           qk_scale, softcap, band_lo, band_hi, seed, zh, dropout_p,
                                           part != 1, IS_CAUSAL, HAS_WINDOW, HAS_MASK, MASK_IS_BOOL, SOFTCAP, DROPOUT,
                                           EVEN_D, BLOCK_N, INPUT_PRECISION)

    o, lse, has_key = finish_rows(acc, l_i, m_i, dropout_p, DROPOUT, float("inf"))
    row_ok = offs_m < n_q
    O += z * stride_oz + h * stride_oh
    L += zh * n_q
    tl.store(O + offs_m[:, None] * stride_om + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(L + offs_m, lse, mask=row_ok)              # +inf for an empty row: the backward's 2^(S − L) = 0
    if HAS_MASK and not MASK_IS_BOOL:                   # c = 2^(L − m)/l, l_fix_offset after L: `tile.l_fix`
        tl.store(L + l_fix_offset + offs_m, l_fix(lse, m_i, l_i, has_key), mask=row_ok)


@triton.jit
def flash_backward_preprocess_kernel(O, DO, DELTA, stride_oz, stride_oh, stride_om, stride_doz, stride_doh,
                                     stride_dom, H, n_q, head_dim, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    num_m = tl.cdiv(n_q, BLOCK_M)                                 # 1-D grid, as the forward's
    start_m, zh = tl.program_id(0) % num_m, tl.program_id(0) // num_m
    z, h = zh // H, zh % H
    O += z * stride_oz + h * stride_oh
    DO += z * stride_doz + h * stride_doh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_m < n_q)[:, None] & (offs_d < head_dim)[None, :]
    o = tl.load(O + offs_m[:, None] * stride_om + offs_d[None, :], mask=ok, other=0.0)
    do = tl.load(DO + offs_m[:, None] * stride_dom + offs_d[None, :], mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)     # D_i = rowsum(dO ∘ O)
    tl.store(DELTA + zh * n_q + offs_m, delta, mask=offs_m < n_q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v,
                q_ptrs, do_ptrs, mask_ptrs, L, DELTA, stride_qm, stride_dom, stride_mm,
                cols, d_ok, lo, hi, n_q, n_k,
                qk_scale, softcap, band_lo, band_hi, seed, zh, dropout_p, l_fix_offset,
                CHECKED: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,
                MASK_IS_BOOL: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, EVEN_D: tl.constexpr,
                BLOCK_M: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Accumulates dK_j and dV_j (keys ``cols``) over query blocks lo, lo + BLOCK_M, … < hi of
    one q head: ``q_ptrs``, ``do_ptrs``, ``mask_ptrs`` are its tiles of query block 0, one
    query row apart by ``stride_qm``, ``stride_dom``, ``stride_mm``; L and DELTA its rows (and,
    with a float mask, each row's fix c `l_fix_offset` after L: `tile.l_fix`).

    CHECKED=False is the fast path for tiles that need no masking: whole query blocks
    (inside Nq), a whole key block (inside Nk), entirely on or below the causal diagonal,
    no attn_mask. Then no bounds checks and no −inf fills."""
    offs_mb = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_mb
        if CHECKED:
            q_ok = (offs_m < n_q)[:, None] & d_ok[None, :]
            q = tl.load(q_ptrs + start_m * stride_qm, mask=q_ok, other=0.0)
            s, capped = masked_scores(q, k, mask_ptrs + start_m * stride_mm, offs_m, cols, n_q, n_k,
                                      qk_scale, softcap, band_lo, band_hi,
                                      IS_CAUSAL, HAS_WINDOW, HAS_MASK, MASK_IS_BOOL, SOFTCAP, INPUT_PRECISION)
            lse = tl.load(L + offs_m, mask=offs_m < n_q, other=float("inf"))
            do = tl.load(do_ptrs + start_m * stride_dom, mask=q_ok, other=0.0)
            delta = tl.load(DELTA + offs_m, mask=offs_m < n_q, other=0.0)
        else:
            q = _load_whole_rows(q_ptrs + start_m * stride_qm, d_ok, EVEN_D)
            do = _load_whole_rows(do_ptrs + start_m * stride_dom, d_ok, EVEN_D)
            s = scores(q, k, qk_scale, softcap, SOFTCAP, INPUT_PRECISION)
            capped = s
            lse = tl.load(L + offs_m)
            delta = tl.load(DELTA + offs_m)
        p = tl.math.exp2(s - lse[:, None])                       # P = 2^(S − L), recomputed
        if HAS_MASK and not MASK_IS_BOOL:                        # exact where L lost log2 l: P·c (tile.l_fix)
            p = p * tl.load(L + l_fix_offset + offs_m, mask=offs_m < n_q, other=1.0)[:, None]
        keep = p                                         # (unused without dropout)
        if DROPOUT:
            keep = dropout_keep(seed, zh, offs_m, cols, n_k, dropout_p)
        dk, dv, _ = key_value_gradients(dk, dv, p, q, do, v, delta, capped, softcap, keep, dropout_p,
                                        DROPOUT, SOFTCAP, INPUT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["seed"])
def flash_backward_dkdv_kernel(
    Q, K, V, MASK, DO, L, DELTA, DK, DV,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
    stride_mz, stride_mh, stride_mm, stride_mn, stride_doz, stride_doh, stride_dom,
    stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn,
    H, n_q, n_k, head_dim, GROUP,
    qk_scale, sm_scale, softcap, band_lo, band_hi, seed, dropout_p, l_fix_offset,
    IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr,
    MASK_ROW_SHARED: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, FAST_PATH: tl.constexpr,
):
    num_n = tl.cdiv(n_k, BLOCK_N)                                 # 1-D grid, key blocks fastest
    start_n = (tl.program_id(0) % num_n) * BLOCK_N
    zkv = tl.program_id(0) // num_n
    h_kv = H // GROUP                                             # how many k/v heads (H q heads, GROUP per k/v head)
    z, kv_h = zkv // h_kv, zkv % h_kv                             # this program's batch entry and k/v head index
    first_h = kv_h * GROUP                                        # the first q head that uses this k/v head
    # this program's (batch, k/v head): K's and V's base pointers shifted once (dK's and dV's
    # where they are stored; Q's, dO's, the mask's, L's and D's where the query loop starts:
    # shifted here they would sit in registers beside K_j and V_j)
    K += z * stride_kz + kv_h * stride_kh
    V += z * stride_vz + kv_h * stride_vh

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_mb = tl.arange(0, BLOCK_M)
    d_ok = offs_d < head_dim
    kv_ok = (offs_n < n_k)[:, None] & d_ok[None, :]
    # K_j and V_j are loaded once and stay on chip for the whole pass
    k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    # the group's first q head; head g of the group is g·stride_qh (g·Nq for L and D) further
    Q += z * stride_qz + first_h * stride_qh
    DO += z * stride_doz + first_h * stride_doh
    MASK += z * stride_mz + first_h * stride_mh
    L += (z * H + first_h) * n_q
    DELTA += (z * H + first_h) * n_q
    lo, clean_lo, clean_hi, hi = _query_range(start_n, n_q, n_k, band_lo, band_hi, IS_CAUSAL, HAS_MASK, HAS_WINDOW,
                                              FAST_PATH, BLOCK_M, BLOCK_N)
    for g in range(0, GROUP):                                   # every q head that uses this k/v head
        q_ptrs = Q + g * stride_qh + offs_mb[:, None] * stride_qm + offs_d[None, :]
        do_ptrs = DO + g * stride_doh + offs_mb[:, None] * stride_dom + offs_d[None, :]
        mask_ptrs = mask_tile_ptrs(MASK + g * stride_mh, offs_mb, offs_n, stride_mm, stride_mn, MASK_ROW_SHARED)
        zh = z * H + first_h + g
        # the diagonal (all of [lo, hi) without FAST_PATH: one loop, less code and fewer registers,
        # see autotune.Config), then the unchecked middle, then the ragged end of Nq (a window's far edge)
        for part in tl.static_range(3):
            if part == 0:
                a, b = lo, clean_lo
            elif part == 1:
                a, b = clean_lo, clean_hi
            else:
                a, b = clean_hi, hi
            if part == 0 or FAST_PATH:
                dk, dv = _dkdv_tiles(dk, dv, k, v,
                                     q_ptrs, do_ptrs, mask_ptrs, L + g * n_q, DELTA + g * n_q,
                                     stride_qm, stride_dom, stride_mm,
                                     offs_n, d_ok, a, b, n_q, n_k,
                                     qk_scale, softcap, band_lo, band_hi, seed, zh, dropout_p, l_fix_offset,
                                     part != 1, IS_CAUSAL, HAS_WINDOW, HAS_MASK, MASK_IS_BOOL, SOFTCAP, DROPOUT,
                                     EVEN_D, BLOCK_M, INPUT_PRECISION)
    DK += z * stride_dkz + kv_h * stride_dkh
    DV += z * stride_dvz + kv_h * stride_dvh
    tl.store(DK + offs_n[:, None] * stride_dkn + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty),
             mask=kv_ok)
    tl.store(DV + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta,
              k_ptrs, v_ptrs, mask_ptrs, stride_kn, stride_vn, stride_mn,
              offs_m, d_ok, lo, hi, n_q, n_k,
              qk_scale, softcap, band_lo, band_hi, seed, zh, dropout_p,
              CHECKED: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,
              MASK_IS_BOOL: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, EVEN_D: tl.constexpr,
              BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Accumulates dQ_i over key blocks lo, lo + BLOCK_N, … < hi, the key tiles as in
    `_forward_tiles`; CHECKED=False as in the forward: whole key blocks below the causal
    diagonal, no attn_mask. (Rows past Nq need no mask there: their L is +inf, so
    P = 2^(S − L) = 0.)"""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k, v, s, capped = _key_block(q, k_ptrs + start_n * stride_kn, v_ptrs + start_n * stride_vn,
                                     mask_ptrs + start_n * stride_mn, offs_m, cols, d_ok, n_q, n_k,
                                     qk_scale, softcap, band_lo, band_hi,
                                     CHECKED, IS_CAUSAL, HAS_WINDOW, HAS_MASK, MASK_IS_BOOL, SOFTCAP, EVEN_D,
                                     INPUT_PRECISION)
        p = tl.math.exp2(s - lse[:, None])
        dp = dot(do, tl.trans(v), INPUT_PRECISION)
        if DROPOUT:
            keep = dropout_keep(seed, zh, offs_m, cols, n_k, dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * soft_cap_grad(capped, softcap)
        dq = dot_acc(ds.to(k.dtype), k, dq, INPUT_PRECISION)           # dQ += dS K
    return dq


@triton.jit(do_not_specialize=["seed"])
def flash_backward_dq_kernel(
    Q, K, V, MASK, DO, L, DELTA, DQ,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
    stride_mz, stride_mh, stride_mm, stride_mn, stride_doz, stride_doh, stride_dom, stride_dqz, stride_dqh, stride_dqm,
    H, n_q, n_k, head_dim, GROUP,
    qk_scale, sm_scale, softcap, band_lo, band_hi, seed, dropout_p, l_fix_offset,
    IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr,
    MASK_ROW_SHARED: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    num_m = tl.cdiv(n_q, BLOCK_M)                                 # 1-D grid, query blocks fastest
    start_m, zh = tl.program_id(0) % num_m, tl.program_id(0) // num_m
    z, h = zh // H, zh % H
    kv_h = h // GROUP
    # this program's (batch, head): every input's base pointer shifted once (dQ's where it is stored)
    Q += z * stride_qz + h * stride_qh
    K += z * stride_kz + kv_h * stride_kh
    V += z * stride_vz + kv_h * stride_vh
    MASK += z * stride_mz + h * stride_mh
    DO += z * stride_doz + h * stride_doh
    L += zh * n_q
    DELTA += zh * n_q

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q_ok = (offs_m < n_q)[:, None] & d_ok[None, :]
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_ok, other=0.0)
    do = tl.load(DO + offs_m[:, None] * stride_dom + offs_d[None, :], mask=q_ok, other=0.0)
    lse = tl.load(L + offs_m, mask=offs_m < n_q, other=float("inf"))
    delta = tl.load(DELTA + offs_m, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_ptrs = K + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :]
    mask_ptrs = mask_tile_ptrs(MASK, offs_m, offs_n, stride_mm, stride_mn, MASK_ROW_SHARED)

    lo, clean_lo, clean_hi, hi = _key_range(start_m, n_q, n_k, band_lo, band_hi, IS_CAUSAL, HAS_MASK, HAS_WINDOW,
                                            BLOCK_M, BLOCK_N)                      # the forward's split
    for part in tl.static_range(3):                     # the forward's three runs of key blocks
        if part == 0:
            a, b = lo, clean_lo
        elif part == 1:
            a, b = clean_lo, clean_hi
        else:
            a, b = clean_hi, hi
        if part != 0 or HAS_WINDOW:
            dq = _dq_tiles(dq, q, do, lse, delta,
                           k_ptrs, v_ptrs, mask_ptrs, stride_kn, stride_vn, stride_mn,
                           offs_m, d_ok, a, b, n_q, n_k,
                           qk_scale, softcap, band_lo, band_hi, seed, zh, dropout_p,
                           part != 1, IS_CAUSAL, HAS_WINDOW, HAS_MASK, MASK_IS_BOOL, SOFTCAP, DROPOUT,
                           EVEN_D, BLOCK_N, INPUT_PRECISION)
    if HAS_MASK and not MASK_IS_BOOL:          # dQ is linear in each row's P: its fix c (tile.l_fix) at the end
        dq = dq * tl.load(L + l_fix_offset + offs_m, mask=offs_m < n_q, other=1.0)[:, None]
    DQ += z * stride_dqz + h * stride_dqh
    tl.store(DQ + offs_m[:, None] * stride_dqm + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty), mask=q_ok)
