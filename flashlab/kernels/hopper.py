"""FlashAttention for Hopper (sm_90) in Triton: the steps from FlashAttention-2 towards
FlashAttention-3 that Triton can express, as compile-time switches of three kernels.

`flash_triton.py` stays the course's kernel (every feature, runs in the interpreter); this
module is its fast path for the common case on an H100/H200: fp16/bf16, D ∈ {64, 128}, no
attn_mask, no dropout, one k/v head per q head. Each switch is one rung of the ladder that
the hopper-ladder suite measures (`LADDER`, at the end of this file; results/<gpu>/hopper-ladder.json):

    FOLD_SCALE       the softmax scale·log2(e) folded into the exponent: the row maximum is
                     taken over the raw scores and scaled once per row, and each score costs one
                     FMA, 2^(s·c − m), where today's kernel first scales the whole tile,
                     S·c, then subtracts: 2^(S·c − m).
    USE_TMA          tiles move through host-built tensor descriptors (TMA on Hopper: one
                     thread issues a whole tile's copy; bounds are the descriptor's, so rows
                     past N are zero-filled on load and dropped on store, with no masks).

Not here: warp specialisation (``tl.range(..., warp_specialize=True)``, a producer warp for the
loads beside consumer warps for the MMAs and the softmax). Triton 3.6's Hopper pass
(NVGPUWarpSpecialization) rejects these loops when compiling for sm_90: it aborts the process on
the forward ("unsupported op type", WSDataPartition.cpp) and fails on a plain 2-D-descriptor
version of it, so the ladder has no such step.

What stays as in `flash_triton.py`: the online softmax in base 2, the log-sum-exp L = m + log2 l
the backward reads, a masked loop only for tiles on the causal diagonal or the ragged end of N.

Why no masks are needed off the diagonal, even for N not a multiple of the block: a row past
N is loaded as zeros (the descriptor's bounds, or a masked load's ``other=0``), so
  - forward: a key past Nk still needs −inf (it would take softmax weight): the last key
    block is on the masked path; a query past Nq is computed and never stored;
  - dK/dV: a query past Nq has L = +inf (its masked load's ``other``), so P = 2^(S − L) = 0
    and dS = P ∘ (dP − D) = 0; a key past Nk gives dK/dV rows that are never stored;
  - dQ: a key past Nk has K = V = 0, so dP = dO Vᵀ = 0 there and dS K adds 0.

The dK/dV kernel works transposed, as the FlashAttention-2 paper's backward does on Hopper:
Sᵀ = K Qᵀ, so Pᵀ and dSᵀ come out of the MMAs in the orientation the next MMA needs
(dV += Pᵀ dO, dK += dSᵀ Q): no register tile is transposed (`flash_triton.py` computes S and
transposes P and dS, a trip through shared memory each).

Tensors are (B, H, N, D) with the head dimension contiguous; descriptors are rank 4 over that
shape, so each tile is one (batch, head)'s rows and TMA's bounds are that head's N.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import triton
import triton.language as tl


@triton.jit
def _load_rows(desc, base, z, h, row0, n_rows, stride_row,
               BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows row0 … row0 + BLOCK − 1 of one (batch z, head h) matrix, zeros past ``n_rows``:
    through the rank-4 descriptor ``desc`` (USE_TMA), else through ``base`` (already shifted to
    this batch and head) with a bounds mask."""
    if USE_TMA:
        return desc.load([z, h, row0, 0]).reshape(BLOCK, HEAD_DIM)
    rows = row0 + tl.arange(0, BLOCK)
    ptrs = base + rows[:, None] * stride_row + tl.arange(0, HEAD_DIM)[None, :]
    return tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)


@triton.jit
def _store_rows(desc, base, z, h, row0, n_rows, stride_row, tile,
                BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr):
    """Stores ``tile`` as rows row0 … of one (batch, head) matrix, dropping rows past ``n_rows``."""
    if USE_TMA:
        desc.store([z, h, row0, 0], tile.reshape(1, 1, BLOCK, HEAD_DIM))
    else:
        rows = row0 + tl.arange(0, BLOCK)
        ptrs = base + rows[:, None] * stride_row + tl.arange(0, HEAD_DIM)[None, :]
        tl.store(ptrs, tile, mask=(rows < n_rows)[:, None])


