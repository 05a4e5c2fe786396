"""A fused row softmax in Triton: one read of x, one write of y.

PyTorch's softmax as separate ops (max, subtract, exp, sum, divide) sends the matrix
through HBM five times; `torch.softmax` is already one fused kernel. This kernel shows
how such fusion is written: each program loads one whole row into registers, computes

    m = max_j x_j,   e_j = exp(x_j − m),   y_j = e_j / Σ_j e_j

on chip in fp32, and stores the row once. Rows of any length up to ``MAX_COLS`` are
handled by masking the columns past the end of the row (loaded as −inf, never stored).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for

MAX_COLS = 65536  # one row must fit in one program's registers/shared memory
SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)                      # one program per row
    cols = tl.arange(0, BLOCK)                  # BLOCK ≥ n_cols, a power of two
    inside = cols < n_cols                      # mask the padding columns of the block
    # read the row once (HBM → registers); padding reads as −inf so it adds exp(−inf) = 0
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)                       # m = max_j x_j
    m = tl.where(m == -float("inf"), 0.0, m)    # a row of only −inf: avoid (−inf) − (−inf)
    e = tl.exp(x - m)                           # e_j = exp(x_j − m) ≤ 1: cannot overflow
    total = tl.sum(e, axis=0)                   # l = Σ_j e_j
    y = e / tl.where(total > 0, total, 1.0)     # all −inf row: e = 0, so y = 0, not 0/0
    # write the row once (registers → HBM), in the output's dtype
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=inside)


def fused_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of ``x`` with the fused Triton kernel.

    Args:
        x: ``(..., n_cols)`` float16, bfloat16 or float32, ``n_cols ≤ 65536``; on a CUDA
            device (compiled kernel) or on the CPU (the same kernel in Triton's interpreter).
    Returns:
        A tensor like ``x`` (same dtype); rows of only −inf give zeros.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: expected a torch.Tensor, got {type(x).__name__}.")
    if x.dtype not in SUPPORTED:
        raise ValueError(f"x: dtype {x.dtype} is not supported; use float16, bfloat16 or float32.")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x: needs a non-empty last dimension, got shape {tuple(x.shape)}.")
    if x.shape[-1] > MAX_COLS:
        raise ValueError(f"x: rows of {x.shape[-1]} columns exceed {MAX_COLS}; "
                         "use flashlab.reference.online_softmax for longer rows.")
    if x.device.type not in ("cuda", "cpu"):
        raise ValueError(f"x: is on {x.device}; the kernel runs on CUDA tensors (compiled) or CPU "
                         "tensors (Triton's interpreter). Move it with x.cuda() or x.cpu().")
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty_like(rows)
    block = triton.next_power_of_2(rows.shape[1])
    num_warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    kernel_for(softmax_kernel, x.device)[(rows.shape[0],)](rows, out, rows.shape[1], rows.stride(0), out.stride(0),
                                                           BLOCK=block, num_warps=num_warps)
    return out.reshape(x.shape)
