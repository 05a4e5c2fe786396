"""Exercise 05, reference answer: the flash-attention forward kernel, non-causal, N a
multiple of the block size."""

import math

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for  # compiled for CUDA tensors, Triton's interpreter for CPU ones

BLOCK = 32


@triton.jit
def flash_forward_kernel(Q, K, V, O, L, seq_len, scale, HEAD_DIM: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (query block, batch·head) of contiguous (B·H, N, D) tensors."""
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    base = head * seq_len * HEAD_DIM                       # this head's (N, D) slab
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)     # running row max
    l_i = tl.zeros([BLOCK_M], tl.float32)                   # running row sum of e^(s − m)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)         # running unnormalised P̃ V
    for start_n in range(0, seq_len, BLOCK_N):
        kv = base + (start_n + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv)
        v = tl.load(V + kv)
        s = tl.dot(q, tl.trans(k)) * scale                  # S = Q Kᵀ · scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])                      # P̃ = e^(S − m')
        alpha = tl.exp(m_i - m_new)                         # rescales the old state
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))
    tl.store(L + head * seq_len + offs_m, m_i + tl.log(l_i))   # log-sum-exp, natural log


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None):
    """Launch `flash_forward_kernel`; returns (out, lse)."""
    B, H, N, D = q.shape
    if N % BLOCK:
        raise ValueError(f"q: sequence length {N} is not a multiple of {BLOCK}; exercise 05b handles any N.")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(B, H, N, dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kernel_for(flash_forward_kernel, q.device)[(N // BLOCK, B * H)](
        q, k, v, out, lse, N, scale, HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    return out, lse
