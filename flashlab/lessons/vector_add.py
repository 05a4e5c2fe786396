"""The first Triton kernel: add two vectors, one block of elements per program.

A Triton kernel runs as a grid of *programs*. Program p owns the ``BLOCK`` consecutive
elements starting at ``p·BLOCK``: it loads them with one ``tl.load`` per input, adds them,
and writes them with one ``tl.store``. When n is not a multiple of ``BLOCK`` the last
program hangs over the end, so a boolean *mask* (offset < n) says which lanes are real:
masked loads read nothing, masked stores write nothing. Exercise 00 (notebook 00) has you
write this kernel; on a CPU it runs in Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = x[i] + y[i] for the BLOCK elements of program ``tl.program_id(0)``, i < n."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)    # this program's element indices
    inside = offsets < n                                         # lanes past the end are not real
    x = tl.load(x_ptr + offsets, mask=inside)
    y = tl.load(y_ptr + offsets, mask=inside)
    tl.store(out_ptr + offsets, x + y, mask=inside)


def vector_add(x: torch.Tensor, y: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """x + y for two contiguous 1-D tensors of the same shape, dtype and device, by
    ``cdiv(n, block)`` programs of `add_kernel`; ``block`` a power of two."""
    if x.dim() != 1 or y.shape != x.shape:
        raise ValueError(f"y: expected the same 1-D shape as x, got x {tuple(x.shape)} and y {tuple(y.shape)}; "
                         "flatten them or pass tensors of equal length.")
    if y.dtype != x.dtype or y.device != x.device:
        raise ValueError(f"y: dtype/device {y.dtype}/{y.device} differ from x's {x.dtype}/{x.device}; convert one.")
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError("x, y: the kernel walks memory element by element; pass .contiguous() tensors.")
    if block < 1 or block & (block - 1):
        raise ValueError(f"block: {block} is not a power of two (tl.arange needs one); use e.g. 128 or 1024.")
    out = torch.empty_like(x)
    n = x.numel()
    kernel_for(add_kernel, x.device)[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
    return out
