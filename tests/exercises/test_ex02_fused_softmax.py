"""Tests for exercise 02 (fused softmax kernel). On a CPU they run in Triton's interpreter:
flashlab sets nothing process-wide, and conftest.py's `exercise` fixture hands over your module
with softmax_kernel replaced by the interpreted twin that
``flashlab.launch.runtime.kernel_for(softmax_kernel, x.device)`` launches for CPU tensors.

This file's `exercise` fixture adds `PaddedLaunch`: each launch runs on copies of x and y
placed in larger buffers, so that a load or store outside a tensor is reported by name instead
of corrupting memory (Triton's interpreter reads and writes the addresses it computes: a store
past the end of y aborts the whole pytest process)."""


import pytest
import torch
import triton

from flashlab import assert_close
from tests.exercises.hints import require, unwritten
from tests.exercises.padded_launch import PaddedLaunch, bind, not_through_kernel_for, run_padded, the_jit_function

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OUTSIDE_X = 1e4     # around x's rows: read there, it becomes the row max and every real column gives 0
PAST_END_FILL = 7.0     # around y's rows: a value no store writes


def _launch_padded(kernel, grid, args, kwargs):
    """softmax_kernel on copies of x and y in larger buffers (10⁴ around x's elements, 7.0 around
    y's), copied back; fails if a row stride passed is not its tensor's, if the kernel stored
    outside y, or if it loaded outside x: a row max of 10⁴ zeroes a row of y, and a second run with
    −inf around x gives another y."""
    bound = bind(kernel, grid, args, kwargs)[1]
    problems = []
    for tensor, stride in (("x_ptr", "x_row_stride"), ("y_ptr", "y_row_stride")):
        t, passed = bound.get(tensor), bound.get(stride)
        if isinstance(t, torch.Tensor) and t.dim() == 2 and isinstance(passed, int) and passed != t.stride(0):
            problems.append(f"{stride} = {passed} was passed, but {tensor[0]}'s rows are {t.stride(0)} elements "
                            f"apart: pass each tensor's own row stride, {tensor[0]}.stride(0)")

    def run(around_x):
        return run_padded(kernel, grid, args, kwargs, lambda name: around_x if name == "x_ptr" else PAST_END_FILL)

    copies = run(OUTSIDE_X)
    for name, (t, fill, buffer, inside, copy) in copies.items():
        t.copy_(copy)
        outside = buffer[~inside]
        written = (outside != fill).sum().item()
        if written:
            problems.append(
                f"softmax_kernel stored {written} values outside {name[0]} (shape {tuple(t.shape)}, rows "
                f"{t.stride(0) if t.dim() == 2 else '?'} apart): mask the store with cols < n_cols, and step between "
                "y's rows by y_row_stride")
    if _read_outside_x(copies, run):
        problems.append(
            "softmax_kernel loaded values outside x (10⁴ here, so that row's max became 10⁴): load with "
            "mask=cols < n_cols and other=-float(\"inf\"), and step between x's rows by x_row_stride")
    require(not problems, "; ".join(problems))


def _read_outside_x(copies, run) -> bool:
    """A row of y all 0 (or NaN) although x's row has a finite value: if a run with −inf around x
    gives another y, the 10⁴ around x got into the row max."""
    if "x_ptr" not in copies or "y_ptr" not in copies:
        return False
    x, y = copies["x_ptr"][4], copies["y_ptr"][4]
    if x.shape != y.shape or x.dim() != 2:
        return False
    lost = ((y == 0).all(-1) & torch.isfinite(x).any(-1)) | y.isnan().any(-1)
    return bool(lost.any()) and not torch.equal(y.nan_to_num(), run(-float("inf"))["y_ptr"][4].nan_to_num())


@pytest.fixture
def exercise(exercise, monkeypatch):
    """conftest.py's `exercise`, with softmax_kernel launched through `PaddedLaunch`."""
    monkeypatch.setattr(exercise, "softmax_kernel", PaddedLaunch(exercise.softmax_kernel, _launch_padded))
    return exercise


def _padding_hint(exercise, x, dtype) -> str:
    """When n_cols is not a power of two: is the kernel right for a power-of-two width (no padding
    columns)? Then the columns between n_cols and BLOCK are what goes wrong."""
    cols = x.shape[-1]
    width = 1 << (cols.bit_length() - 1)
    if width == cols:
        return ""
    try:
        part = x[:, :width].contiguous()
        assert_close(exercise.softmax(part), torch.softmax(part.double(), -1), dtype=dtype)
    except Exception:  # a hint only: the failure it accompanies is what matters
        return ""
    return (f"\nhint: right for {width} columns (a power of two, BLOCK = n_cols) but not for {cols} (BLOCK = "
            f"{triton.next_power_of_2(cols)}): the columns n_cols..BLOCK − 1 must not count in the max or the sum. "
            "Load with mask=cols < n_cols and other=-float(\"inf\") (exp(−inf) = 0), not 0 and not unmasked")


