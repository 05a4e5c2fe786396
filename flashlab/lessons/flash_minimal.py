"""The smallest complete flash-attention kernels: notebook 05's forward, notebook 06's backward.

What the production kernels of `flashlab.kernels.dense` do, with every feature taken out that is not
the algorithm itself: no causal mask, no attn_mask, no dropout, no GQA, no unchecked fast
path, and N a multiple of the block sizes so no load or store needs a mask. Each kernel is
one function read top to bottom, with the math beside the line that computes it.

Layout: q, k, v, o and their gradients are contiguous (B·H, N, D) (the launchers make them
so); L and D are (B·H, N) in float32. One program handles one block of one (batch, head).
Exponents are in base 2, as in the production kernels: the scale carries log2(e), so
S is in base-2 units, P = 2^(S − L) and L = m + log2 ℓ.

fp32 inputs: Triton's interpreter multiplies tiles exactly; a GPU's ``tl.dot`` rounds fp32
products to TF32 (about 1e-3 relative), as the production kernels do unless told otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for

LOG2E = 1.4426950408889634  # log2(e): e^x = 2^(x·log2 e)


@triton.jit
def minimal_forward_kernel(Q, K, V, O, L, n, qk_scale,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Program (i, bh): O_i and L_i for the BLOCK_M queries of block i of head bh."""
    i, bh = tl.program_id(0), tl.program_id(1)
    offs_m = i * BLOCK_M + tl.arange(0, BLOCK_M)               # the query rows this program owns
    offs_n = tl.arange(0, BLOCK_N)                             # the rows of one key block
    offs_d = tl.arange(0, HEAD_DIM)
    head = bh * n * HEAD_DIM                                   # where this head's (N, D) matrices start
    q = tl.load(Q + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :])   # Q_i: read from HBM once
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)          # running row max     m = −∞
    l = tl.zeros([BLOCK_M], tl.float32)                        # running row sum     ℓ = 0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)            # unnormalised output acc = 0
    for start_n in range(0, n, BLOCK_N):                       # key blocks j = 0, 1, …: K_j, V_j stream past
        kv = head + (start_n + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv)
        v = tl.load(V + kv)
        s = tl.dot(q, tl.trans(k)) * qk_scale                  # S = Q_i K_jᵀ · s · log2 e
        m_new = tl.maximum(m, tl.max(s, 1))                    # m' = max(m, rowmax S)
        p = tl.math.exp2(s - m_new[:, None])                   # P̃ = 2^(S − m')
        alpha = tl.math.exp2(m - m_new)                        # 2^(m − m'): rescales the old state (0 at j = 0)
        l = l * alpha + tl.sum(p, 1)                           # ℓ' = ℓ·2^(m − m') + rowsum P̃
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)  # acc' = acc·2^(m − m') + P̃ V_j
        m = m_new
    o = acc / l[:, None]                                       # O_i = acc / ℓ
    tl.store(O + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty))
    tl.store(L + bh * n + offs_m, m + tl.math.log2(l))         # L_i = m + log2 ℓ: all the backward needs


