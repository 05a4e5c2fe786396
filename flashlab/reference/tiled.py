"""Tiled attention in PyTorch: FlashAttention's algorithm without a GPU kernel.

Forward (the FlashAttention-2 loop order). For each block of ``block_m`` queries Q_i,
stream the key/value blocks K_j, V_j of ``block_n`` rows and keep, per query row, the
online-softmax state (m, l) and an unnormalised output accumulator:

    S_ij = Q_i K_jᵀ · scale                       (block_m × block_n, on chip)
    m'   = max(m, rowmax S_ij)
    P̃_ij = exp(S_ij − m')
    l'   = l · exp(m − m') + rowsum P̃_ij
    acc' = acc · exp(m − m') + P̃_ij V_j
    …after the last block:  O_i = acc / l,   L_i = m + log l   (the log-sum-exp)

Only O and L (one number per query) are written; no Nq × Nk tensor ever exists.

Backward with recomputation. With D_i = rowsum(dO_i ∘ O_i), every tile recomputes

    P_ij  = exp(S_ij − L_i)                       (exact softmax, from the saved L)
    dV_j += P_ijᵀ dO_i
    dP_ij = dO_i V_jᵀ
    dS_ij = P_ij ∘ (dP_ij − D_i)
    dQ_i += dS_ij K_j · scale,    dK_j += dS_ijᵀ Q_i · scale

Causal (top-left aligned, as in PyTorch): key block j is skipped entirely when its first
key lies after the last query of block i; only tiles that cross the diagonal are masked.

Pass an ``observer`` (see `flashlab.lessons.instrument`) to count the HBM bytes each tile moves or
to record the running state for the tile stepper.
"""

from __future__ import annotations

import torch

from .checks import check_attention_inputs, default_scale
from .first_order import first_order_only
from .online_softmax import safe_shift


class TileObserver:
    """Hooks a tiled run calls; the base class ignores them (see `flashlab.lessons.instrument`)."""

    def read(self, name: str, tile: torch.Tensor) -> None:
        """``tile`` was loaded from HBM (its bytes count as read traffic)."""

    def write(self, name: str, tile: torch.Tensor) -> None:
        """``tile`` was stored to HBM."""

    def tile(self, **state) -> None:
        """One (query block, key block) step of the forward finished."""


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    # Softmax statistics and accumulators in fp32 (fp64 for fp64 inputs): fp16/bf16
    # would lose the small terms of the running sums.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_blocks(block_m, block_n):
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name}: expected a positive integer, got {value!r}. "
                             "Use a tile size such as 16, 32 or 64.")


def key_blocks(q_start: int, q_end: int, n_keys: int, block_n: int, is_causal: bool) -> range:
    """Start indices of the key blocks that query rows [q_start, q_end) must visit.

    Causal, top-left aligned: the last query q_end − 1 sees keys 0..q_end − 1, so blocks
    starting at or after q_end are fully masked and skipped."""
    end = min(n_keys, q_end) if is_causal else n_keys
    return range(0, end, block_n)


def _causal_tile(scores, q_start, k_start, is_causal):
    """Mask the part of a tile above the diagonal with −inf (only if the tile crosses it)."""
    rows, cols = scores.shape[-2:]
    if not is_causal or k_start + cols - 1 <= q_start:
        return scores  # tile entirely on or below the diagonal: nothing to mask
    q_idx = torch.arange(q_start, q_start + rows, device=scores.device)[:, None]
    k_idx = torch.arange(k_start, k_start + cols, device=scores.device)[None, :]
    return scores.masked_fill(k_idx > q_idx, float("-inf"))


def tiled_attention_forward(q, k, v, is_causal=False, scale=None, block_m=64, block_n=64,
                            observer: TileObserver | None = None):
    """Tiled forward: returns ``(O, L)`` with O ``(..., Nq, Dv)`` in q's dtype and the
    log-sum-exp L ``(..., Nq)`` in fp32 (fp64 for fp64 inputs)."""
    check_attention_inputs(q, k, v, None, is_causal, scale)
    _check_blocks(block_m, block_n)
    return _tiled_forward(q, k, v, is_causal, scale, block_m, block_n, observer)