def _assert_softmax(exercise, y, x, dtype=torch.float32, rows=slice(None)):
    """y[rows] must be softmax(x[rows]) (float64 reference); names the cause of padding mistakes."""
    try:
        assert_close(y[rows], torch.softmax(x[rows].double(), -1), dtype=dtype)
    except AssertionError as err:
        hint = unwritten(y[rows], "y") or _padding_hint(exercise, x[rows], dtype)
        raise AssertionError(f"{err}{hint}") from None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 17), (8, 128), (5, 1000)])
def test_matches_float64_softmax(exercise, dtype, rows, cols):
    x = (torch.randn(rows, cols, device=DEVICE) * 4).to(dtype)
    y = exercise.softmax(x)
    assert y.shape == x.shape and y.dtype == dtype
    _assert_softmax(exercise, y, x, dtype=dtype)


def test_masked_entries_and_fully_masked_rows(exercise):
    x = torch.randn(4, 33, device=DEVICE)
    x[0, ::2] = float("-inf")      # half the row masked
    x[2] = float("-inf")           # a row with nothing left
    y = exercise.softmax(x)
    require(torch.isfinite(y).all(),
            "a fully masked row must give zeros, not NaN. In a row of only −inf the max is −inf too, and "
            "x − max = −inf − (−inf) = NaN: subtract a finite max there (e.g. tl.where(m == -float('inf'), 0.0, m)), "
            "so e^(x − m) = 0 everywhere, and divide by a sum of 0 only where it is not 0")
    assert torch.all(y[2] == 0) and torch.all(y[0, ::2] == 0)
    keep = torch.ones(4, dtype=torch.bool)
    keep[2] = False
    _assert_softmax(exercise, y, x, rows=keep)


def test_respects_row_stride(exercise):
    big = torch.randn(6, 40, device=DEVICE)
    x = big[:, :25]                 # rows 40 apart in memory, 25 long
    _assert_softmax(exercise, exercise.softmax(x), x)


def test_subtracts_the_row_max(exercise):
    """Scores near 500 overflow e^x in fp32 (e^89 is already inf): only a kernel that
    subtracts the row max before tl.exp returns finite probabilities."""
    x = torch.randn(3, 50, device=DEVICE) * 5 + 500
    y = exercise.softmax(x)
    require(torch.isfinite(y).all(), "subtract the row max before tl.exp")
    _assert_softmax(exercise, y, x)


def test_returns_a_new_tensor(exercise):
    x = torch.randn(4, 30, device=DEVICE)
    before = x.clone()
    y = exercise.softmax(x)
    assert y.data_ptr() != x.data_ptr() and torch.equal(x, before), "softmax must not overwrite x"


def test_kernel_stores_only_the_real_columns(exercise):
    """The kernel alone, writing rows of 25 columns into a buffer whose rows are 40 long:
    columns 25..39 of every row must keep their value (the store is masked)."""
    x = torch.randn(5, 25, device=DEVICE)
    buffer = torch.full((5, 40), PAST_END_FILL, device=DEVICE)
    exercise.softmax(x)                         # a stub launcher raises: "not started", not a failure
    exercise.softmax_kernel[(5,)](x, buffer, 25, x.stride(0), buffer.stride(0), BLOCK=triton.next_power_of_2(25))
    if not (buffer[:, 25:] == PAST_END_FILL).all():
        # rows stored x.stride(0) = 25 apart, not buffer.stride(0) = 40: each row's 25 values side by side
        want = torch.softmax(x.double(), -1).to(buffer.dtype)
        flat = buffer.flatten()
        y_stepped_by_x = all(torch.allclose(flat[r * 25:(r + 1) * 25], want[r], atol=1e-5) for r in range(5))
        require(False, "the kernel stored row r at r × x_row_stride (25), not r × y_row_stride (40): y's rows are "
                       "40 elements apart here, so step between y's rows by y_row_stride" if y_stepped_by_x else
                       "the kernel wrote columns ≥ n_cols: mask the store with cols < n_cols")
    _assert_softmax(exercise, buffer[:, :25], x)


def test_launches_through_kernel_for(exercise, monkeypatch):
    """Outside these tests nothing replaces softmax_kernel by its interpreted twin: on CPU tensors
    softmax works only if it launches ``kernel_for(softmax_kernel, x.device)[grid](…)``, which
    picks the twin (``softmax_kernel[grid](…)`` itself tries to compile for a GPU)."""
    monkeypatch.setattr(exercise, "softmax_kernel", the_jit_function(exercise.softmax_kernel))
    x = torch.randn(4, 32)                      # n_cols = BLOCK: nothing to read or write outside x and y
    try:
        y = exercise.softmax(x)
    except NotImplementedError:
        raise
    except Exception as err:
        raise not_through_kernel_for("softmax", "softmax_kernel", err) from err
    assert_close(y, torch.softmax(x.double(), -1), dtype=torch.float32)
