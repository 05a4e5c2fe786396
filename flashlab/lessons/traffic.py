"""HBM traffic models: how many bytes each step of attention reads from and writes to
the GPU's main memory (HBM).

On a GPU, a kernel whose arithmetic is cheap runs as fast as it can move bytes, so these
counts, divided by the memory bandwidth, predict its time. Three models:

- naive attention, op by op (each PyTorch op reads its inputs from HBM and writes its
  output back), forward and backward;
- softmax over the rows of a matrix, fused (one read, one write) or as PyTorch's separate
  ops;
- tiled attention, as `flashlab.reference.tiled` executes it, for any block sizes; with blocks
  sized for an on-chip memory of M bytes it moves Θ(N²·d²/M) bytes (FlashAttention,
  Theorem 2) against naive attention's Θ(N·d + N²).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashlab.reference.tiled import key_blocks

from .memory import dtype_bytes


@dataclass(frozen=True)
class Step:
    """One operation: its name, and the bytes it reads from and writes to HBM."""

    name: str
    bytes_read: int
    bytes_written: int

    @property
    def total(self) -> int:
        return self.bytes_read + self.bytes_written


def naive_attention_traffic(batch, heads, n_queries, head_dim, dtype=torch.float16,
                            n_keys=None, backward=False) -> list[Step]:
    """Bytes each op of `flashlab.naive_attention` moves (forward, or forward+backward).

    Sizes per (batch, head): Q, dO, O, dQ are Nq·d; K, V, dK, dV are Nk·d; S, P, dP, dS
    are Nq·Nk. Every op reads its operands from HBM and writes its result back.
    """
    n_keys = n_queries if n_keys is None else n_keys
    bh, b = batch * heads, dtype_bytes(dtype)
    q = bh * n_queries * head_dim * b
    kv = bh * n_keys * head_dim * b
    square = bh * n_queries * n_keys * b
    steps = [
        Step("Q·scale", q, q),
        Step("S = (Q·scale) Kᵀ", q + kv, square),
        Step("P = softmax(S)", square, square),
        Step("O = P V", square + kv, q),
    ]
    if backward:
        steps += [
            Step("dV = Pᵀ dO", square + q, kv),
            Step("dP = dO Vᵀ", q + kv, square),
            Step("dS = P ∘ (dP − rowsum(dP ∘ P))", 2 * square, square),
            Step("dQ = dS K · scale", square + kv, q),
            Step("dK = dSᵀ (Q·scale)", square + q, kv),
        ]
    return steps


def softmax_traffic(rows: int, cols: int, dtype=torch.float16, fused=True) -> list[Step]:
    """Bytes moved by softmax over the last dimension of a ``rows × cols`` matrix.

    Fused: one kernel reads x once and writes y once. Unfused, as separate PyTorch ops:
    max over rows, subtract, exp, sum over rows, divide: each a round trip through HBM.
    """
    b = dtype_bytes(dtype)
    matrix, vector = rows * cols * b, rows * b
    if fused:
        return [Step("fused softmax", matrix, matrix)]
    return [
        Step("m = x.amax(-1)", matrix, vector),
        Step("z = x − m", matrix + vector, matrix),
        Step("e = exp(z)", matrix, matrix),
        Step("l = e.sum(-1)", matrix, vector),
        Step("y = e / l", matrix + vector, matrix),
    ]


def tiled_forward_traffic(batch, heads, n_queries, head_dim, dtype=torch.float16, n_keys=None,
                          block_m=64, block_n=64, is_causal=False) -> dict[str, int]:
    """Exact bytes `flashlab.reference.tiled.tiled_attention_forward` loads and stores.

    Q and O (and the fp32 log-sum-exp) move once; every query block re-reads every key
    and value block it needs: ⌈Nq/block_m⌉ passes over K and V (fewer when causal).
    """
    n_keys = n_queries if n_keys is None else n_keys
    bh, b = batch * heads, dtype_bytes(dtype)
    lse_bytes = 8 if dtype == torch.float64 else 4
    kv_rows = 0
    for q_start in range(0, n_queries, block_m):
        q_end = min(q_start + block_m, n_queries)
        visited = key_blocks(q_start, q_end, n_keys, block_n, is_causal)
        # whole blocks up to the last one visited, which may be cut short by Nk
        kv_rows += min(n_keys, len(visited) * block_n)
    return {
        "read Q": bh * n_queries * head_dim * b,
        "read K, V": bh * kv_rows * 2 * head_dim * b,
        "write O": bh * n_queries * head_dim * b,
        "write L": bh * n_queries * lse_bytes,
    }


def blocks_for_onchip_memory(onchip_bytes: int, head_dim: int, dtype=torch.float16) -> tuple[int, int]:
    """Block sizes of FlashAttention's Algorithm 1 for on-chip memory of M bytes:
    B_c = ⌈M / (4d)⌉ key rows and B_r = min(B_c, d) query rows (M counted in elements)."""
    m_elements = onchip_bytes // dtype_bytes(dtype)
    if m_elements < 4 * head_dim:
        raise ValueError(f"onchip_bytes: {onchip_bytes} bytes cannot hold one row each of Q, K, V "
                         f"and O at head_dim={head_dim}; use at least {4 * head_dim * dtype_bytes(dtype)}.")
    block_n = math.ceil(m_elements / (4 * head_dim))
    return min(block_n, head_dim), block_n


def decode_traffic(batch, seqlen_q, heads, heads_k, head_dim, cache_len, dtype=torch.float16,
                   num_splits=1) -> list[Step]:
    """Bytes one `decode_attention` call moves through HBM (lower bound, every cache row read once):
    Q in and O out; K and V of every cached token, once per kv head (the group's query rows share
    the read); with splits, each split's fp32 partial (O_s, L_s) written and read back by the merge."""
    b = dtype_bytes(dtype)
    rows = batch * seqlen_q * heads
    steps = [Step("read Q, write O", rows * head_dim * b, rows * head_dim * b),
             Step("read K, V cache", 2 * batch * cache_len * heads_k * head_dim * b, 0)]
    if num_splits > 1:
        partial = rows * num_splits * (head_dim + 1) * 4
        steps.append(Step("split partials (O_s, L_s), fp32", partial, partial))
    return steps


def decode_flops(batch, seqlen_q, heads, head_dim, cache_len) -> int:
    """FLOPs of a decode step: S = Q Kᵀ and O = P V, 2·D multiply-adds each per (query, key) pair."""
    return 4 * batch * seqlen_q * heads * cache_len * head_dim
