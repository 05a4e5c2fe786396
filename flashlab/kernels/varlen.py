"""Variable-length (packed) attention in Triton, with sliding windows by tile skipping.

The batch is packed: the tokens of all sequences one after the other, (total_tokens, heads, D),
and ``cu_seqlens`` (int32, batch + 1) holds where each sequence starts: sequence b is rows
cu_seqlens[b] .. cu_seqlens[b+1] − 1. No padding is stored or computed.

The kernels are notebook 05/06's, with two changes:
- a program's (query block, sequence, head) finds its rows through cu_seqlens, and a query
  block past the end of its sequence returns at once (the grid is sized by max_seqlen);
- which keys a query sees is a band: with shift = Lk − Lq (the diagonal aligned to the end,
  FlashAttention's convention), query i sees key j iff
        −left ≤ j − (i + shift) ≤ right
  (causal: right = 0; no window: left = right = "unbounded", passed as a number larger than any
  sequence). The key-block loop runs only over the blocks the band touches:
        lo = ⌊max(0, first_i + shift − left) / BLOCK_N⌋·BLOCK_N,  hi = min(Lk, last_i + shift + right + 1)
  so the work grows with the window, not with Lk. The backward's dK/dV pass inverts the band
  (key j is seen by queries j − shift − right ≤ i ≤ j − shift + left) to bound its query loop.

Inside [lo, hi) the tiles wholly inside the band (and inside the sequence) run on an unmasked
fast path (`tile.clean_range`), as in notebook 05; only the tiles the band's edges cross are masked.
The log-sum-exp L (base 2, +inf for a query with no key) is stored as (heads, total_q). Scores,
soft-capping, the band and the softmax update are `flashlab.kernels.tile`'s, as every kernel's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tile import (
    clean_range,
    dot,
    dot_acc,
    finish_rows,
    key_value_gradients,
    masked_scores,
    online_softmax_step,
    scores,
    soft_cap_grad,
)


@triton.jit
def _band_scores(q, k, offs_m, cols, q_len, k_len, shift, left, right, qk_scale, softcap,
                 CHECKED: tl.constexpr, SOFTCAP: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """A tile's scores (base 2, soft-capped) and the capped scores before masking: with CHECKED,
    −inf outside the sequence and outside the band −left ≤ j − (i + shift) ≤ right."""
    if CHECKED:
        return masked_scores(q, k, q, offs_m, cols, q_len, k_len, qk_scale, softcap, shift - left, shift + right,
                             False, True, False, False, SOFTCAP, INPUT_PRECISION)     # (q: no mask tensor)
    s = scores(q, k, qk_scale, softcap, SOFTCAP, INPUT_PRECISION)
    return s, s


@triton.jit
def _forward_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, d_ok, lo, hi, q_len, k_len,
                   shift, left, right, qk_scale, softcap, skt, svt,
                   CHECKED: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Folds key tiles lo, lo + BLOCK_N, … < hi into the online-softmax state (acc, l, m);
    CHECKED=False: tiles known to lie wholly inside the band and the sequence (no mask)."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if CHECKED:
            kv_ok = (cols < k_len)[:, None] & d_ok[None, :]
        else:
            kv_ok = d_ok[None, :]
        k = tl.load(k_ptrs + start_n * skt, mask=kv_ok, other=0.0)
        v = tl.load(v_ptrs + start_n * svt, mask=kv_ok, other=0.0)
        s, _ = _band_scores(q, k, offs_m, cols, q_len, k_len, shift, left, right, qk_scale, softcap,
                            CHECKED, SOFTCAP, INPUT_PRECISION)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, s, qk_scale, False, False, CHECKED, INPUT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _sequence(CU, b, total):
    """(start, length) of sequence b: rows cu[b] .. cu[b+1] − 1, clamped into the packed tensor's
    0..total rows, so that no cu_seqlens (a traced call does not check them) makes a kernel read or
    write outside the tensors it was given."""
    start = tl.minimum(tl.maximum(tl.load(CU + b), 0), total)
    end = tl.minimum(tl.maximum(tl.load(CU + b + 1), start), total)
    return start.to(tl.int64), end - start


@triton.jit
def varlen_forward_kernel(
    Q, K, V, CU_Q, CU_K, O, L,
    sqt, sqh, sqd, skt, skh, skd, svt, svh, svd, sot, soh, sod, slh,
    H, GROUP, head_dim, num_m, total_q, total_k,
    qk_scale, softcap, left, right,
    SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    start_m = tl.program_id(0) % num_m          # 1-D grid: query blocks fastest, then sequence·head
    bh = tl.program_id(0) // num_m
    b, h = bh // H, bh % H
    kv_h = h // GROUP
    q_start, q_len = _sequence(CU_Q, b, total_q)
    k_start, k_len = _sequence(CU_K, b, total_k)
    if start_m * BLOCK_M >= q_len:              # past the end of this (shorter) sequence
        return
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    row_ok = offs_m < q_len
    q = tl.load(Q + (q_start + offs_m)[:, None] * sqt + h * sqh + offs_d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    shift = k_len - q_len
    last_m = tl.minimum(start_m * BLOCK_M + BLOCK_M, q_len) - 1
    lo = tl.maximum(0, start_m * BLOCK_M + shift - left)
    lo = (lo // BLOCK_N) * BLOCK_N                                 # first key tile the band touches
    hi = tl.minimum(k_len, last_m + shift + right + 1)             # past the last key it touches

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_ptrs = K + (k_start + offs_n)[:, None] * skt + kv_h * skh + offs_d[None, :] * skd
    v_ptrs = V + (k_start + offs_n)[:, None] * svt + kv_h * svh + offs_d[None, :] * svd
    a, b_end = clean_range(lo, hi, start_m * BLOCK_M, last_m, shift, left, right, k_len, BLOCK_N)
    for part in tl.static_range(3):             # the band's near edge, its inside, its far edge
        if part == 0:
            first, last = lo, a
        elif part == 1:
            first, last = a, b_end
        else:
            first, last = b_end, hi
        acc, l_i, m_i = _forward_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, d_ok, first, last,
                                       q_len, k_len, shift, left, right, qk_scale, softcap, skt, svt,
                                       part != 1, SOFTCAP, BLOCK_N, INPUT_PRECISION)

    o, lse, _ = finish_rows(acc, l_i, m_i, 0.0, False, float("inf"))
    tl.store(O + (q_start + offs_m)[:, None] * sot + h * soh + offs_d[None, :] * sod,
             o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(L + h * slh + q_start + offs_m, lse, mask=row_ok)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, l_ptrs, delta_ptrs, offs_mb, offs_n, d_ok, lo, hi, q_len, k_len,
                shift, left, right, qk_scale, softcap, sqt, sdt,
                CHECKED: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Accumulates dK_j, dV_j over query blocks lo, lo + BLOCK_M, … < hi of one q head; CHECKED=False:
    whole query blocks inside the sequence, every (query, key) pair inside the band (no mask)."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_mb
        if CHECKED:
            row_ok = offs_m < q_len
            q_ok = row_ok[:, None] & d_ok[None, :]
            q = tl.load(q_ptrs + start_m * sqt, mask=q_ok, other=0.0)
            do = tl.load(do_ptrs + start_m * sdt, mask=q_ok, other=0.0)
            lse = tl.load(l_ptrs + start_m, mask=row_ok, other=float("inf"))
            delta = tl.load(delta_ptrs + start_m, mask=row_ok, other=0.0)
        else:
            q = tl.load(q_ptrs + start_m * sqt, mask=d_ok[None, :], other=0.0)
            do = tl.load(do_ptrs + start_m * sdt, mask=d_ok[None, :], other=0.0)
            lse = tl.load(l_ptrs + start_m)
            delta = tl.load(delta_ptrs + start_m)
        s, capped = _band_scores(q, k, offs_m, offs_n, q_len, k_len, shift, left, right, qk_scale, softcap,
                                 CHECKED, SOFTCAP, INPUT_PRECISION)
        p = tl.math.exp2(s - lse[:, None])                                         # P = 2^(S − L)
        dk, dv, _ = key_value_gradients(dk, dv, p, q, do, v, delta, capped, softcap, p, 0.0,
                                        False, SOFTCAP, INPUT_PRECISION)           # varlen has no dropout
    return dk, dv


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, k_ptrs, v_ptrs, offs_m, offs_n, d_ok, lo, hi, q_len, k_len, shift, left, right,
              qk_scale, softcap, skt, svt,
              CHECKED: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Accumulates dQ_i over key tiles lo, lo + BLOCK_N, … < hi; CHECKED as in `_forward_tiles`.
    (Query rows past the sequence need no mask: their L is +inf, so P = 2^(S − L) = 0.)"""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if CHECKED:
            kv_ok = (cols < k_len)[:, None] & d_ok[None, :]
        else:
            kv_ok = d_ok[None, :]
        k = tl.load(k_ptrs + start_n * skt, mask=kv_ok, other=0.0)
        v = tl.load(v_ptrs + start_n * svt, mask=kv_ok, other=0.0)
        s, capped = _band_scores(q, k, offs_m, cols, q_len, k_len, shift, left, right, qk_scale, softcap,
                                 CHECKED, SOFTCAP, INPUT_PRECISION)
        p = tl.math.exp2(s - lse[:, None])
        dp = dot(do, tl.trans(v), INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * soft_cap_grad(capped, softcap)
        dq = dot_acc(ds.to(k.dtype), k, dq, INPUT_PRECISION)         # dQ += dS K
    return dq


@triton.jit
def varlen_backward_dkdv_kernel(
    Q, K, V, DO, L, DELTA, CU_Q, CU_K, DK, DV,
    sqt, sqh, sqd, skt, skh, skd, svt, svh, svd, sdt, sdh, sdd, slh,
    sdkt, sdkh, sdkd, sdvt, sdvh, sdvd,
    H_KV, GROUP, head_dim, num_n, total_q, total_k,
    qk_scale, sm_scale, softcap, left, right,
    SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    start_n = (tl.program_id(0) % num_n) * BLOCK_N    # 1-D grid: key blocks fastest
    bh = tl.program_id(0) // num_n
    b, kv_h = bh // H_KV, bh % H_KV
    q_start, q_len = _sequence(CU_Q, b, total_q)
    k_start, k_len = _sequence(CU_K, b, total_k)
    if start_n >= k_len:
        return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_mb = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    kv_ok = (offs_n < k_len)[:, None] & d_ok[None, :]
    k = tl.load(K + (k_start + offs_n)[:, None] * skt + kv_h * skh + offs_d[None, :] * skd, mask=kv_ok, other=0.0)
    v = tl.load(V + (k_start + offs_n)[:, None] * svt + kv_h * svh + offs_d[None, :] * svd, mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    shift = k_len - q_len
    last_n = tl.minimum(start_n + BLOCK_N, k_len) - 1
    # queries whose band reaches this key block: start_n − shift − right ≤ i ≤ last_n − shift + left
    lo = tl.maximum(0, start_n - shift - right)
    lo = (lo // BLOCK_M) * BLOCK_M
    hi = tl.minimum(q_len, last_n - shift + left + 1)
    a, b_end = clean_range(lo, hi, start_n, last_n, -shift, right, left, q_len, BLOCK_M)   # roles swapped
    for g in range(0, GROUP):                                   # every q head that reads this kv head
        h = kv_h * GROUP + g
        q_ptrs = Q + (q_start + offs_mb)[:, None] * sqt + h * sqh + offs_d[None, :] * sqd
        do_ptrs = DO + (q_start + offs_mb)[:, None] * sdt + h * sdh + offs_d[None, :] * sdd
        l_ptrs = L + h * slh + q_start + offs_mb
        delta_ptrs = DELTA + h * slh + q_start + offs_mb
        for part in tl.static_range(3):                         # the band's edges checked, its inside not
            if part == 0:
                first, last = lo, a
            elif part == 1:
                first, last = a, b_end
            else:
                first, last = b_end, hi
            dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptrs, do_ptrs, l_ptrs, delta_ptrs, offs_mb, offs_n, d_ok, first, last,
                                 q_len, k_len, shift, left, right, qk_scale, softcap, sqt, sdt,
                                 part != 1, SOFTCAP, BLOCK_M, INPUT_PRECISION)
    tl.store(DK + (k_start + offs_n)[:, None] * sdkt + kv_h * sdkh + offs_d[None, :] * sdkd,
             (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + (k_start + offs_n)[:, None] * sdvt + kv_h * sdvh + offs_d[None, :] * sdvd,
             dv.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def varlen_backward_dq_kernel(
    Q, K, V, DO, L, DELTA, CU_Q, CU_K, DQ,
    sqt, sqh, sqd, skt, skh, skd, svt, svh, svd, sdt, sdh, sdd, slh, sdqt, sdqh, sdqd,
    H, GROUP, head_dim, num_m, total_q, total_k,
    qk_scale, sm_scale, softcap, left, right,
    SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    start_m = tl.program_id(0) % num_m
    bh = tl.program_id(0) // num_m
    b, h = bh // H, bh % H
    kv_h = h // GROUP
    q_start, q_len = _sequence(CU_Q, b, total_q)
    k_start, k_len = _sequence(CU_K, b, total_k)
    if start_m * BLOCK_M >= q_len:
        return
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    row_ok = offs_m < q_len
    q_ok = row_ok[:, None] & d_ok[None, :]
    rows = (q_start + offs_m)[:, None]
    q = tl.load(Q + rows * sqt + h * sqh + offs_d[None, :] * sqd, mask=q_ok, other=0.0)
    do = tl.load(DO + rows * sdt + h * sdh + offs_d[None, :] * sdd, mask=q_ok, other=0.0)
    lse = tl.load(L + h * slh + q_start + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + h * slh + q_start + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    shift = k_len - q_len
    last_m = tl.minimum(start_m * BLOCK_M + BLOCK_M, q_len) - 1
    lo = tl.maximum(0, start_m * BLOCK_M + shift - left)          # the forward's band, see there
    lo = (lo // BLOCK_N) * BLOCK_N
    hi = tl.minimum(k_len, last_m + shift + right + 1)
    k_ptrs = K + (k_start + offs_n)[:, None] * skt + kv_h * skh + offs_d[None, :] * skd
    v_ptrs = V + (k_start + offs_n)[:, None] * svt + kv_h * svh + offs_d[None, :] * svd
    a, b_end = clean_range(lo, hi, start_m * BLOCK_M, last_m, shift, left, right, k_len, BLOCK_N)
    for part in tl.static_range(3):
        if part == 0:
            first, last = lo, a
        elif part == 1:
            first, last = a, b_end
        else:
            first, last = b_end, hi
        dq = _dq_tiles(dq, q, do, lse, delta, k_ptrs, v_ptrs, offs_m, offs_n, d_ok, first, last, q_len, k_len,
                       shift, left, right, qk_scale, softcap, skt, svt, part != 1, SOFTCAP, BLOCK_N, INPUT_PRECISION)
    tl.store(DQ + rows * sdqt + h * sdqh + offs_d[None, :] * sdqd, (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=q_ok)