def _tiled_forward(q, k, v, is_causal, scale, block_m, block_n, observer=None):
    """`tiled_attention_forward` on inputs already validated."""
    obs = observer or TileObserver()
    scale = default_scale(q.shape[-1], scale)
    acc_dtype = _accumulator_dtype(q.dtype)
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=acc_dtype, device=q.device)

    for q_start in range(0, n_queries, block_m):
        q_end = min(q_start + block_m, n_queries)
        q_tile = q[..., q_start:q_end, :]
        obs.read("Q", q_tile)
        q_tile = q_tile.to(acc_dtype) * scale
        m = torch.full(q_tile.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros(*q_tile.shape[:-1], v.shape[-1], dtype=acc_dtype, device=q.device)
        for k_start in key_blocks(q_start, q_end, n_keys, block_n, is_causal):
            k_tile, v_tile = k[..., k_start:k_start + block_n, :], v[..., k_start:k_start + block_n, :]
            obs.read("K", k_tile)
            obs.read("V", v_tile)
            scores = q_tile @ k_tile.to(acc_dtype).transpose(-1, -2)         # S_ij = Q_i K_jᵀ·scale
            scores = _causal_tile(scores, q_start, k_start, is_causal)
            m_new = torch.maximum(m, scores.amax(dim=-1))                    # m' = max(m, rowmax S)
            shift = safe_shift(m_new)
            p = torch.exp(scores - shift[..., None])                        # P̃ = exp(S − m')
            alpha = torch.exp(m - shift)                                     # exp(m − m')
            l = l * alpha + p.sum(dim=-1)                                    # l' = l·α + rowsum P̃  # noqa: E741
            acc = acc * alpha[..., None] + p @ v_tile.to(acc_dtype)          # acc' = acc·α + P̃ V_j
            m = m_new
            obs.tile(q_start=q_start, k_start=k_start, m=m, l=l, acc=acc, scores=scores)
        # O_i = acc / l; rows that saw no key (l = 0) give 0 rather than 0/0
        o_tile = torch.where(l[..., None] > 0, acc / l.clamp_min(torch.finfo(acc_dtype).tiny)[..., None], 0.0)
        out[..., q_start:q_end, :] = o_tile.to(q.dtype)
        lse[..., q_start:q_end] = m + torch.log(l)                           # L_i = m + log l
        obs.write("O", out[..., q_start:q_end, :])
        obs.write("L", lse[..., q_start:q_end])
    return out, lse


def tiled_attention_backward(q, k, v, out, lse, grad_out, is_causal=False, scale=None,
                             block_m=64, block_n=64, observer: TileObserver | None = None):
    """Tiled backward with recomputation: ``(dQ, dK, dV)`` from q, k, v, O, L and dO."""
    _check_blocks(block_m, block_n)
    obs = observer or TileObserver()
    scale = default_scale(q.shape[-1], scale)
    acc_dtype = _accumulator_dtype(q.dtype)
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    grad_q = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    grad_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    grad_v = torch.empty(v.shape, dtype=v.dtype, device=v.device)

    # D_i = rowsum(dO_i ∘ O_i) = rowsum(P_i ∘ dP_i): one number per query, computed once
    delta = (grad_out.to(acc_dtype) * out.to(acc_dtype)).sum(dim=-1)
    obs.read("dO", grad_out)
    obs.read("O", out)
    obs.write("delta", delta)

    for k_start in range(0, n_keys, block_n):            # K_j, V_j stay on chip
        k_end = min(k_start + block_n, n_keys)
        k_tile, v_tile = k[..., k_start:k_end, :], v[..., k_start:k_end, :]
        obs.read("K", k_tile)
        obs.read("V", v_tile)
        k_tile, v_tile = k_tile.to(acc_dtype), v_tile.to(acc_dtype)
        dk = torch.zeros_like(k_tile)
        dv = torch.zeros_like(v_tile)
        # causal: query blocks that end before this key block starts see none of it
        first_q = (k_start // block_m) * block_m if is_causal else 0
        for q_start in range(first_q, n_queries, block_m):
            q_end = min(q_start + block_m, n_queries)
            q_tile, do_tile = q[..., q_start:q_end, :], grad_out[..., q_start:q_end, :]
            for name, t in (("Q", q_tile), ("dO", do_tile), ("L", lse[..., q_start:q_end]),
                            ("delta", delta[..., q_start:q_end])):
                obs.read(name, t)
            q_tile, do_tile = q_tile.to(acc_dtype), do_tile.to(acc_dtype)
            scores = (q_tile * scale) @ k_tile.transpose(-1, -2)             # S_ij, recomputed
            scores = _causal_tile(scores, q_start, k_start, is_causal)
            p = torch.exp(scores - safe_shift(lse[..., q_start:q_end])[..., None])  # P_ij = exp(S − L)
            dv += p.transpose(-1, -2) @ do_tile                              # dV_j += P_ijᵀ dO_i
            dp = do_tile @ v_tile.transpose(-1, -2)                          # dP_ij = dO_i V_jᵀ
            ds = p * (dp - delta[..., q_start:q_end, None])                  # dS = P ∘ (dP − D_i)
            grad_q[..., q_start:q_end, :] += (ds @ k_tile) * scale           # dQ_i += dS K_j·scale
            dk += (ds.transpose(-1, -2) @ q_tile) * scale                    # dK_j += dSᵀ Q_i·scale
            obs.read("dQ", grad_q[..., q_start:q_end, :])                   # dQ_i read-modify-write
            obs.write("dQ", grad_q[..., q_start:q_end, :])
        grad_k[..., k_start:k_end, :] = dk.to(k.dtype)
        grad_v[..., k_start:k_end, :] = dv.to(v.dtype)
        obs.write("dK", grad_k[..., k_start:k_end, :])
        obs.write("dV", grad_v[..., k_start:k_end, :])
    return grad_q.to(q.dtype), grad_k, grad_v


class TiledAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: saves only q, k, v, O and the log-sum-exp L for the backward."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, block_m, block_n):
        out, lse = _tiled_forward(q, k, v, is_causal, scale, block_m, block_n)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (is_causal, scale, block_m, block_n)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        with torch.no_grad():      # a graph through this loop would be wrong: O and L are constants here
            grads = tiled_attention_backward(q, k, v, out, lse, grad_out.contiguous(), *ctx.config)
        return (*first_order_only(grads, (q, k, v)), None, None, None, None)


def tiled_attention(q, k, v, is_causal=False, scale=None, block_m=64, block_n=64):
    """Attention computed tile by tile, differentiable, never forming an Nq × Nk tensor.

    Args:
        q ``(..., Nq, D)``, k ``(..., Nk, D)``, v ``(..., Nk, Dv)``; ``is_causal``
        (top-left aligned like PyTorch's SDPA); ``scale`` (default 1/sqrt(D));
        ``block_m`` query rows and ``block_n`` key rows per tile (any N, the last tile
        may be partial).
    Returns:
        ``(..., Nq, Dv)`` in q's dtype; the backward recomputes P tile by tile.
    """
    check_attention_inputs(q, k, v, None, is_causal, scale)
    _check_blocks(block_m, block_n)
    return TiledAttentionFunction.apply(q, k, v, is_causal, scale, block_m, block_n)


def tiled_attention_unchecked(q, k, v, is_causal=False, scale=None, block_m=64, block_n=64):
    """`tiled_attention` for callers that validated the inputs already (`flashlab.attention`):
    inputs are checked once, at the public entry point."""
    return TiledAttentionFunction.apply(q, k, v, is_causal, scale, block_m, block_n)
