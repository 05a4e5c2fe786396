"""Tests for exercise 00 (vector addition in Triton). On a CPU they run in Triton's
interpreter (flashlab.runtime.kernel_for runs CPU launches interpreted)."""

import pytest
import torch
import triton

import flashlab  # noqa: F401  (sets up the interpreter before the kernel is defined)
from flashlab.vector_add import vector_add as package_vector_add

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n,block", [(1, 128), (127, 128), (128, 128), (1000, 128), (4097, 1024)])
def test_adds_every_element(exercise, n, block, dtype):
    """Odd lengths: a grid of n // block programs (instead of cdiv) leaves the tail unwritten."""
    x, y = torch.randn(n, device=DEVICE).to(dtype), torch.randn(n, device=DEVICE).to(dtype)
    out = exercise.vector_add(x, y, block=block)
    assert out.shape == x.shape and out.dtype == dtype and out.data_ptr() not in (x.data_ptr(), y.data_ptr())
    # one rounding of the exact sum, the same as PyTorch's and the package's
    torch.testing.assert_close(out, (x.double() + y.double()).to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(out, package_vector_add(x, y, block=block), rtol=0, atol=0)


def test_default_block(exercise):
    x, y = torch.randn(3000, device=DEVICE), torch.randn(3000, device=DEVICE)
    torch.testing.assert_close(exercise.vector_add(x, y), x + y, rtol=0, atol=0)


def test_inputs_are_not_modified(exercise):
    x, y = torch.randn(300, device=DEVICE), torch.randn(300, device=DEVICE)
    x0, y0 = x.clone(), y.clone()
    exercise.vector_add(x, y, block=128)
    assert torch.equal(x, x0) and torch.equal(y, y0), "vector_add must return a new tensor"


def test_kernel_stores_nothing_past_the_end(exercise):
    """The kernel alone, writing into the first n elements of a larger buffer: the
    elements after n must keep their value (the store is masked)."""
    n, block = 200, 128
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    buffer = torch.full((2 * block,), 7.0, device=DEVICE)
    exercise.vector_add(x, y, block=block)      # a stub launcher raises: "not started", not a failure
    exercise.add_kernel[(triton.cdiv(n, block),)](x, y, buffer, n, BLOCK=block)
    torch.testing.assert_close(buffer[:n], x + y, rtol=0, atol=0)
    assert (buffer[n:] == 7.0).all(), "the kernel wrote past element n − 1: mask the store with offsets < n"


def test_shape_mismatch_is_a_clear_error(exercise):
    with pytest.raises(ValueError, match="^y:"):
        exercise.vector_add(torch.ones(5, device=DEVICE), torch.ones(4, device=DEVICE))
