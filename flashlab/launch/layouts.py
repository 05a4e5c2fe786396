"""Memory layouts of attention's tensors: the layout of the output O, one rule for every path (the
small, general and Hopper kernels, the custom op's fake), and q, k, v as views of one packed
(B, N, 3, H, D) projection (`unpack_qkv`)."""

from __future__ import annotations

import torch
from torch import Tensor


def output_like(q: Tensor, value_dim: int | None = None, dtype: torch.dtype | None = None) -> Tensor:
    """An empty O for (B, H, Nq, D) ``q``, laid out as every path and the op's fake lay it out.

    When q's heads lie closer together in memory than its rows (``q.stride(1) < q.stride(2)``:
    a (B, N, H·D) projection viewed as heads and transposed, as attention layers pass q), O is
    (B, Nq, H, Dv) in memory, seen as (B, H, Nq, Dv), as SDPA's flash backend returns it: the
    layer's next step, ``o.transpose(1, 2).reshape(B, N, H·Dv)``, is then a view instead of a copy
    (one read and one write of O per layer). Otherwise O is contiguous (B, H, Nq, Dv).
    The kernels take O's strides, so either layout is one launch; the fake must say the same
    strides as the real op, or a compiled graph stops at the op's output (Inductor checks).
    (With Dv ≠ D, `flashlab.attention` pads q and k, or v, to one width, contiguous, and slices
    O back: merging heads copies there.)"""
    shape, strides = output_layout(q, value_dim)
    return torch.empty_strided(shape, strides, dtype=dtype or q.dtype, device=q.device)


def output_layout(q: Tensor, value_dim: int | None = None) -> tuple[tuple, tuple]:
    """`output_like`'s (shape, strides), for launchers that keep them per call signature."""
    B, H, n_q, head_dim = q.shape
    dv = head_dim if value_dim is None else value_dim
    if q.stride(1) < q.stride(2):                   # (B, Nq, H, Dv) in memory
        return (B, H, n_q, dv), (n_q * H * dv, dv, H * dv, 1)
    return (B, H, n_q, dv), (H * n_q * dv, n_q * dv, dv, 1)


def unpack_qkv(qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(B, N, 3, H, D) → q, k, v as (B, H, N, D) views (no copies): `flashlab.attention_qkvpacked`'s
    inputs as the kernels take them, and its gradient's three parts as they write them."""
    q, k, v = qkv.unbind(2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
