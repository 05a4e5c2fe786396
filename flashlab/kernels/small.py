"""Attention kernels for short sequences: every key of a head fits in one tile.

When all Nk keys fit in one BLOCK_N tile, a program that holds them sees every (query, key)
pair of its head, and the backward needs no second pass:

Forward, one program per (block of BLOCK_M queries, HEADS heads): for each head
    S = Q Kᵀ · scale·log2(e)          (one tile: every key at once, no online rescaling)
    m = rowmax S;  P̃ = 2^(S − m);  l = rowsum P̃;  O = P̃ V / l;  L = m + log2 l

Backward, one program per (HEADS k/v heads; with GQA each brings its GROUP q heads): K, V,
dK, dV stay on chip while the program's query blocks stream past:
    D_i = rowsum(dO_i ∘ O_i)                       (in the kernel: no preprocess launch)
    P = 2^(S − L),  dV += Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D)
    dK += dSᵀ Q,  dQ_i = dS K · scale              (complete: this program saw every key)
One launch, every output tile written by exactly one program: no atomics, deterministic.

O and L are the dense forward's (same layout, L in base 2), so either backward can follow
either forward. Scores, soft-capping, masks, dropout and the softmax update are
`flashlab.kernels.tile`'s, as the dense kernels': the same masking and the same Philox mask for
the same seed. When this path is taken, and how it is
launched: `flashlab.launch.small`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tile import (
    dot,
    dropout_keep,
    finish_rows,
    key_value_gradients,
    l_fix,
    mask_tile_ptrs,
    masked_scores,
    online_softmax_step,
)


@triton.jit(do_not_specialize=["seed"])
def small_forward_kernel(
    Q, K, V, MASK, O, L,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
    stride_mz, stride_mh, stride_mm, stride_mn, stride_oz, stride_oh, stride_om,
    H, n_zh, n_q, n_k, head_dim, GROUP,
    qk_scale, softcap, seed, dropout_p, l_fix_offset,
    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr, MASK_ROW_SHARED: tl.constexpr,
    SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    # 1-D grid: cdiv(Nq, BLOCK_M) · cdiv(B·H, HEADS) programs, query blocks fastest
    num_m = tl.cdiv(n_q, BLOCK_M)
    start_m = tl.program_id(0) % num_m
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)                      # every key: BLOCK_N ≥ Nk
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    for i in range(HEADS):
        zh = (tl.program_id(0) // num_m) * HEADS + i
        # the last program's heads past B·H see Nq = Nk = 0: every load and store masked off
        rows = tl.where(zh < n_zh, n_q, 0)
        keys = tl.where(zh < n_zh, n_k, 0)
        z, h = zh // H, zh % H
        kv_h = h // GROUP                               # GQA: q heads h share k/v head h // GROUP
        row_ok = offs_m < rows
        kv_ok = (offs_n < keys)[:, None] & d_ok[None, :]
        q = tl.load(Q + z * stride_qz + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        k = tl.load(K + z * stride_kz + kv_h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                    mask=kv_ok, other=0.0)
        v = tl.load(V + z * stride_vz + kv_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                    mask=kv_ok, other=0.0)
        mask_ptrs = mask_tile_ptrs(MASK + z * stride_mz + h * stride_mh, offs_m, offs_n, stride_mm, stride_mn,
                                   MASK_ROW_SHARED)             # key padding: one row for every query
        # S = Q Kᵀ·scale·log2(e), soft-capped, −inf where masked (keys ≥ Nk, causal j > i, attn_mask)
        s, _ = masked_scores(q, k, mask_ptrs, offs_m, offs_n, rows, keys, qk_scale, softcap, 0, 0,   # no band
                             IS_CAUSAL, False, HAS_MASK, MASK_IS_BOOL, SOFTCAP, INPUT_PRECISION)
        keep = s                                        # (unused without dropout)
        if DROPOUT:
            keep = dropout_keep(seed, zh, offs_m, offs_n, n_k, dropout_p)
        # the online softmax from an empty state: every key at once, one step
        m = tl.full([BLOCK_M], -float("inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)  # noqa: E741 - the paper's name
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        acc, l, m = online_softmax_step(acc, l, m, s, v, keep, qk_scale, DROPOUT, False, True, INPUT_PRECISION)
        o, lse, has_key = finish_rows(acc, l, m, dropout_p, DROPOUT, float("inf"))
        tl.store(O + z * stride_oz + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                 o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        # L = m + log2 l, base 2 as the dense forward's; +inf for a row with no key
        tl.store(L + zh * n_q + offs_m, lse, mask=row_ok)
        if HAS_MASK and not MASK_IS_BOOL:               # c = 2^(L − m)/l, l_fix_offset after L: `tile.l_fix`
            tl.store(L + l_fix_offset + zh * n_q + offs_m, l_fix(lse, m, l, has_key), mask=row_ok)


@triton.jit(do_not_specialize=["seed"])
def small_backward_kernel(
    Q, K, V, MASK, O, DO, L, DQ, DK, DV,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
    stride_mz, stride_mh, stride_mm, stride_mn, stride_oz, stride_oh, stride_om, stride_doz, stride_doh, stride_dom,
    stride_dqz, stride_dqh, stride_dqm, stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn,
    H, n_zkv, n_q, n_k, head_dim, GROUP,
    qk_scale, sm_scale, softcap, seed, dropout_p, l_fix_offset,
    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, MASK_IS_BOOL: tl.constexpr, MASK_ROW_SHARED: tl.constexpr,
    SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    # 1-D grid: cdiv(B·H_kv, HEADS) programs; each owns HEADS (batch, k/v head) pairs outright
    h_kv = H // GROUP                                   # how many k/v heads (H q heads, GROUP per k/v head)
    offs_n = tl.arange(0, BLOCK_N)                      # every key: BLOCK_N ≥ Nk
    offs_d = tl.arange(0, BLOCK_D)
    offs_mb = tl.arange(0, BLOCK_M)
    d_ok = offs_d < head_dim
    for i in range(HEADS):
        zkv = tl.program_id(0) * HEADS + i
        rows = tl.where(zkv < n_zkv, n_q, 0)            # past B·H_kv: nothing loaded or stored
        keys = tl.where(zkv < n_zkv, n_k, 0)
        z, kv_h = zkv // h_kv, zkv % h_kv               # this pair's batch entry and k/v head index
        kv_ok = (offs_n < keys)[:, None] & d_ok[None, :]
        # K and V stay on chip for the whole program; dK and dV collect every query of every q head
        k = tl.load(K + z * stride_kz + kv_h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                    mask=kv_ok, other=0.0)
        v = tl.load(V + z * stride_vz + kv_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                    mask=kv_ok, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        for g in range(0, GROUP):                       # every q head that uses this k/v head
            h = kv_h * GROUP + g
            zh = z * H + h
            for start_m in range(0, rows, BLOCK_M):
                offs_m = start_m + offs_mb
                row_ok = offs_m < rows
                q_ok = row_ok[:, None] & d_ok[None, :]
                q = tl.load(Q + z * stride_qz + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                            mask=q_ok, other=0.0)
                do = tl.load(DO + z * stride_doz + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                             mask=q_ok, other=0.0)
                o = tl.load(O + z * stride_oz + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                            mask=q_ok, other=0.0)
                delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)       # D_i = rowsum(dO ∘ O)
                lse = tl.load(L + zh * n_q + offs_m, mask=row_ok, other=float("inf"))
                mask_ptrs = mask_tile_ptrs(MASK + z * stride_mz + h * stride_mh, offs_m, offs_n, stride_mm,
                                           stride_mn, MASK_ROW_SHARED)
                s, capped = masked_scores(q, k, mask_ptrs, offs_m, offs_n, rows, keys, qk_scale, softcap, 0, 0,
                                          IS_CAUSAL, False, HAS_MASK, MASK_IS_BOOL, SOFTCAP, INPUT_PRECISION)
                p = tl.math.exp2(s - lse[:, None])                            # P = 2^(S − L), recomputed
                if HAS_MASK and not MASK_IS_BOOL:                             # exact where L lost log2 l (l_fix)
                    p = p * tl.load(L + l_fix_offset + zh * n_q + offs_m, mask=row_ok, other=1.0)[:, None]
                keep = p                                                      # (unused without dropout)
                if DROPOUT:
                    keep = dropout_keep(seed, zh, offs_m, offs_n, n_k, dropout_p)
                dk, dv, ds = key_value_gradients(dk, dv, p, q, do, v, delta, capped, softcap, keep, dropout_p,
                                                 DROPOUT, SOFTCAP, INPUT_PRECISION)
                # dQ_i = dS K · scale is complete: this program holds every key of the head
                dq = dot(ds.to(k.dtype), k, INPUT_PRECISION) * sm_scale
                tl.store(DQ + z * stride_dqz + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
                         dq.to(DQ.dtype.element_ty), mask=q_ok)
        tl.store(DK + z * stride_dkz + kv_h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
                 (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_ok)
        tl.store(DV + z * stride_dvz + kv_h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=kv_ok)
