"""Exercise 00, reference answer: vector addition in Triton (as `flashlab/lessons/vector_add.py`)."""

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for  # compiled for CUDA tensors, Triton's interpreter for CPU ones


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = x[i] + y[i] for the elements of program ``tl.program_id(0)``."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n                                  # the last program may hang over the end
    x = tl.load(x_ptr + offsets, mask=inside)
    y = tl.load(y_ptr + offsets, mask=inside)
    tl.store(out_ptr + offsets, x + y, mask=inside)


def vector_add(x: torch.Tensor, y: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Return x + y, computed by `add_kernel`."""
    if y.shape != x.shape:
        raise ValueError(f"y: shape {tuple(y.shape)} differs from x's {tuple(x.shape)}; pass equal lengths.")
    out = torch.empty_like(x)
    n = x.numel()
    kernel_for(add_kernel, x.device)[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)   # ceil(n / block) programs
    return out
