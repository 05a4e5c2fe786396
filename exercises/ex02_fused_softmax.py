"""Exercise 02: a fused row-softmax kernel in Triton (notebook 02_kernel_fusion).

Write the kernel so that each program reads one row of x from HBM exactly once and
writes one row of y exactly once, computing max, exp, sum and divide on chip.

Test (runs in Triton's interpreter on a CPU): ``make test-ex EX=02``
(or ``.venv/bin/python -m pytest tests/exercises/test_ex02_fused_softmax.py``)
"""

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for  # noqa: F401  (launch: kernel_for(kernel, x.device)[grid](…))


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    """One program per row: y[row, :] = softmax(x[row, :]).

    - ``tl.program_id(0)`` is the row; columns ``tl.arange(0, BLOCK)`` with BLOCK ≥ n_cols.
    - Mask columns ≥ n_cols: load them as ``-float("inf")`` and do not store them.
    - Compute in fp32 (``.to(tl.float32)``), subtract the row max before ``tl.exp``.
    - A row of only −inf must give zeros, not NaN.
    - Store in y's dtype: ``.to(y_ptr.dtype.element_ty)``.
    """
    pass


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Launch `softmax_kernel` on a 2-D tensor ``x`` (rows × cols, float32 or float16,
    last dimension contiguous) with one program per row and
    ``BLOCK = triton.next_power_of_2(cols)``. Return a new tensor like ``x``."""
    raise NotImplementedError