@triton.jit
def _forward_tiles(acc, l_i, m_i, q, desc_k, desc_v, K, V, z, h, stride_kn, stride_vn, offs_m, lo, hi, n_k,
                   qk_scale, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_N: tl.constexpr, FOLD_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
                  ):
    """Folds key blocks lo, lo + BLOCK_N, … < hi into the online-softmax state (acc, l, m).
    MASKED: keys past Nk and (causal) past the query get −inf; else no mask at all."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_rows(desc_k, K, z, h, start_n, n_k, stride_kn, BLOCK_N, HEAD_DIM, USE_TMA)
        s = tl.dot(q, tl.trans(k))                                   # S = Q K_jᵀ (unscaled)
        if not FOLD_SCALE:
            s = s * qk_scale                                         # today's kernel: the tile scaled first
        if MASKED:
            cols = start_n + offs_n
            valid = (cols < n_k)[None, :]
            if IS_CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])   # top-left: key j ≤ query i
            s = tl.where(valid, s, -float("inf"))
        if FOLD_SCALE:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)         # max(S·c) = max(S)·c for c > 0
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED:
            m_new_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row with no key yet
        else:
            m_new_safe = m_new                                       # every row has BLOCK_N keys here
        if FOLD_SCALE:
            p = tl.math.exp2(s * qk_scale - m_new_safe[:, None])     # P̃ = 2^(S·c − m'), one FMA a score
        else:
            p = tl.math.exp2(s - m_new_safe[:, None])                # P̃ = 2^(S − m')
        alpha = tl.math.exp2(m_i - m_new_safe)                       # 2^(m − m')
        l_i = l_i * alpha + tl.sum(p, 1)                             # l' = l·2^(m − m') + rowsum P̃
        v = _load_rows(desc_v, V, z, h, start_n, n_k, stride_vn, BLOCK_N, HEAD_DIM, USE_TMA)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])         # acc' = acc·2^(m − m') + P̃ V_j
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def hopper_forward_kernel(
    Q, K, V, O, L, desc_q, desc_k, desc_v, desc_o,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
    stride_oz, stride_oh, stride_om,
    H, n_q, n_k, qk_scale,
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    FOLD_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)   # the causal diagonal starts on a key-block boundary
    # 1-D grid, query blocks fastest (the programs of one head share its K/V in L2);
    # causal: the longest programs (last query blocks) first, for a better-filled last wave
    num_m = tl.cdiv(n_q, BLOCK_M)
    start_m = tl.program_id(0) % num_m
    if IS_CAUSAL:
        start_m = num_m - 1 - start_m
    zh = tl.program_id(0) // num_m
    z, h = zh // H, zh % H
    Q += z * stride_qz + h * stride_qh                   # (unused through descriptors)
    K += z * stride_kz + h * stride_kh
    V += z * stride_vz + h * stride_vh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load_rows(desc_q, Q, z, h, start_m * BLOCK_M, n_q, stride_qm, BLOCK_M, HEAD_DIM, USE_TMA)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # key blocks [0, clean_hi) need no mask (whole, and causal: before the block's first query);
    # [clean_hi, hi) are masked: the diagonal and the ragged end of Nk
    hi = n_k
    clean_hi = (n_k // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)
        clean_hi = tl.minimum(clean_hi, start_m * BLOCK_M)
    acc, l_i, m_i = _forward_tiles(acc, l_i, m_i, q, desc_k, desc_v, K, V, z, h, stride_kn, stride_vn, offs_m,
                                   0, clean_hi, n_k, qk_scale, False, IS_CAUSAL, HEAD_DIM, BLOCK_N, FOLD_SCALE,
                                   USE_TMA)
    acc, l_i, m_i = _forward_tiles(acc, l_i, m_i, q, desc_k, desc_v, K, V, z, h, stride_kn, stride_vn, offs_m,
                                   clean_hi, hi, n_k, qk_scale, True, IS_CAUSAL, HEAD_DIM, BLOCK_N, FOLD_SCALE,
                                   USE_TMA)

    # every row has a key (non-causal: all of them; causal top-left: key 0), so l > 0
    o = acc / l_i[:, None]                                             # O_i = acc / l
    O += z * stride_oz + h * stride_oh
    _store_rows(desc_o, O, z, h, start_m * BLOCK_M, n_q, stride_om, o.to(O.dtype.element_ty),
                BLOCK_M, HEAD_DIM, USE_TMA)
    tl.store(L + zh * n_q + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < n_q)   # L = m + log2 l


@triton.jit
def _dkdv_tiles(dk, dv, k, v, desc_q, desc_do, Q, DO, L, DELTA, z, h, stride_qm, stride_dom, offs_n, lo, hi, n_q,
                qk_scale, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                FOLD_SCALE: tl.constexpr, USE_TMA: tl.constexpr,):
    """Accumulates dK_j, dV_j over query blocks lo, lo + BLOCK_M, … < hi, transposed:
    Sᵀ = K_j Q_iᵀ (keys × queries). MASKED: the causal diagonal (key j > query i → P = 0)."""
    offs_mb = tl.arange(0, BLOCK_M)
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_mb
        q = _load_rows(desc_q, Q, z, h, start_m, n_q, stride_qm, BLOCK_M, HEAD_DIM, USE_TMA)
        lse = tl.load(L + offs_m, mask=offs_m < n_q, other=float("inf"))    # past Nq: P = 0
        s_t = tl.dot(k, tl.trans(q))                                  # Sᵀ = K Qᵀ
        if FOLD_SCALE:
            p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])         # Pᵀ = 2^(Sᵀ·c − L), one FMA
        else:
            s_t = s_t * qk_scale
            p_t = tl.math.exp2(s_t - lse[None, :])
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)
        do = _load_rows(desc_do, DO, z, h, start_m, n_q, stride_dom, BLOCK_M, HEAD_DIM, USE_TMA)
        dv = tl.dot(p_t.to(do.dtype), do, dv)                         # dV += Pᵀ dO
        delta = tl.load(DELTA + offs_m, mask=offs_m < n_q, other=0.0)
        dp_t = tl.dot(v, tl.trans(do))                                # dPᵀ = V dOᵀ
        ds_t = p_t * (dp_t - delta[None, :])                          # dSᵀ = Pᵀ ∘ (dPᵀ − D)
        dk = tl.dot(ds_t.to(q.dtype), q, dk)                          # dK += dSᵀ Q
    return dk, dv


@triton.jit
def hopper_dkdv_kernel(
    Q, K, V, DO, L, DELTA, DK, DV, desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
    stride_doz, stride_doh, stride_dom, stride_dkz, stride_dkh, stride_dkn, stride_dvz, stride_dvh, stride_dvn,
    H, n_q, n_k, qk_scale, sm_scale,
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    FOLD_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
):
    tl.static_assert(BLOCK_N % BLOCK_M == 0)   # the diagonal is whole query blocks
    num_n = tl.cdiv(n_k, BLOCK_N)                                    # 1-D grid, key blocks fastest
    start_n = (tl.program_id(0) % num_n) * BLOCK_N
    zh = tl.program_id(0) // num_n
    z, h = zh // H, zh % H
    K += z * stride_kz + h * stride_kh
    V += z * stride_vz + h * stride_vh
    Q += z * stride_qz + h * stride_qh
    DO += z * stride_doz + h * stride_doh
    L += zh * n_q
    DELTA += zh * n_q

    offs_n = start_n + tl.arange(0, BLOCK_N)
    # K_j and V_j are loaded once and stay on chip for the whole pass
    k = _load_rows(desc_k, K, z, h, start_n, n_k, stride_kn, BLOCK_N, HEAD_DIM, USE_TMA)
    v = _load_rows(desc_v, V, z, h, start_n, n_k, stride_vn, BLOCK_N, HEAD_DIM, USE_TMA)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    # causal: queries before start_n see none of these keys; [start_n, start_n + BLOCK_N) is the
    # diagonal (masked); the rest unmasked. Non-causal: every query block, unmasked.
    lo = 0
    if IS_CAUSAL:
        lo = tl.minimum(start_n + BLOCK_N, tl.cdiv(n_q, BLOCK_M) * BLOCK_M)
        dk, dv = _dkdv_tiles(dk, dv, k, v, desc_q, desc_do, Q, DO, L, DELTA, z, h, stride_qm, stride_dom, offs_n,
                             start_n, lo, n_q, qk_scale, True, HEAD_DIM, BLOCK_M, FOLD_SCALE, USE_TMA)
    dk, dv = _dkdv_tiles(dk, dv, k, v, desc_q, desc_do, Q, DO, L, DELTA, z, h, stride_qm, stride_dom, offs_n,
                         lo, n_q, n_q, qk_scale, False, HEAD_DIM, BLOCK_M, FOLD_SCALE, USE_TMA)

    DK += z * stride_dkz + h * stride_dkh
    DV += z * stride_dvz + h * stride_dvh
    _store_rows(desc_dk, DK, z, h, start_n, n_k, stride_dkn, (dk * sm_scale).to(DK.dtype.element_ty),
                BLOCK_N, HEAD_DIM, USE_TMA)                          # dK = scale · Σ dSᵀ Q
    _store_rows(desc_dv, DV, z, h, start_n, n_k, stride_dvn, dv.to(DV.dtype.element_ty), BLOCK_N, HEAD_DIM, USE_TMA)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, desc_k, desc_v, K, V, z, h, stride_kn, stride_vn, offs_m, lo, hi, n_k,
              qk_scale, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              FOLD_SCALE: tl.constexpr, USE_TMA: tl.constexpr,):
    """Accumulates dQ_i over key blocks lo, lo + BLOCK_N, … < hi. MASKED: the causal diagonal."""
    offs_nb = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_rows(desc_k, K, z, h, start_n, n_k, stride_kn, BLOCK_N, HEAD_DIM, USE_TMA)
        s = tl.dot(q, tl.trans(k))                                    # S = Q Kᵀ
        if FOLD_SCALE:
            p = tl.math.exp2(s * qk_scale - lse[:, None])             # P = 2^(S·c − L), one FMA
        else:
            s = s * qk_scale
            p = tl.math.exp2(s - lse[:, None])
        if MASKED:
            p = tl.where((start_n + offs_nb)[None, :] <= offs_m[:, None], p, 0.0)
        v = _load_rows(desc_v, V, z, h, start_n, n_k, stride_vn, BLOCK_N, HEAD_DIM, USE_TMA)
        dp = tl.dot(do, tl.trans(v))                                  # dP = dO Vᵀ
        ds = p * (dp - delta[:, None])                                # dS = P ∘ (dP − D)
        dq = tl.dot(ds.to(k.dtype), k, dq)                            # dQ += dS K
    return dq


@triton.jit
def hopper_dq_kernel(
    Q, K, V, DO, L, DELTA, DQ, desc_q, desc_k, desc_v, desc_do, desc_dq,
    stride_qz, stride_qh, stride_qm, stride_kz, stride_kh, stride_kn, stride_vz, stride_vh, stride_vn,
    stride_doz, stride_doh, stride_dom, stride_dqz, stride_dqh, stride_dqm,
    H, n_q, n_k, qk_scale, sm_scale,
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    FOLD_SCALE: tl.constexpr, USE_TMA: tl.constexpr,
):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)   # the diagonal starts on a key-block boundary
    num_m = tl.cdiv(n_q, BLOCK_M)                                    # 1-D grid, query blocks fastest
    start_m = tl.program_id(0) % num_m
    zh = tl.program_id(0) // num_m
    z, h = zh // H, zh % H
    Q += z * stride_qz + h * stride_qh
    DO += z * stride_doz + h * stride_doh
    K += z * stride_kz + h * stride_kh
    V += z * stride_vz + h * stride_vh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load_rows(desc_q, Q, z, h, start_m * BLOCK_M, n_q, stride_qm, BLOCK_M, HEAD_DIM, USE_TMA)
    do = _load_rows(desc_do, DO, z, h, start_m * BLOCK_M, n_q, stride_dom, BLOCK_M, HEAD_DIM, USE_TMA)
    lse = tl.load(L + zh * n_q + offs_m, mask=offs_m < n_q, other=float("inf"))
    delta = tl.load(DELTA + zh * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # keys [0, clean_hi) unmasked; causal: [clean_hi, hi) is the diagonal. A ragged end of Nk
    # needs no mask here (K = V = 0 past Nk: see the module's docstring)
    hi = n_k
    clean_hi = n_k
    if IS_CAUSAL:
        hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)
        clean_hi = tl.minimum(n_k, start_m * BLOCK_M)
    dq = _dq_tiles(dq, q, do, lse, delta, desc_k, desc_v, K, V, z, h, stride_kn, stride_vn, offs_m, 0, clean_hi,
                   n_k, qk_scale, False, HEAD_DIM, BLOCK_N, FOLD_SCALE, USE_TMA)
    if IS_CAUSAL:
        dq = _dq_tiles(dq, q, do, lse, delta, desc_k, desc_v, K, V, z, h, stride_kn, stride_vn, offs_m, clean_hi,
                       hi, n_k, qk_scale, True, HEAD_DIM, BLOCK_N, FOLD_SCALE, USE_TMA)
    DQ += z * stride_dqz + h * stride_dqh
    _store_rows(desc_dq, DQ, z, h, start_m * BLOCK_M, n_q, stride_dqm, (dq * sm_scale).to(DQ.dtype.element_ty),
                BLOCK_M, HEAD_DIM, USE_TMA)                          # dQ = scale · Σ dS K


# -- the ladder: which switches and tiles each step uses (plain data: the ahead-of-time compile
# reads it without torch) ------------------------------------------------------------------------

@dataclass(frozen=True)
class Tiles:
    """One launch configuration: BLOCK_M × BLOCK_N tiles, warps, pipeline stages."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}"


