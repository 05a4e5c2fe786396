"""Triton's programming model on the first step of attention: S = Q Kᵀ · scale, by tiles.

A Triton kernel is a function run by many *programs* at once (a grid, like CUDA's thread
blocks). Each program works on *blocks*: whole tiles of values loaded from memory with one
``tl.load``, combined with block operations (``tl.dot`` is a tile matmul on tensor cores),
written with one ``tl.store``. Where a tile hangs over the edge of a tensor, a boolean
*mask* says which lanes are real: masked loads return ``other``, masked stores write nothing.

`scores_kernel` is the smallest kernel with all four ideas; notebook 05 runs it and draws
which program wrote which tile, before building the flash-attention forward from it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for


@triton.jit
def scores_kernel(Q, K, S, OWNER, n_q, n_k, head_dim, scale,
                  sqm, sqd, skn, skd, ssm, ssn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (i, j) computes the tile S[i·BLOCK_M : (i+1)·BLOCK_M, j·BLOCK_N : (j+1)·BLOCK_N]."""
    pid_m = tl.program_id(0)                               # which query block
    pid_n = tl.program_id(1)                               # which key block
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)       # the BLOCK_M row indices this program owns
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    # masks: rows past n_q, keys past n_k and head-dim lanes past head_dim are not real
    q_ok = (offs_m < n_q)[:, None] & (offs_d < head_dim)[None, :]
    k_ok = (offs_n < n_k)[:, None] & (offs_d < head_dim)[None, :]
    # one load brings a whole (BLOCK_M, BLOCK_D) tile from HBM into registers
    q = tl.load(Q + offs_m[:, None] * sqm + offs_d[None, :] * sqd, mask=q_ok, other=0.0)
    k = tl.load(K + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=k_ok, other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale                     # (BLOCK_M, BLOCK_N) on tensor cores
    out_ok = (offs_m < n_q)[:, None] & (offs_n < n_k)[None, :]
    tl.store(S + offs_m[:, None] * ssm + offs_n[None, :] * ssn, s, mask=out_ok)
    owner = tl.zeros([BLOCK_M, BLOCK_N], tl.int32) + pid_m * tl.num_programs(1) + pid_n
    tl.store(OWNER + offs_m[:, None] * ssm + offs_n[None, :] * ssn, owner, mask=out_ok)


def scores_by_tiles(q: torch.Tensor, k: torch.Tensor, block_m: int = 32, block_n: int = 32,
                    scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """S = q kᵀ · scale for one head (``q (Nq, D)``, ``k (Nk, D)``) by a grid of programs.

    Returns ``(S, owner)``: S in float32, and for every entry the number of the program
    that wrote it (row-major over the grid), to draw the grid."""
    if q.dim() != 2 or k.dim() != 2 or q.shape[1] != k.shape[1]:
        raise ValueError(f"q, k: expected (Nq, D) and (Nk, D) with the same D, got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}.")
    n_q, head_dim = q.shape
    n_k = k.shape[0]
    scale = head_dim**-0.5 if scale is None else scale
    s = torch.empty(n_q, n_k, dtype=torch.float32, device=q.device)
    owner = torch.empty(n_q, n_k, dtype=torch.int32, device=q.device)
    grid = (triton.cdiv(n_q, block_m), triton.cdiv(n_k, block_n))
    kernel_for(scores_kernel, q.device)[grid](
        q, k, s, owner, n_q, n_k, head_dim, scale, *q.stride(), *k.stride(), *s.stride(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(head_dim)))
    return s, owner
