"""A FlashAttention forward for Hopper (sm_90) in Gluon, Triton's lower-level language: the
design of FlashAttention-3 written with explicit layouts, asynchronous tensor-core MMAs
(wgmma), TMA copies, mbarriers and warp specialisation.

One program computes one tile of BLOCK_M = 128 queries of one (batch, head). Its warps are split
by role (`gl.warp_specialize`):

    load partition (1 warp)      issues TMA copies: Q once, then K_j and V_j into a ring of
                                 STAGES shared-memory buffers; each copy completes on the buffer's
                                 "ready" mbarrier, and the partition waits on its "empty" mbarrier
                                 before refilling it
    softmax partition (8 warps,  two warpgroups, 64 query rows each: for each key block
      the default)               S = Q K_jᵀ (wgmma from shared memory, fp32 in registers),
                                 the online softmax in base 2 with the scale folded into the
                                 exponent, acc = acc·2^(m−m') + P V_j (P from registers), then
                                 releases the buffer to the load partition

The loads of later key blocks run ahead of the MMAs by up to STAGES blocks, on their own warp,
so the softmax warps never wait on memory once the ring is full. With OVERLAP the softmax
partition issues the next block's Q K_{j+1}ᵀ before the current block's softmax, so the tensor
cores work on it while the softmax runs (FlashAttention-3's intra-warpgroup overlap).

What the kernel takes: fp16/bf16, D ∈ {64, 128}, Nq = Nk a multiple of 128, no mask, dropout,
window or soft-cap; causal or not; k/v heads dividing the q heads (GQA). `flashlab.launch.gluon`
says when it runs, and everything else runs the Triton kernels. Its log-sum-exp is the dense
kernels' (base 2, (B, H, N) fp32), so their backward follows it.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

BLOCK_M = 128


@gluon.constexpr_function
def mma_layout(block_m, block_n, num_warps):
    """The wgmma accumulator layout of a block_m × block_n fp32 tile over ``num_warps`` warps:
    warps stacked along the rows (16 rows each), instructions as wide as the tile allows."""
    n = 256
    while n > block_n or block_n % n != 0:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, bufs, bars, offsets, n_blocks, STAGES: gl.constexpr):
    """The producer: Q once, then K_j and V_j for j = 0 … n_blocks − 1 into the ring."""
    q_smem, k_ring, v_ring = bufs
    q_bar, k_ready, v_ready, kv_empty = bars
    q_row, kv_row = offsets
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    for j in range(n_blocks):
        slot = j % STAGES
        # a slot's "empty" barrier completes once per reuse; the first round passes at once
        mbarrier.wait(kv_empty.index(slot), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], k_ready.index(slot), k_ring.index(slot))
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], v_ready.index(slot), v_ring.index(slot))


@gluon.jit
def _issue_scores(q_smem, k_ring, k_ready, j, STAGES: gl.constexpr, s_layout: gl.constexpr, BM: gl.constexpr,
                  BLOCK_N: gl.constexpr):
    """Issues S = Q K_jᵀ (async wgmma, fp32 accumulator in registers) once K_j has landed."""
    slot = j % STAGES
    mbarrier.wait(k_ready.index(slot), gl.to_tensor((j // STAGES) & 1))     # (j may be a constant: block 0)
    k_t = k_ring.index(slot).permute((1, 0))                  # Kᵀ as a view: wgmma reads it transposed
    zero = gl.zeros([BM, BLOCK_N], gl.float32, s_layout)
    return warpgroup_mma(q_smem, k_t, zero, use_acc=False, is_async=True)


@gluon.jit
def _softmax_step(s, m_i, l_i, rows, j, diag_start, qk_scale, IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
                  s_layout: gl.constexpr):
    """The online softmax of one key block, in base 2 with the scale folded into the exponent:
    m' = max(m, rowmax S·c), P̃ = 2^(S·c − m'), α = 2^(m − m'), l' = l·α + rowsum P̃ (one FMA a score).
    Causal: a block that reaches past ``diag_start`` (the tile's first query) holds the diagonal,
    where key > query gets −inf."""
    if IS_CAUSAL:
        if (j + 1) * BLOCK_N > diag_start:
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            s = gl.where(cols[None, :] <= rows[:, None], s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _take_turn(turns, t, FIRST: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: wait until the other consumer has issued its MMAs of turn t − 1 (the first consumer
    starts: a fresh mbarrier passes a wait on parity 1)."""
    if PINGPONG:
        mine, _ = turns
        if FIRST:
            mbarrier.wait(mine, gl.to_tensor((t & 1) ^ 1))
        else:
            mbarrier.wait(mine, gl.to_tensor(t & 1))


@gluon.jit
def _pass_turn(turns, PINGPONG: gl.constexpr):
    if PINGPONG:
        _, theirs = turns
        mbarrier.arrive(theirs, count=1)


@gluon.jit
def _consumer(o_desc, L, q_tile, k_ring, v_ring, bars, turns, q_row, row0, n_blocks, diag_start, qk_scale,
              IS_CAUSAL: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
              FIRST: gl.constexpr, num_warps: gl.constexpr):
    """A softmax consumer: the online softmax of its query rows ``q_tile`` over the key blocks,
    O = acc / l, L = m + log2 l.

    OVERLAP (FlashAttention-3's intra-warpgroup overlap): block j's Q K_jᵀ and block j − 1's P V
    are issued together, and the softmax of block j runs while the tensor cores finish P V:

        issue S_j = Q K_jᵀ;  issue acc += P_{j−1} V_{j−1};  wait S_j;  softmax(S_j) → P_j
        wait acc;  release slot j − 1;  acc ·= α_j

    PINGPONG (FlashAttention-3's inter-warpgroup overlap): two consumers, each a warpgroup with half
    of the query rows, take turns to issue their MMAs (`_take_turn`, `_pass_turn`), so one's softmax
    runs while the tensor cores work for the other."""
    q_bar, k_ready, v_ready, kv_empty = bars
    BM: gl.constexpr = q_tile.type.shape[0]
    D: gl.constexpr = q_tile.type.shape[1]
    BLOCK_N: gl.constexpr = k_ring.type.shape[1]
    s_layout: gl.constexpr = mma_layout(BM, BLOCK_N, num_warps)
    o_layout: gl.constexpr = mma_layout(BM, D, num_warps)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    m_i = gl.full([BM], -float("inf"), gl.float32, row_layout)
    l_i = gl.full([BM], 0.0, gl.float32, row_layout)
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    rows = row0 + gl.arange(0, BM, layout=row_layout)

    mbarrier.wait(q_bar, 0)
    if OVERLAP:
        _take_turn(turns, 0, FIRST, PINGPONG)
        s = _issue_scores(q_tile, k_ring, k_ready, 0, STAGES, s_layout, BM, BLOCK_N)
        _pass_turn(turns, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, rows, 0, diag_start, qk_scale, IS_CAUSAL, BLOCK_N, s_layout)
        p_op = gl.convert_layout(p.to(v_ring.dtype), p_layout)
        for j in range(1, n_blocks):
            prev = (j - 1) % STAGES
            mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
            _take_turn(turns, j, FIRST, PINGPONG)
            s = _issue_scores(q_tile, k_ring, k_ready, j, STAGES, s_layout, BM, BLOCK_N)
            acc = warpgroup_mma(p_op, v_ring.index(prev), acc, is_async=True)
            _pass_turn(turns, PINGPONG)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))              # S_j; P V still running
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, rows, j, diag_start, qk_scale, IS_CAUSAL, BLOCK_N,
                                               s_layout)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(kv_empty.index(prev), count=1)                    # K, V of block j − 1 read
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            p_op = gl.convert_layout(p.to(v_ring.dtype), p_layout)
        last = (n_blocks - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // STAGES) & 1)
        _take_turn(turns, n_blocks, FIRST, PINGPONG)
        acc = warpgroup_mma(p_op, v_ring.index(last), acc, is_async=True)
        _pass_turn(turns, PINGPONG)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_empty.index(last), count=1)
    else:
        for j in range(n_blocks):
            slot = j % STAGES
            s = _issue_scores(q_tile, k_ring, k_ready, j, STAGES, s_layout, BM, BLOCK_N)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, rows, j, diag_start, qk_scale, IS_CAUSAL, BLOCK_N,
                                               s_layout)
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            mbarrier.wait(v_ready.index(slot), (j // STAGES) & 1)
            acc = warpgroup_mma(gl.convert_layout(p.to(v_ring.dtype), p_layout), v_ring.index(slot), acc,
                                is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(kv_empty.index(slot), count=1)

    o = acc / gl.convert_layout(l_i, o_rows)[:, None]                       # O = acc / l
    q_tile.store(o.to(q_tile.dtype))                                       # its Q rows are no longer needed
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_tile)
    gl.store(L + q_row + gl.arange(0, BM, layout=row_layout), m_i + gl.log2(l_i))   # L = m + log2 l
    tma.store_wait(0)


@gluon.jit
def gluon_forward_kernel(q_desc, k_desc, v_desc, o_desc, L,
                         H, GROUP, n_q, qk_scale,
                         IS_CAUSAL: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                         PINGPONG: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    num_m = n_q // BM
    start_m = gl.program_id(0)
    if IS_CAUSAL:                                      # the longest programs (last query blocks) first
        start_m = num_m - 1 - start_m
    zh = gl.program_id(1)
    kv_zh = (zh // H) * (H // GROUP) + (zh % H) // GROUP     # GQA: q head h reads k/v head h // GROUP
    q_row = zh * n_q + start_m * BM                    # rows of the flattened (B·H·N, D) tensors
    kv_row = kv_zh * n_q
    n_blocks = n_q // BLOCK_N
    diag_start = start_m * BM                          # causal: blocks reaching past here hold the diagonal
    if IS_CAUSAL:
        n_blocks = gl.cdiv((start_m + 1) * BM, BLOCK_N)  # up to the tile's last query

    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    consumers: gl.constexpr = 2 if PINGPONG else 1
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=consumers)     # every consumer releases each slot
    mbarrier.init(turns.index(0), count=1)
    mbarrier.init(turns.index(1), count=1)

    bars = (q_bar, k_ready, v_ready, kv_empty)
    bufs = (q_smem, k_ring, v_ring)
    offsets = (q_row, kv_row)
    if PINGPONG:                                       # two warpgroups, half of the query rows each
        HALF: gl.constexpr = BM // 2
        gl.warp_specialize([
            (_consumer, (o_desc, L, q_smem.slice(0, HALF), k_ring, v_ring, bars, (turns.index(0), turns.index(1)),
                         q_row, start_m * BM, n_blocks, diag_start, qk_scale,
                         IS_CAUSAL, STAGES, OVERLAP, True, True, num_warps)),
            (_consumer, (o_desc, L, q_smem.slice(HALF, HALF), k_ring, v_ring, bars, (turns.index(1), turns.index(0)),
                         q_row + HALF, start_m * BM + HALF, n_blocks, diag_start, qk_scale,
                         IS_CAUSAL, STAGES, OVERLAP, True, False, 4)),
            (_load_partition, (q_desc, k_desc, v_desc, bufs, bars, offsets, n_blocks, STAGES)),
        ], [4, 1], [240, 24])
    else:
        gl.warp_specialize([
            (_consumer, (o_desc, L, q_smem, k_ring, v_ring, bars, (turns.index(0), turns.index(1)),
                         q_row, start_m * BM, n_blocks, diag_start, qk_scale,
                         IS_CAUSAL, STAGES, OVERLAP, False, True, num_warps)),
            (_load_partition, (q_desc, k_desc, v_desc, bufs, bars, offsets, n_blocks, STAGES)),
        ], [1], [32])


def shared_layout(block_shape, dtype):
    """The swizzled shared-memory layout TMA and wgmma read a tile of ``dtype`` in."""
    return gl.NVMMASharedLayout.get_default_for(block_shape, dtype)