@dataclass(frozen=True)
class Step:
    """One rung of the ladder: the kernels' switches and the tiles it may use, per kernel and D
    (the first of each list is what the dispatcher launches when this step is the final one)."""
    name: str
    change: str
    fold_scale: bool
    use_tma: bool
    tiles: dict = field(hash=False)

    def flags(self) -> dict:
        return {"FOLD_SCALE": self.fold_scale, "USE_TMA": self.use_tma}


# The course kernel's defaults on an H200 (autotune._HOPPER's first entries), so that steps 1-3
# change the code only; dkdv needs BLOCK_N a multiple of BLOCK_M and dq BLOCK_M of BLOCK_N.
_SAME_TILES = {
    "forward": {64: [Tiles(128, 64, 4, 3)], 128: [Tiles(128, 64, 8, 3)]},
    "dkdv": {64: [Tiles(64, 64, 4, 2)], 128: [Tiles(64, 64, 4, 2)]},
    "dq": {64: [Tiles(64, 64, 4, 2)], 128: [Tiles(64, 64, 4, 2)]},
}
# Step 4's candidates, the dispatcher's default first. The order comes from the first full ladder
# run on an H200 (an earlier hopper-ladder record, in the git history of results/h200/), which timed
# every candidate on 16 shapes: the forward at D = 128 was fastest with 64x64 tiles and 4 warps on
# all 8 of them (0.54 against 0.65 ms at N = 2k full), and no candidate beat step 3's 64x64 w4
# dK/dV and dQ tiles (at D = 128 the 8-warp dK/dV tiles that were meant to end the spills made
# the bf16 backward 9-24% (64x128) and 72-91% (64x64) slower), so those stay first. The others
# remain candidates, timed in every run.
_WIDE_TILES = {
    "forward": {64: [Tiles(128, 64, 4, 3), Tiles(128, 128, 4, 2), Tiles(128, 128, 8, 2)],
                128: [Tiles(64, 64, 4, 3), Tiles(128, 64, 8, 3), Tiles(128, 128, 8, 2)]},
    "dkdv": {64: [Tiles(64, 64, 4, 2), Tiles(32, 128, 4, 2), Tiles(64, 128, 8, 2)],
             128: [Tiles(64, 64, 4, 2), Tiles(64, 128, 8, 2), Tiles(32, 64, 4, 2), Tiles(64, 64, 8, 2)]},
    "dq": {64: [Tiles(64, 64, 4, 2), Tiles(128, 64, 8, 2), Tiles(128, 128, 8, 2)],
           128: [Tiles(64, 64, 4, 2), Tiles(128, 64, 8, 2), Tiles(64, 32, 4, 2)]},
}

# Step 0 is the course kernel itself (flash_triton.py through flash_launch); steps 1… each add
# one change to the previous one.
LADDER = (
    Step("1 specialised", "the Hopper module's kernels with today's arithmetic: no mask, dropout or GQA code, "
         "zero-filled loads instead of bounds masks off the diagonal, dK/dV computed transposed (Sᵀ = K Qᵀ)",
         False, False, _SAME_TILES),
    Step("2 exp2 FMA", "softmax scale·log2(e) folded into the exponent: one FMA per score, the row max scaled "
         "once per row", True, False, _SAME_TILES),
    Step("3 tensor descriptors", "tiles loaded and stored through TMA tensor descriptors", True, True, _SAME_TILES),
    Step("4 tiles", "the forward at D = 128 with 64x64 tiles and 4 warps (step 3: 128x64, 8 warps); every "
         "kernel's other candidates timed beside the dispatched ones", True, True, _WIDE_TILES),
)