@triton.jit
def minimal_dkdv_kernel(Q, K, V, DO, L, DELTA, DK, DV, n, qk_scale, sm_scale,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Program (j, bh): dK_j and dV_j, summed over every query block i (a column of tiles)."""
    j, bh = tl.program_id(0), tl.program_id(1)
    offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)               # the key rows this program owns
    offs_m = tl.arange(0, BLOCK_M)                             # the rows of one query block
    offs_d = tl.arange(0, HEAD_DIM)
    head = bh * n * HEAD_DIM
    kv = head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(K + kv)                                        # K_j, V_j: read once, kept on chip
    v = tl.load(V + kv)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for start_m in range(0, n, BLOCK_M):                       # query blocks i = 0, 1, … stream past
        rows = start_m + offs_m
        qo = head + rows[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(Q + qo)
        do = tl.load(DO + qo)
        lse = tl.load(L + bh * n + rows)                       # L_i, saved by the forward
        delta = tl.load(DELTA + bh * n + rows)                 # D_i = rowsum(dO_i ∘ O_i)
        s = tl.dot(q, tl.trans(k)) * qk_scale                  # S = Q_i K_jᵀ · s · log2 e
        p = tl.math.exp2(s - lse[:, None])                     # P = 2^(S − L_i): recomputed, never stored
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)             # dV_j += Pᵀ dO_i
        dp = tl.dot(do, tl.trans(v))                           # dP = dO_i V_jᵀ
        ds = p * (dp - delta[:, None])                         # dS = P ∘ (dP − D_i)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)              # dK_j += dSᵀ Q_i   (times s below)
    tl.store(DK + kv, (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + kv, dv.to(DV.dtype.element_ty))


@triton.jit
def minimal_dq_kernel(Q, K, V, DO, L, DELTA, DQ, n, qk_scale, sm_scale,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Program (i, bh): dQ_i, summed over every key block j (a row of tiles)."""
    i, bh = tl.program_id(0), tl.program_id(1)
    offs_m = i * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    head = bh * n * HEAD_DIM
    qo = head + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + qo)                                        # Q_i, dO_i, L_i, D_i: read once
    do = tl.load(DO + qo)
    lse = tl.load(L + bh * n + offs_m)
    delta = tl.load(DELTA + bh * n + offs_m)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, n, BLOCK_N):                       # key blocks j stream past
        kv = head + (start_n + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + kv)
        v = tl.load(V + kv)
        s = tl.dot(q, tl.trans(k)) * qk_scale                  # S = Q_i K_jᵀ · s · log2 e
        p = tl.math.exp2(s - lse[:, None])                     # P = 2^(S − L_i)
        dp = tl.dot(do, tl.trans(v))                           # dP = dO_i V_jᵀ
        ds = p * (dp - delta[:, None])                         # dS = P ∘ (dP − D_i)
        dq += tl.dot(ds.to(k.dtype), k)                        # dQ_i += dS K_j   (times s below)
    tl.store(DQ + qo, (dq * sm_scale).to(DQ.dtype.element_ty))


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int, block_n: int) -> None:
    """The minimal kernels' whole contract; anything else is the production kernels' job."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a tensor of shape (B, H, N, D), got "
                             f"{getattr(t, 'shape', type(t).__name__)}. Use flashlab.attention for other layouts.")
        if t.dtype not in (torch.float16, torch.float32):
            raise ValueError(f"{name}: dtype {t.dtype} is not supported by the minimal kernels. "
                             f"Use torch.float16 or torch.float32, e.g. {name}.half().")
    if not q.shape == k.shape == v.shape or not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"k, v: expected the shape and dtype of q {tuple(q.shape)} {q.dtype}, got k "
                         f"{tuple(k.shape)} {k.dtype} and v {tuple(v.shape)} {v.dtype}. The minimal kernels "
                         "take Nq = Nk and no GQA; flashlab.attention takes the rest.")
    n, head_dim = q.shape[2], q.shape[3]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"q: head dim D = {head_dim} must be a power of two ≥ 16 here (tl.dot's smallest tile). "
                         "flashlab.attention masks other head dims.")
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block < 16 or block & (block - 1):
            raise ValueError(f"{name}: {block} must be a power of two ≥ 16. Use 16, 32, 64 or 128.")
        if n % block:
            raise ValueError(f"{name}: N = {n} is not a multiple of {name} = {block}. Pad N, pick a block "
                             "that divides it, or use flashlab.attention (any N).")


def minimal_flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                          block_m: int = 32, block_n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(q kᵀ · scale) v`` by `minimal_forward_kernel`.

    q, k, v: (B, H, N, D), fp16 or fp32, N a multiple of both blocks, D a power of two ≥ 16.
    Returns ``(O, L)``: O like q, and L (B, H, N) float32, the base-2 log-sum-exp
    L_i = log2 Σ_j 2^(S_ij) with S in base-2 units (natural log: L · ln 2)."""
    _check(q, k, v, block_m, block_n)
    B, H, n, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else scale
    q, k, v = (t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty(B, H, n, dtype=torch.float32, device=q.device)
    kernel_for(minimal_forward_kernel, q.device)[(n // block_m, B * H)](q, k, v, out, lse, n, scale * LOG2E,
                                                  BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim)
    return out, lse


def minimal_flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           lse: torch.Tensor, grad_out: torch.Tensor, scale: float | None = None,
                           block_m: int = 32, block_n: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention from the forward's O and base-2 L, by `minimal_dkdv_kernel`
    (one program per key block) and `minimal_dq_kernel` (one program per query block).
    Same contract as `minimal_flash_forward`; ``grad_out`` = dO, shaped like ``out``."""
    _check(q, k, v, block_m, block_n)
    if out.shape != q.shape or grad_out.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError(f"out, grad_out, lse: expected shapes {tuple(q.shape)}, {tuple(q.shape)} and "
                         f"{tuple(q.shape[:3])}, got {tuple(out.shape)}, {tuple(grad_out.shape)} and "
                         f"{tuple(lse.shape)}. Pass what minimal_flash_forward returned and dO of its output.")
    B, H, n, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else scale
    q, k, v, grad_out = (t.contiguous() for t in (q, k, v, grad_out))
    lse = lse.float().contiguous()
    # D_i = rowsum(dO_i ∘ O_i): one elementwise product and a row sum (the production
    # backward does it in a small preprocess kernel; here PyTorch does it)
    delta = (grad_out.float() * out.float()).sum(-1).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    kwargs = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim)
    kernel_for(minimal_dkdv_kernel, q.device)[(n // block_n, B * H)](
        q, k, v, grad_out, lse, delta, dk, dv, n, scale * LOG2E, scale, **kwargs)
    kernel_for(minimal_dq_kernel, q.device)[(n // block_m, B * H)](
        q, k, v, grad_out, lse, delta, dq, n, scale * LOG2E, scale, **kwargs)
    return dq, dk, dv
