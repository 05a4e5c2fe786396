"""Exercise 00: your first Triton kernel, vector addition (notebook 00_setup;
the package's version is `flashlab/lessons/vector_add.py`).

A kernel runs as a grid of programs; program p owns the BLOCK consecutive elements that
start at p·BLOCK. On a CPU it runs in Triton's interpreter, so you can print inside it.

Test: ``make test-ex EX=00`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex00_vector_add.py``)
"""

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for  # noqa: F401  (launch: kernel_for(kernel, x.device)[grid](…))


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = x[i] + y[i] for the elements of program ``tl.program_id(0)``.

    - Its element indices: ``offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)``.
    - Only indices < n are real: pass ``mask=offsets < n`` to ``tl.load`` and ``tl.store``.
      The store must not write past element n − 1 (``out`` may be the start of a larger
      buffer); the loads are masked because memory past the end is not yours to read.
    """
    pass


def vector_add(x: torch.Tensor, y: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Return x + y, computed by `add_kernel`.

    Args:
        x, y: contiguous 1-D tensors of the same length n ≥ 1, dtype and device.
        block: elements per program, a power of two.
    Returns:
        a new tensor like x (``torch.empty_like(x)``), filled by a grid of
        ``triton.cdiv(n, block)`` programs, so every element is covered even when n is
        not a multiple of ``block``.
    Raises:
        ValueError: starting ``"y:"`` when y's shape differs from x's.
    """
    raise NotImplementedError
