"""Tests for exercise 02 (fused softmax kernel). On a CPU they run in Triton's
interpreter (flashlab.runtime.kernel_for runs CPU launches interpreted)."""

import pytest
import torch
import triton

import flashlab  # noqa: F401  (sets up the interpreter before the kernel is defined)
from flashlab import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 17), (8, 128), (5, 1000)])
def test_matches_float64_softmax(exercise, dtype, rows, cols):
    x = (torch.randn(rows, cols, device=DEVICE) * 4).to(dtype)
    y = exercise.softmax(x)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, torch.softmax(x.double(), dim=-1), dtype=dtype)


def test_masked_entries_and_fully_masked_rows(exercise):
    x = torch.randn(4, 33, device=DEVICE)
    x[0, ::2] = float("-inf")      # half the row masked
    x[2] = float("-inf")           # a row with nothing left
    y = exercise.softmax(x)
    assert torch.isfinite(y).all(), "a fully masked row must give zeros, not NaN"
    assert torch.all(y[2] == 0) and torch.all(y[0, ::2] == 0)
    keep = torch.ones(4, dtype=torch.bool)
    keep[2] = False
    assert_close(y[keep], torch.softmax(x[keep].double(), -1), dtype=torch.float32)


def test_respects_row_stride(exercise):
    big = torch.randn(6, 40, device=DEVICE)
    x = big[:, :25]                 # rows 40 apart in memory, 25 long
    assert_close(exercise.softmax(x), torch.softmax(x.double(), -1), dtype=torch.float32)


def test_subtracts_the_row_max(exercise):
    """Scores near 500 overflow e^x in fp32 (e^89 is already inf): only a kernel that
    subtracts the row max before tl.exp returns finite probabilities."""
    x = torch.randn(3, 50, device=DEVICE) * 5 + 500
    y = exercise.softmax(x)
    assert torch.isfinite(y).all(), "subtract the row max before tl.exp"
    assert_close(y, torch.softmax(x.double(), -1), dtype=torch.float32)


def test_returns_a_new_tensor(exercise):
    x = torch.randn(4, 30, device=DEVICE)
    before = x.clone()
    y = exercise.softmax(x)
    assert y.data_ptr() != x.data_ptr() and torch.equal(x, before), "softmax must not overwrite x"


def test_kernel_stores_only_the_real_columns(exercise):
    """The kernel alone, writing rows of 25 columns into a buffer whose rows are 40 long:
    columns 25..39 of every row must keep their value (the store is masked)."""
    x = torch.randn(5, 25, device=DEVICE)
    buffer = torch.full((5, 40), 7.0, device=DEVICE)
    exercise.softmax(x)                         # a stub launcher raises: "not started", not a failure
    exercise.softmax_kernel[(5,)](x, buffer, 25, x.stride(0), buffer.stride(0), BLOCK=triton.next_power_of_2(25))
    assert (buffer[:, 25:] == 7.0).all(), "the kernel wrote columns ≥ n_cols: mask the store"
    assert_close(buffer[:, :25], torch.softmax(x.double(), -1), dtype=torch.float32)
