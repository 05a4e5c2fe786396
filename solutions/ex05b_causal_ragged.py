"""Exercise 05b, reference answer: the forward kernel for any sequence lengths, causal or not."""

import math

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for  # compiled for CUDA tensors, Triton's interpreter for CPU ones

BLOCK = 32


@triton.jit
def flash_forward_kernel(Q, K, V, O, L, n_q, n_k, scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (query block, batch·head); rows ≥ n_q and keys ≥ n_k masked."""
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    q_base, kv_base = head * n_q * HEAD_DIM, head * n_k * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    q = tl.load(Q + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = n_k
    if IS_CAUSAL:  # key blocks that start after this block's last query are all masked: skip them
        hi = tl.minimum(n_k, (start_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < n_k
        kv = kv_base + cols[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv, mask=col_ok[:, None], other=0.0)
        v = tl.load(V + kv, mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        valid = col_ok[None, :]
        if IS_CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        s = tl.where(valid, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)   # padded rows: no key at all
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    tl.store(O + q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_safe[:, None]).to(O.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(L + head * n_q + offs_m, m_i + tl.log(l_safe), mask=row_ok)


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                  scale: float | None = None):
    """Launch `flash_forward_kernel` for any Nq, Nk; returns (out, lse)."""
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kernel_for(flash_forward_kernel, q.device)[(triton.cdiv(n_q, BLOCK), B * H)](
        q, k, v, out, lse, n_q, n_k, scale, HEAD_DIM=D, IS_CAUSAL=is_causal, BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    return out, lse
