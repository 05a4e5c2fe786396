"""The public attention API: a drop-in for ``torch.nn.functional.scaled_dot_product_attention``
backed by flashlab's Triton kernels, and an attention ``nn.Module`` built on it."""

from __future__ import annotations

import functools

import torch
from torch import nn

from . import autotune, runtime
from .checks import check_attention_inputs, default_scale
from .flash_triton import (
    LOG2E,
    dropout_mask_kernel,
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_backward_preprocess_kernel,
    flash_forward_kernel,
)
from .naive import naive_attention
from .tiled import tiled_attention

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def _cdiv(a: int, b: int) -> int:
    """⌈a / b⌉. Plain Python: triton.cdiv goes through Triton's JIT call machinery (about 7 µs
    a call on this course's CPU), and small attention calls are launch-bound."""
    return -(-a // b)


def _block_d(head_dim: int) -> int:
    """Head dimension padded to a power of two ≥ 16 (tl.dot needs ≥ 16; the mask hides the padding)."""
    return max(16, 1 << (head_dim - 1).bit_length())


@functools.cache
def _capability(device: torch.device) -> tuple[int, int] | None:
    """The GPU's compute capability, or None under Triton's interpreter (CPU tensors)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


PREPROCESS_BLOCK = {True: 64, False: 32}   # rows per program of D = rowsum(dO ∘ O): GPU, interpreter


def _mask_args(attn_mask, q, k):
    """The mask as the kernels read it: expanded (stride 0, no copy) to (B, H, Nq, Nk)."""
    B, H, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if attn_mask is None:
        return q, (0, 0, 0, 0), False, False  # any pointer: HAS_MASK=False never reads it
    mask = attn_mask.expand(B, H, n_q, n_k)
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)  # same bytes; Triton reads uint8 more portably than i1
    return mask, mask.stride(), True, attn_mask.dtype == torch.bool


def draw_dropout_seed() -> int:
    """The Philox seed of one dropout call, drawn from torch's default CPU generator, so
    ``torch.manual_seed`` makes flashlab's dropout reproducible."""
    return int(torch.randint(0, 2**31 - 1, ()).item())


def dropout_keep_mask(seed: int, batch: int, heads: int, n_q: int, n_k: int, dropout_p: float,
                      device="cpu") -> torch.Tensor:
    """The boolean (batch, heads, Nq, Nk) keep mask Z that the kernels generate for ``seed``:
    True where an attention weight survives. The kernels never store it; this exists so tests
    (and the notebook) can check dropout exactly: O = (P ∘ Z / (1 − p)) V."""
    keep = torch.empty(batch, heads, n_q, n_k, dtype=torch.uint8, device=device)
    block = 64 if torch.device(device).type == "cuda" else 32   # small grids for the interpreter
    grid = (_cdiv(n_q, block), _cdiv(n_k, block), batch * heads)
    dropout_mask_kernel[grid](keep, seed, n_q, n_k, dropout_p, BLOCK_M=block, BLOCK_N=block)
    return keep.bool()


def _tuned_launch(kernel, q, k, is_causal, has_mask, dropout, launch):
    """Runs ``launch(config)`` with the configuration the autotuner picks for this shape
    (on the first call of a shape it tries every candidate, then remembers the fastest)."""
    configs = autotune.candidates(kernel, q.shape[-1], _capability(q.device))
    key = autotune.shape_key(kernel, q, k, is_causal, has_mask, dropout)
    launch(autotune.tuner.choose(key, configs, launch))


def _precision(q, exact_fp32: bool) -> str:
    return "ieee" if exact_fp32 or q.dtype != torch.float32 else "tf32"


def flash_forward(q, k, v, attn_mask, dropout_p, seed, is_causal, scale, precision):
    """The forward kernel alone: returns O and the base-2 log-sum-exp L (what the backward needs)."""
    B, H, n_q, head_dim = q.shape
    n_k, group = k.shape[2], H // k.shape[1]
    out = torch.empty(B, H, n_q, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
    mask, mask_strides, has_mask, mask_is_bool = _mask_args(attn_mask, q, k)

    def launch(config):
        grid = (_cdiv(n_q, config.block_m) * B * H,)         # 1-D: see the kernel
        flash_forward_kernel[grid](
            q, k, v, mask, out, lse, *q.stride(), *k.stride(), *v.stride(), *mask_strides,
            *out.stride(), lse.stride(0), lse.stride(1),
            H, n_q, n_k, head_dim, group, scale * LOG2E, seed, dropout_p,
            IS_CAUSAL=is_causal, HAS_MASK=has_mask, MASK_IS_BOOL=mask_is_bool, DROPOUT=dropout_p > 0,
            EVEN_D=head_dim == _block_d(head_dim), BLOCK_D=_block_d(head_dim), INPUT_PRECISION=precision,
            **config.kwargs())
        return out, lse

    _tuned_launch("forward", q, k, is_causal, has_mask, dropout_p > 0, launch)
    return out, lse


class FlashAttentionFunction(torch.autograd.Function):
    """Runs the Triton kernels; saves q, k, v, O and the log-sum-exp for the backward
    (with dropout also the seed: the mask is regenerated, never stored)."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, dropout_p, seed, is_causal, scale, exact_fp32):
        precision = _precision(q, exact_fp32)
        out, lse = flash_forward(q, k, v, attn_mask, dropout_p, seed, is_causal, scale, precision)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.attn_mask, ctx.is_causal, ctx.scale, ctx.precision = attn_mask, is_causal, scale, precision
        ctx.dropout_p, ctx.seed = dropout_p, seed
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        B, H, n_q, head_dim = q.shape
        H_kv, n_k = k.shape[1], k.shape[2]
        group = H // H_kv
        block_d = _block_d(head_dim)
        delta = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
        rows = PREPROCESS_BLOCK[q.device.type == "cuda"]
        flash_backward_preprocess_kernel[(_cdiv(n_q, rows) * B * H,)](
            out, grad_out, delta, *out.stride(), *grad_out.stride(), H, n_q, head_dim,
            BLOCK_M=rows, BLOCK_D=block_d)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        mask, mask_strides, has_mask, mask_is_bool = _mask_args(ctx.attn_mask, q, k)
        common = dict(IS_CAUSAL=ctx.is_causal, HAS_MASK=has_mask, MASK_IS_BOOL=mask_is_bool,
                      DROPOUT=ctx.dropout_p > 0, EVEN_D=head_dim == block_d, BLOCK_D=block_d,
                      INPUT_PRECISION=ctx.precision)
        strides = (*q.stride(), *k.stride(), *v.stride(), *mask_strides, *grad_out.stride(),
                   lse.stride(0), lse.stride(1))

        def launch_dkdv(config):
            flash_backward_dkdv_kernel[(_cdiv(n_k, config.block_n) * B * H_kv,)](
                q, k, v, mask, grad_out, lse, delta, dk, dv, *strides, *dk.stride(), *dv.stride(),
                H_kv, H, n_q, n_k, head_dim, group, ctx.scale * LOG2E, ctx.scale, ctx.seed, ctx.dropout_p,
                FAST_PATH=config.fast_path, **common, **config.kwargs())
            return dk, dv

        def launch_dq(config):
            flash_backward_dq_kernel[(_cdiv(n_q, config.block_m) * B * H,)](
                q, k, v, mask, grad_out, lse, delta, dq, *strides, *dq.stride(),
                H, n_q, n_k, head_dim, group, ctx.scale * LOG2E, ctx.scale, ctx.seed, ctx.dropout_p,
                **common, **config.kwargs())
            return (dq,)

        dropout = ctx.dropout_p > 0
        _tuned_launch("dkdv", q, k, ctx.is_causal, has_mask, dropout, launch_dkdv)
        _tuned_launch("dq", q, k, ctx.is_causal, has_mask, dropout, launch_dq)
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
        return flash_forward(q, k, v, attn_mask, dropout_p, seed, is_causal, scale, _precision(q, exact_fp32))[0]
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
