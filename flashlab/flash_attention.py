"""The public attention API: a drop-in for ``torch.nn.functional.scaled_dot_product_attention``
backed by flashlab's Triton kernels, and an attention ``nn.Module`` built on it."""

from __future__ import annotations

import torch
from torch import nn

from . import runtime
from .checks import check_attention_inputs, default_scale
from .flash_launch import (
    KERNEL_DTYPES,
    MAX_HEAD_DIM,
    _input_precision,
    draw_dropout_seed,
    flash_backward,
    flash_forward,
)
from .naive import naive_attention
from .tiled import tiled_attention


class FlashAttentionFunction(torch.autograd.Function):
    """Runs the Triton kernels; saves q, k, v, O and the log-sum-exp for the backward
    (with dropout also the seed: the mask is regenerated, never stored)."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, dropout_p, seed, is_causal, scale, exact_fp32):
        input_precision = _input_precision(q, exact_fp32)
        out, lse = flash_forward(q, k, v, attn_mask, dropout_p, seed, is_causal, scale, input_precision)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.attn_mask, ctx.is_causal, ctx.scale, ctx.input_precision = attn_mask, is_causal, scale, input_precision
        ctx.dropout_p, ctx.seed = dropout_p, seed
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, out, lse, grad_out, ctx.attn_mask, ctx.dropout_p, ctx.seed,
                                    ctx.is_causal, ctx.scale, ctx.input_precision)
        return dq, dk, dv, None, None, None, None, None, None


def _check(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    check_attention_inputs(q, k, v, attn_mask, is_causal, scale, enable_gqa=enable_gqa)
    if q.dim() != 4:
        raise ValueError(f"q: expected 4 dimensions (batch, heads, N, D), got shape {tuple(q.shape)}. "
                         "Add the missing dimensions with unsqueeze.")
    if not enable_gqa and k.shape[1] != q.shape[1]:
        raise ValueError(f"k: has {k.shape[1]} heads but q has {q.shape[1]}. "
                         "Pass enable_gqa=True for grouped-query attention.")
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"v: head dimension {v.shape[-1]} differs from q's {q.shape[-1]}; "
                         "flashlab's kernels need equal head dimensions for q, k and v.")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"q: head dimension {q.shape[-1]} exceeds {MAX_HEAD_DIM}, the largest the "
                         "kernels keep on chip. Split the heads or use naive_attention.")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p: {dropout_p} is not a probability in [0, 1). "
                         "Pass the fraction of attention weights to drop, e.g. 0.1.")
    if dropout_p > 0 and q.shape[-2] * k.shape[-2] >= 2**31:
        raise ValueError(f"dropout_p: dropout needs Nq·Nk < 2³¹ (the RNG counter is int32); got "
                         f"Nq={q.shape[-2]}, Nk={k.shape[-2]}. Split the sequence or use dropout_p=0.0.")


def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              exact_fp32=False):
    """FlashAttention with the arguments and semantics of
    ``torch.nn.functional.scaled_dot_product_attention``.

    Args:
        q: ``(B, H, Nq, D)``; k, v: ``(B, H_kv, Nk, D)`` with ``H_kv = H`` (or dividing H
            with ``enable_gqa=True``). float16, bfloat16 or float32; D ≤ 256; any strides.
        attn_mask: broadcastable to ``(B, H, Nq, Nk)``; boolean (True = takes part) or float
            (added to the scores). Read tile by tile through its strides, never expanded.
        dropout_p: probability of dropping each attention weight (survivors are scaled by
            1/(1 − p)), as in SDPA: pass 0.0 in evaluation. The mask comes from an in-kernel
            Philox RNG seeded from torch's default generator (`draw_dropout_seed`) and is
            regenerated in the backward, never stored; `dropout_keep_mask` reproduces it.
        is_causal: query i sees keys 0..i (top-left aligned, like PyTorch). Key tiles
            entirely above the diagonal are skipped.
        scale: default ``1/sqrt(D)``.
        enable_gqa: grouped-query / multi-query attention.
        exact_fp32: for float32 inputs, use exact fp32 products instead of TF32 (tests).

    Returns:
        ``(B, H, Nq, D)``; rows with no key to attend to give zeros and zero gradients.

    Where it runs: CUDA tensors run the compiled Triton kernels. CPU tensors run the same
    kernels in Triton's interpreter when it is on (``TRITON_INTERPRET=1``, which
    ``import flashlab`` sets on a machine without a GPU); otherwise the PyTorch
    implementation (`tiled_attention`, or `naive_attention` for masks, GQA and dropout,
    where dropout then draws its mask with ``torch.nn.functional.dropout``).
    """
    _check(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    scale = default_scale(q.shape[-1], scale)
    dropout_p = float(dropout_p)
    if q.device.type == "cuda" or runtime.triton_interpreted():
        if q.dtype not in KERNEL_DTYPES:
            raise ValueError(f"q: dtype {q.dtype} is not supported by the kernels; "
                             "use float16, bfloat16 or float32.")
        if q.device.type not in ("cuda", "cpu"):
            raise ValueError(f"q: device {q.device} is not supported; use a CUDA or CPU tensor.")
        seed = draw_dropout_seed() if dropout_p > 0 else 0
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return FlashAttentionFunction.apply(q, k, v, attn_mask, dropout_p, seed, is_causal, scale, exact_fp32)
        # no gradient wanted (inference, the TSP baseline's rollouts): skip autograd's bookkeeping,
        # about a quarter of the Python time of a small call
        return flash_forward(q, k, v, attn_mask, dropout_p, seed, is_causal, scale, _input_precision(q, exact_fp32))[0]
    group = q.shape[1] // k.shape[1]
    if attn_mask is None and group == 1 and dropout_p == 0:
        return tiled_attention(q, k, v, is_causal=is_causal, scale=scale)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return naive_attention(q, k, v, attn_mask, is_causal, scale, dropout_p=dropout_p)


class MultiHeadAttention(nn.Module):
    """Self-attention with a fused QKV projection, heads and an output projection, on
    `flashlab.attention`.

    Args:
        embed_dim: model width; ``num_heads`` must divide it.
        num_heads: attention heads.
        causal: apply a causal mask (for decoders).
        bias: biases in the projections.
        dropout: attention-weight dropout probability, applied only in training mode.
    Input ``(B, N, embed_dim)`` → output ``(B, N, embed_dim)``. ``forward`` also takes an
    optional ``attn_mask`` broadcastable to ``(B, H, N, N)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False, bias: bool = True,
                 dropout: float = 0.0, attention_fn=attention):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"num_heads: {num_heads} does not divide embed_dim={embed_dim}.")
        self.num_heads, self.head_dim, self.causal = num_heads, embed_dim // num_heads, causal
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.attention_fn, self.dropout = attention_fn, dropout

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, N, _ = x.shape
        # one matmul for q, k and v; (B, N, 3, H, D) → three (B, H, N, D) views, no copies
        q, k, v = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = self.attention_fn(q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0,
                              is_causal=self.causal and attn_mask is None)
        return self.out(y.transpose(1, 2).reshape(B, N, -1))
