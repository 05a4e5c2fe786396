"""The tiled Triton kernels of notebooks 05 and 06, called directly.

`flashlab.attention` picks its kernels per call: a short sequence takes the small path (one key
tile, one launch each way), a Hopper GPU the Hopper kernels. The notebooks teach the tiled
kernels (`flashlab.kernels.dense`) and check them here, at sizes a CPU runs in seconds, which
would otherwise take the small path:

    out = tiled_kernel_attention(q, k, v, is_causal=True)      # (B, H, N, D), differentiable

Same arguments as `flashlab.attention` for 4-D inputs with as many k/v heads as q heads (or GQA
by fewer), no broadcasting; half-precision CPU inputs are computed in fp32, as the interpreter's
half-precision arithmetic is not a GPU's.
"""

from __future__ import annotations

import torch

from flashlab.launch import dense
from flashlab.launch.masks import mask_args
from flashlab.launch.runtime import input_precision
from flashlab.launch.spec import AttentionSpec
from flashlab.reference.checks import check_attention_inputs, check_softcap, check_window, default_scale


class _TiledKernels(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, attn_mask, spec: AttentionSpec, seed: int):
        mask = mask_args(attn_mask, q, k)
        out, lse = dense.forward(q, k, v, mask, spec, seed)
        ctx.save_for_backward(q, k, v, out, lse, attn_mask)
        ctx.spec, ctx.seed = spec, seed
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, attn_mask = ctx.saved_tensors
        grads = dense.backward(q, k, v, out, lse, dense.rows_contiguous(grad_out), mask_args(attn_mask, q, k),
                               ctx.spec, ctx.seed)
        return *grads, None, None, None


def tiled_kernel_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, window=None,
                           softcap=None) -> torch.Tensor:
    """Attention of (B, H, N, D) q, k, v by the tiled forward kernel and, for gradients, the tiled
    dK/dV and dQ kernels; the options as `flashlab.attention`'s."""
    check_attention_inputs(q, k, v, attn_mask, is_causal, scale, enable_gqa=k.shape[1] != q.shape[1])
    check_window(window)
    window = None if window is None or tuple(window) == (-1, -1) else tuple(window)
    spec = AttentionSpec(default_scale(q.shape[-1], scale), is_causal, window, check_softcap(softcap),
                         float(dropout_p), input_precision(q.dtype, q.device))
    seed = dense.draw_dropout_seed() if dropout_p > 0 else 0
    half_on_cpu = q.is_cpu and q.dtype in (torch.float16, torch.bfloat16)
    inputs = [dense.rows_contiguous(t.float() if half_on_cpu else t) for t in (q, k, v)]
    mask = attn_mask.float() if half_on_cpu and attn_mask is not None and attn_mask.is_floating_point() else attn_mask
    out = _TiledKernels.apply(*inputs, mask, spec, seed)
    return out.to(q.dtype)
