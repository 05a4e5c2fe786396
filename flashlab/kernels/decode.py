"""Decoding attention in Triton: a few new queries against a long KV cache, split over the keys.

At decode time each sequence brings seqlen_q (often 1) new query rows per head, and the cache
holds seqlen_cache keys. One program per (batch, head) would leave most of the GPU idle and
stream the whole cache through a handful of SMs, so the keys are cut into ``num_splits``
ranges, each handled by its own program (split-KV, "flash-decoding"):

    split kernel   one program per (query-row block, batch·kv head, split s):
                   Q_g = the query rows of every q head of the kv head's group, stacked into
                   one (seqlen_q·GROUP, D) tile, so each K/V block is read ONCE for the group;
                   for each key block j of split s (paged: rows gathered through the block
                   table):  S = Q_g K_jᵀ·scale·log2 e,  online softmax (m, l, acc) as in
                   notebook 05;  writes O_s = acc / l and L_s = m + log2 l  (base 2)
    merge kernel   one program per block of output rows: the states (L_s, O_s) of the splits
                   combine with notebook 03's merge (flashlab.reference.online_softmax.merge): a part
                   with normalised output O_s and log-sum-exp L_s is the state (m, l) = (L_s, 1):
                       m = max_s L_s,   w_s = 2^(L_s − m),   O = Σ_s w_s O_s / Σ_s w_s,
                       L = m + log2 Σ_s w_s
With one split the split kernel writes the final output itself and no merge runs.

Causal alignment is to the END of the cache (FlashAttention's convention): query i of
seqlen_q is the token at position seqlen − seqlen_q + i and sees keys j ≤ seqlen − seqlen_q + i,
a band of `flashlab.kernels.tile.visible`; a sliding window (left, right) is the band
seqlen − seqlen_q + i − left ≤ j ≤ seqlen − seqlen_q + i + right, and key tiles outside it are
skipped. Scores, soft-capping and the softmax update are the tile rules every kernel shares.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tile import finish_rows, masked_scores, merge_step, online_softmax_step


@triton.jit
def _cache_rows(CACHE, BLOCK_TABLE, z, kv_h, start_n, cols, col_ok, offs_d, sb, sn, sh, sd, sbtz, sbtp, page_size,
                num_blocks, PAGED: tl.constexpr, PAGE_ALIGNED: tl.constexpr, IN_BOUNDS: tl.constexpr):
    """Pointers to the cache rows ``cols`` of sequence z, head kv_h: (BLOCK_N, BLOCK_D), and which of
    the rows exist: (BLOCK_N,) booleans.

    Contiguous cache (batch, seqlen_cache, heads_k, D): row j of sequence z is at z·sb + j·sn.
    Paged cache (num_blocks, page_size, heads_k, D): row j lives in page j // page_size of the
    sequence, whose physical block is block_table[z, j // page_size], at offset j % page_size.
    When pages are a whole number of key tiles (PAGE_ALIGNED), the tile lies in one page: one
    block-table entry per tile instead of one per row, and the rows are consecutive as in a
    contiguous cache. A block-table entry outside 0..num_blocks − 1 names no page of this cache: its
    rows do not exist (masked, never read), so no table can make the kernel read outside the cache."""
    if PAGE_ALIGNED:
        # one entry for the tile, broadcast over its rows (a scalar's bounds test anded with the rows' mask
        # gives a mask of the wrong type in Triton's interpreter)
        block = tl.zeros_like(cols) + tl.load(BLOCK_TABLE + z * sbtz + (start_n // page_size) * sbtp)
        ok = col_ok
        if IN_BOUNDS:
            ok = ok & (block >= 0) & (block < num_blocks)
            block = tl.where(ok, block, 0)
        row = block.to(tl.int64) * sb + (start_n % page_size + (cols - start_n)) * sn
    elif PAGED:
        block = tl.load(BLOCK_TABLE + z * sbtz + (cols // page_size) * sbtp, mask=col_ok, other=0)
        ok = col_ok
        if IN_BOUNDS:
            ok = ok & (block >= 0) & (block < num_blocks)
            block = tl.where(ok, block, 0)
        row = block.to(tl.int64) * sb + (cols % page_size) * sn
    else:
        ok = col_ok
        row = z.to(tl.int64) * sb + cols * sn
    return CACHE + row[:, None] + kv_h * sh + offs_d[None, :] * sd, ok


@triton.jit
def _split_keys(SEQLENS, z, capacity, split, num_splits, row_block, n_q, GROUP, left, right,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BAND: tl.constexpr, IN_BOUNDS: tl.constexpr):
    """(seqlen, lo, hi): sequence z's cache length and the key range [lo, hi) this split's program reads.

    A length outside 0..capacity (the keys the cache or its block table can hold) is clamped into it
    (IN_BOUNDS: always, but in the decode-table suite's measurement of its cost, on valid inputs): no
    cache_seqlens can make the kernel read past the cache. The keys are dealt out in whole BLOCK_N
    tiles, ceil(tiles / splits) to a split; with causality or a window, the tiles outside the band
    of the row block's queries (positions seqlen − Sq + i) are skipped."""
    seqlen = tl.load(SEQLENS + z)
    if IN_BOUNDS:
        seqlen = tl.minimum(tl.maximum(seqlen, 0), capacity)
    tiles_per_split = tl.cdiv(tl.cdiv(seqlen, BLOCK_N), num_splits)
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.minimum(seqlen, lo + tiles_per_split * BLOCK_N)
    if HAS_BAND:
        first_q = (row_block * BLOCK_M) // GROUP
        last_q = tl.minimum((row_block * BLOCK_M + BLOCK_M - 1) // GROUP, n_q - 1)
        lo = tl.maximum(lo, tl.maximum(seqlen - n_q + first_q - left, 0) // BLOCK_N * BLOCK_N)
        hi = tl.minimum(hi, seqlen - n_q + last_q + right + 1)
    return seqlen, lo, hi


@triton.jit
def decode_split_kernel(
    Q, K, V, SEQLENS, BLOCK_TABLE, O, LSE, O_PART, LSE_PART,
    sqz, sqm, sqh, sqd, skb, skn, skh, skd, svb, svn, svh, svd, sbtz, sbtp,
    soz, som, soh, sod,
    H_KV, n_q, head_dim, GROUP, num_splits, page_size, capacity, num_blocks,
    qk_scale, softcap, left, right,
    PAGED: tl.constexpr, PAGE_ALIGNED: tl.constexpr, HAS_BAND: tl.constexpr, SOFTCAP: tl.constexpr,
    WRITE_FINAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    IN_BOUNDS: tl.constexpr = True,
):
    # IN_BOUNDS: lengths clamped and block indexes masked to the cache (`_split_keys`, `_cache_rows`)
    # 1-D grid: splits fastest, then row blocks, then batch·kv head
    rows_total = n_q * GROUP
    num_row_blocks = tl.cdiv(rows_total, BLOCK_M)
    split = tl.program_id(0) % num_splits
    rest = tl.program_id(0) // num_splits
    row_block = rest % num_row_blocks
    zh = rest // num_row_blocks
    z, kv_h = zh // H_KV, zh % H_KV
    H = H_KV * GROUP

    # stacked rows r = i·GROUP + g: query position i, q head kv_h·GROUP + g
    offs_r = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_r < rows_total
    qi = offs_r // GROUP
    h = kv_h * GROUP + offs_r % GROUP
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q = tl.load(Q + z.to(tl.int64) * sqz + qi[:, None] * sqm + h[:, None] * sqh + offs_d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    seqlen, lo, hi = _split_keys(SEQLENS, z, capacity, split, num_splits, row_block, n_q, GROUP, left, right,
                                 BLOCK_M, BLOCK_N, HAS_BAND, IN_BOUNDS)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < hi
        k_ptrs, key_ok = _cache_rows(K, BLOCK_TABLE, z, kv_h, start_n, cols, col_ok, offs_d, skb, skn, skh, skd,
                                     sbtz, sbtp, page_size, num_blocks, PAGED, PAGE_ALIGNED, IN_BOUNDS)
        v_ptrs, _ = _cache_rows(V, BLOCK_TABLE, z, kv_h, start_n, cols, col_ok, offs_d, svb, svn, svh, svd,
                                sbtz, sbtp, page_size, num_blocks, PAGED, PAGE_ALIGNED, IN_BOUNDS)
        kv_ok = key_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptrs, mask=kv_ok, other=0.0)
        v = tl.load(v_ptrs, mask=kv_ok, other=0.0)
        key_cols = cols
        if IN_BOUNDS and PAGED:
            key_cols = tl.where(key_ok, cols, hi)         # rows of missing pages: moved past hi, so hidden
        # S = Q Kᵀ·scale·log2 e, −inf past this split's keys (and missing pages), and outside the band
        # seqlen − Sq − left ≤ key − query ≤ seqlen − Sq + right (causal: right = 0), queries being the
        # rows' positions qi
        s, _ = masked_scores(q, k, q, qi, key_cols, n_q, hi, qk_scale, softcap,
                             seqlen - n_q - left, seqlen - n_q + right,
                             False, HAS_BAND, False, False, SOFTCAP, INPUT_PRECISION)      # (q: no mask tensor)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, s, qk_scale, False, False, True, INPUT_PRECISION)

    # a row with no key: O = 0, L = −inf (no weight in the merge)
    o, lse, _ = finish_rows(acc, l_i, m_i, 0.0, False, -float("inf"))
    flat = (z * n_q + qi) * H + h                                 # row of the (B, Sq, H) output
    if WRITE_FINAL:
        tl.store(O + z.to(tl.int64) * soz + qi[:, None] * som + h[:, None] * soh + offs_d[None, :] * sod,
                 o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        tl.store(LSE + flat, lse, mask=row_ok)
    else:                                                         # partials: (B·Sq·H, splits, D) fp32
        part = flat.to(tl.int64) * num_splits + split
        tl.store(O_PART + part[:, None] * head_dim + offs_d[None, :], o, mask=row_ok[:, None] & d_ok[None, :])
        tl.store(LSE_PART + part, lse, mask=row_ok)


@triton.jit
def decode_merge_kernel(O_PART, LSE_PART, O, LSE, soz, som, soh, sod, n_rows, n_q, H, head_dim, num_splits,
                        BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merges the splits of BLOCK_R output rows (flattened (batch, query, head)) with the
    online-softmax merge, one split at a time (flashlab.reference.online_softmax.merge, in base 2)."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_r < n_rows
    ok = row_ok[:, None] & (offs_d < head_dim)[None, :]
    m = tl.full([BLOCK_R], -float("inf"), tl.float32)
    l = tl.zeros([BLOCK_R], tl.float32)  # noqa: E741 - the paper's name
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for s in range(0, num_splits):
        part = offs_r.to(tl.int64) * num_splits + s
        lse_s = tl.load(LSE_PART + part, mask=row_ok, other=-float("inf"))
        o_s = tl.load(O_PART + part[:, None] * head_dim + offs_d[None, :], mask=ok, other=0.0)
        acc, l, m = merge_step(acc, l, m, o_s, lse_s)  # noqa: E741
    o, lse, _ = finish_rows(acc, l, m, 0.0, False, -float("inf"))
    h = offs_r % H
    qi = (offs_r // H) % n_q
    z = offs_r // (H * n_q)
    tl.store(O + z.to(tl.int64)[:, None] * soz + qi[:, None] * som + h[:, None] * soh + offs_d[None, :] * sod,
             o.to(O.dtype.element_ty), mask=ok)
    tl.store(LSE + offs_r, lse, mask=row_ok)
