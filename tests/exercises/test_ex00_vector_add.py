"""Tests for exercise 00 (vector addition in Triton). On a CPU they run in Triton's
interpreter: flashlab sets nothing process-wide, and conftest.py's `exercise` fixture hands
over your module with add_kernel replaced by the interpreted twin that
``flashlab.launch.runtime.kernel_for(add_kernel, x.device)`` launches for CPU tensors.

This file's `exercise` fixture adds `PaddedLaunch`: each launch runs on copies of its tensors
placed at the start of larger buffers, so that a load or store past the end of a tensor is
reported by name instead of corrupting memory (Triton's interpreter reads and writes the
addresses it computes: a store past the end of an output aborts the whole pytest process)."""

import math
import warnings

import pytest
import torch
import triton

from flashlab.lessons.vector_add import vector_add as package_vector_add
from tests.exercises.hints import UNWRITTEN, require
from tests.exercises.padded_launch import (
    SIGNALLING_NAN,
    PaddedLaunch,
    bind,
    not_through_kernel_for,
    run_padded,
    the_jit_function,
    written_outside,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# what the buffers hold after each tensor: after x and y a signalling NaN, which NumPy (the
# interpreter's arithmetic) reports as an invalid value once it is added to anything, so a single
# unmasked load shows (+inf after x and −inf after y caught only both: inf + (−inf), while the
# masked load's 0 + (−inf) is a quiet −inf); after out, a value no store writes
PAST_THE_END = {"x_ptr": SIGNALLING_NAN, "y_ptr": SIGNALLING_NAN}
# after out: a value no store writes (not tests.exercises.hints.UNWRITTEN, the fill of new tensors)
PAST_END_FILL = 7.0
_last_launch: dict = {}     # the programs the last padded launch ran, for _assert_sum's hint


def _launch_padded(kernel, grid, args, kwargs):
    """add_kernel on copies of x, y and out at the start of larger buffers (a signalling NaN after x
    and y, 7.0 after out), copied back; fails if it stored past the end of a tensor or loaded past
    the end of x or y."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        copies = run_padded(kernel, grid, args, kwargs, lambda name: PAST_THE_END.get(name, PAST_END_FILL))
    bound = bind(kernel, grid, args, kwargs)[1]
    _last_launch["programs"] = math.prod(grid(bound) if callable(grid) else grid)
    problems = []
    for name, (t, fill, buffer, inside, copy) in copies.items():
        t.copy_(copy)
        written = written_outside(buffer, inside, fill)
        if written:
            problems.append(
                f"add_kernel stored {written} element{'s' * (written != 1)} past the end of "
                f"{name.removesuffix('_ptr')} ({t.numel()} element{'s' * (t.numel() != 1)}, n = {bound.get('n')}): "
                "mask the store, tl.store(out_ptr + offsets, x + y, "
                "mask=offsets < n), so that the last program, which hangs over the end, writes only elements < n")
    if _read_a_signalling_nan(caught):
        which = " and ".join(_loaded_past_the_end(kernel, grid, args, kwargs)) or "x or y"
        problems.append(
            f"add_kernel loaded past the end of {which} (here a signalling NaN lies there, and the kernel added it): "
            "mask every load, tl.load(x_ptr + offsets, mask=offsets < n) and the same for y, since the memory "
            "after element n − 1 is not yours to read")
    require(not problems, "; ".join(problems))


def _read_a_signalling_nan(caught) -> bool:
    return any("invalid value" in str(w.message) for w in caught)


def _loaded_past_the_end(kernel, grid, args, kwargs) -> list[str]:
    """Which of x and y the kernel loaded past the end of: it runs again with the signalling NaN after one of
    them at a time (7.0, a finite value, after the other), on copies."""
    culprits = []
    for pointer in ("x_ptr", "y_ptr"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_padded(kernel, grid, args, kwargs,
                       lambda name, _pointer=pointer: SIGNALLING_NAN if name == _pointer else PAST_END_FILL)
        if _read_a_signalling_nan(caught):
            culprits.append(pointer.removesuffix("_ptr"))
    return culprits


@pytest.fixture
def exercise(exercise, monkeypatch):
    """conftest.py's `exercise`, with add_kernel launched through `PaddedLaunch`."""
    monkeypatch.setattr(exercise, "add_kernel", PaddedLaunch(exercise.add_kernel, _launch_padded))
    _last_launch.clear()
    return exercise


def _assert_sum(out, x, y, block, what="vector_add(x, y)"):
    """out must be x + y rounded once, as PyTorch computes it; names the cause of a ragged tail."""
    want = (x.double() + y.double()).to(x.dtype)
    wrong = (out != want).nonzero().flatten()            # NaN too
    if len(wrong):
        n, first = x.numel(), wrong[0].item()
        hint = ""
        covered = n // block * block
        if 0 < covered < n and first >= covered:
            hint = (f". Every wrong element is at index ≥ {covered} = (n // block) · block: a grid of n // block "
                    f"programs leaves the last {n - covered} unwritten; launch triton.cdiv(n, block) programs")
        elif len(wrong) == n and _last_launch.get("programs", 0) >= -(-n // block):
            programs = _last_launch["programs"]
            hint = (f". No element was written, though the launch ran {programs} program{'s' * (programs != 1)}, "
                    f"enough for n = {n}: is add_kernel's body written (not `pass`), and does it tl.store x + y at "
                    "out_ptr + offsets?")
        elif covered == 0 and len(wrong) == n:
            hint = (f". No element was written: with n = {n} < block = {block}, a grid of n // block = 0 programs "
                    "launches nothing; launch triton.cdiv(n, block) programs (the last one masked)")
        got = out[first].item()
        unwritten_note = (f": {UNWRITTEN}, the tests' fill of new tensors, so nothing wrote there"
                          if got == UNWRITTEN else "")
        raise AssertionError(
            f"{what} with n = {n}, block = {block}: {len(wrong)} of {n} elements differ from x + y, the first at "
            f"index {first} (got {got}{unwritten_note}; expected {want[first].item()}){hint}")


def test_kernel_stores_nothing_past_the_end(exercise):
    """The kernel alone, writing into the first n elements of a larger buffer: the
    elements after n must keep their value (the store is masked)."""
    n, block = 200, 128
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    buffer = torch.full((2 * block,), PAST_END_FILL, device=DEVICE)
    exercise.vector_add(x[:block], y[:block], block=block)  # a stub launcher raises: "not started", not a failure
    exercise.add_kernel[(triton.cdiv(n, block),)](x, y, buffer, n, BLOCK=block)
    _assert_sum(buffer[:n], x, y, block, what="add_kernel alone")
    require((buffer[n:] == PAST_END_FILL).all(), "the kernel wrote past element n − 1: mask the store with offsets < n")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n,block", [(1, 128), (127, 128), (128, 128), (1000, 128), (4097, 1024)])
def test_adds_every_element(exercise, n, block, dtype):
    """Odd lengths: a grid of n // block programs (instead of cdiv) leaves the tail unwritten."""
    x, y = torch.randn(n, device=DEVICE).to(dtype), torch.randn(n, device=DEVICE).to(dtype)
    out = exercise.vector_add(x, y, block=block)
    assert out.shape == x.shape and out.dtype == dtype and out.data_ptr() not in (x.data_ptr(), y.data_ptr())
    # one rounding of the exact sum, the same as PyTorch's and the package's
    _assert_sum(out, x, y, block)
    torch.testing.assert_close(out, package_vector_add(x, y, block=block), rtol=0, atol=0)


def test_default_block(exercise):
    x, y = torch.randn(3000, device=DEVICE), torch.randn(3000, device=DEVICE)
    _assert_sum(exercise.vector_add(x, y), x, y, 1024, what="vector_add(x, y) with the default block")


def test_inputs_are_not_modified(exercise):
    x, y = torch.randn(300, device=DEVICE), torch.randn(300, device=DEVICE)
    x0, y0 = x.clone(), y.clone()
    exercise.vector_add(x, y, block=128)
    assert torch.equal(x, x0) and torch.equal(y, y0), "vector_add must return a new tensor"


def test_shape_mismatch_is_a_clear_error(exercise):
    with pytest.raises(ValueError, match="^y:"):
        exercise.vector_add(torch.ones(5, device=DEVICE), torch.ones(4, device=DEVICE))


def test_launches_through_kernel_for(exercise, monkeypatch):
    """Outside these tests nothing replaces add_kernel by its interpreted twin: on CPU tensors
    vector_add works only if it launches ``kernel_for(add_kernel, x.device)[grid](…)``, which
    picks the twin (``add_kernel[grid](…)`` itself tries to compile for a GPU)."""
    monkeypatch.setattr(exercise, "add_kernel", the_jit_function(exercise.add_kernel))
    x, y = torch.randn(128), torch.randn(128)   # n = block: no program hangs over the end (nothing is padded here)
    try:
        out = exercise.vector_add(x, y, block=128)
    except NotImplementedError:
        raise
    except Exception as err:
        raise not_through_kernel_for("vector_add", "add_kernel", err) from err
    _assert_sum(out, x, y, 128)
