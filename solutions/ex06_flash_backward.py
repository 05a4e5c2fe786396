"""Exercise 06, reference answer: the flash-attention backward kernels (dK/dV pass, dQ pass)."""

import math

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for  # compiled for CUDA tensors, Triton's interpreter for CPU ones

BLOCK = 32


@triton.jit
def _probabilities(q, k, lse, offs_m, offs_n, n_q, n_k, scale, IS_CAUSAL: tl.constexpr):
    """P = e^(S − L) for one tile, recomputed from Q, K and the saved log-sum-exp."""
    s = tl.dot(q, tl.trans(k)) * scale
    valid = (offs_m < n_q)[:, None] & (offs_n < n_k)[None, :]
    if IS_CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None])
    return tl.where(valid, tl.exp(s - lse[:, None]), 0.0)


@triton.jit
def _query_rows(Q, DO, L, DELTA, q_base, head, offs_m, offs_d, n_q, HEAD_DIM: tl.constexpr):
    """Q_i, dO_i, L_i and D_i of one query block (rows ≥ Nq read as 0)."""
    q_ok = (offs_m < n_q)[:, None]
    q = tl.load(Q + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=q_ok, other=0.0)
    do = tl.load(DO + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=q_ok, other=0.0)
    lse = tl.load(L + head * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    delta = tl.load(DELTA + head * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    return q, do, lse, delta


@triton.jit
def dkdv_kernel(Q, K, V, DO, L, DELTA, DK, DV, n_q, n_k, scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (key block, batch·head): K_j, V_j stay on chip while query blocks stream."""
    start_n = tl.program_id(0) * BLOCK_N
    head = tl.program_id(1)
    q_base, kv_base = head * n_q * HEAD_DIM, head * n_k * HEAD_DIM
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_ok = (offs_n < n_k)[:, None]
    k = tl.load(K + kv_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(V + kv_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = 0
    if IS_CAUSAL:  # query blocks that end before this key block's first key see none of it
        lo = (start_n // BLOCK_M) * BLOCK_M
    for start_m in range(lo, n_q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q, do, lse, delta = _query_rows(Q, DO, L, DELTA, q_base, head, offs_m, offs_d, n_q, HEAD_DIM)
        p = _probabilities(q, k, lse, offs_m, offs_n, n_q, n_k, scale, IS_CAUSAL)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)            # dV_j += Pᵀ dO_i
        dp = tl.dot(do, tl.trans(v))                          # dP = dO_i V_jᵀ
        ds = p * (dp - delta[:, None])                        # dS = P ∘ (dP − D_i)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)             # dK_j += dSᵀ Q_i
    tl.store(DK + kv_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=kv_ok)
    tl.store(DV + kv_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def dq_kernel(Q, K, V, DO, L, DELTA, DQ, n_q, n_k, scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (query block, batch·head): dQ_i = Σ_j dS_ij K_j · scale."""
    start_m = tl.program_id(0)                                # the query block's index, as in notebook 05
    head = tl.program_id(1)
    q_base, kv_base = head * n_q * HEAD_DIM, head * n_k * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q, do, lse, delta = _query_rows(Q, DO, L, DELTA, q_base, head, offs_m, offs_d, n_q, HEAD_DIM)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = n_k
    if IS_CAUSAL:
        hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)        # up to and including the diagonal block
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_ok = (offs_n < n_k)[:, None]
        k = tl.load(K + kv_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(V + kv_base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_ok, other=0.0)
        p = _probabilities(q, k, lse, offs_m, offs_n, n_q, n_k, scale, IS_CAUSAL)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)                       # dQ_i += dS K_j
    tl.store(DQ + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=(offs_m < n_q)[:, None])


def flash_backward(q, k, v, out, lse, grad_out, is_causal: bool = False, scale: float | None = None):
    """Launch the two backward kernels; returns (dq, dk, dv)."""
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    q, k, v, grad_out = q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous()
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    delta = (grad_out.float() * out.float()).sum(-1).contiguous()      # D = rowsum(dO ∘ O)
    lse = lse.float().contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    meta = dict(HEAD_DIM=D, IS_CAUSAL=is_causal, BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    kernel_for(dkdv_kernel, q.device)[(triton.cdiv(n_k, BLOCK), B * H)](
        q, k, v, grad_out, lse, delta, dk, dv, n_q, n_k, scale, **meta)
    kernel_for(dq_kernel, q.device)[(triton.cdiv(n_q, BLOCK), B * H)](
        q, k, v, grad_out, lse, delta, dq, n_q, n_k, scale, **meta)
    return dq, dk, dv
