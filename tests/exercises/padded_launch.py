"""Exercise kernels launched on copies of their tensors placed inside larger buffers, so that a load
or store outside a tensor lands in memory the test owns (Triton's interpreter reads and writes the
addresses it computes: a store past the end of an output aborts pytest, and `make progress` prints
no table). The ex00, ex02 and ex05b tests check what lies around the tensors their own way;
`launch_guarded` is the general check, for ex05 and ex06."""

import inspect
import math

import torch

from tests.exercises.hints import require


class PaddedLaunch:
    """``PaddedLaunch(kernel, launch)[grid](*args, **kwargs)`` calls ``launch(kernel, grid, args,
    kwargs)``, the test's padded launch and check; ``kernel_for`` passes it through unchanged."""

    def __init__(self, kernel, launch):
        self.kernel, self.launch = kernel, launch

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(self.kernel, grid, args, kwargs)


def bind(kernel, grid, args, kwargs):
    """The launch's arguments by parameter name, and how many elements past a tensor's end an
    offset ``program_id · step + arange(BLOCK)`` can reach (programs + 1 times the largest int)."""
    names = list(inspect.signature(kernel.fn).parameters)
    bound = {**dict(zip(names, args)), **kwargs}
    ints = [v for v in bound.values() if isinstance(v, int) and not isinstance(v, bool)] or [1]
    programs = math.prod(grid(bound) if callable(grid) else grid)
    return names, bound, (programs + 1) * max(ints)


SIGNALLING_NAN = "signalling NaN"     # a fill_for value: a NaN whose use in arithmetic NumPy reports as invalid
_SIGNALLING_NAN_BITS = {torch.float32: (torch.int32, 0x7FA00000), torch.float16: (torch.int16, 0x7D00)}


def _buffer(length, fill, dtype, device):
    """``length`` elements of ``fill``; a signalling NaN is written as bits (torch.full would quiet it).
    Copying one stays silent; adding one, even to 0, raises the invalid flag: so a single load past the
    end is seen, where +inf and −inf need both loads unmasked to meet as inf + (−inf)."""
    if fill == SIGNALLING_NAN:
        int_dtype, bits = _SIGNALLING_NAN_BITS[dtype]
        return torch.full((length,), bits, dtype=int_dtype, device=device).view(dtype)
    return torch.full((length,), fill, dtype=dtype, device=device)


def written_outside(buffer, inside, fill) -> int:
    """Elements of ``buffer`` outside the tensor that no longer hold ``fill`` (bits, for a signalling NaN)."""
    if fill == SIGNALLING_NAN:
        int_dtype, bits = _SIGNALLING_NAN_BITS[buffer.dtype]
        return (buffer.view(int_dtype)[~inside] != bits).sum().item()
    return (buffer[~inside] != fill).sum().item()


def _span(t: torch.Tensor) -> int:
    """Elements from a tensor's first to its last, strides included."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0


def run_padded(kernel, grid, args, kwargs, fill_for, extra_reach: int = 0):
    """Launches ``kernel`` with each tensor argument copied into a buffer filled with
    ``fill_for(name)``, ``reach`` elements on either side of it: `bind`'s, plus ``extra_reach`` (a
    2-D tile of rows × columns hangs over a tensor's end by up to a tile, more than a 1-D offset),
    plus the largest tensor's span (a pointer built with another tensor's base or strides, e.g. L
    indexed as O: the slip a learner's ex05 made, whose store then aborted pytest);
    {name: (tensor, fill, buffer, inside, copy)}, ``inside`` True on the copy's elements."""
    names, bound, reach = bind(kernel, grid, args, kwargs)
    tensors = {name: t for name, t in bound.items() if isinstance(t, torch.Tensor)}
    reach += extra_reach + max((_span(t) for t in tensors.values()), default=0)
    copies = {}
    for name, t in tensors.items():
        fill = fill_for(name)
        buffer = _buffer(reach + _span(t) + reach, fill, t.dtype, t.device)
        inside = torch.zeros(buffer.shape, dtype=torch.bool, device=t.device)
        inside.as_strided(t.shape, t.stride(), reach).fill_(True)
        copies[name] = (t, fill, buffer, inside, buffer.as_strided(t.shape, t.stride(), reach).copy_(t))
    kernel[grid](*[copies[n][4] if n in copies else a for n, a in zip(names, args)],
                 **{n: copies[n][4] if n in copies else a for n, a in kwargs.items()})
    return copies


def the_jit_function(kernel):
    """The @triton.jit function under the tests' wrappers (PaddedLaunch, then the interpreted twin):
    what a learner's module holds outside the tests. Skips the test under TRITON_INTERPRET=1, where
    every kernel is interpreted however it is launched; raises NotImplementedError for a kernel whose
    body is still `pass`."""
    from triton.runtime.jit import JITFunction

    from tests.exercises.hints import UnwrittenKernel
    while not isinstance(kernel, JITFunction) and hasattr(kernel, "kernel"):
        if isinstance(kernel, UnwrittenKernel):
            kernel.refuse()       # its body is still `pass`: "not started", as the launches report it
        kernel = kernel.kernel
    if not isinstance(kernel, JITFunction):
        import pytest
        pytest.skip("TRITON_INTERPRET is set: every kernel is interpreted, however it is launched")
    return kernel


def not_through_kernel_for(launcher: str, kernel: str, err: Exception) -> AssertionError:
    """The failure of a launcher that calls ``kernel[grid](…)`` itself on CPU tensors."""
    return AssertionError(
        f"{launcher} on CPU tensors, with {kernel} as your module defines it, raised {type(err).__name__}: "
        f"{str(err).rstrip('.')}. Launch it through kernel_for({kernel}, x.device)[grid](…), as the stub's "
        f"import says: it runs the kernel in Triton's interpreter for CPU tensors. The other tests pass either "
        f"way because the test fixture has already replaced {kernel} by its interpreted twin")


AROUND_INPUTS, AROUND_OUTPUTS = 0.0, 7.0    # what lies around each tensor in `launch_guarded`: a value no store writes
                                            # around outputs; zeros around inputs (loads past a ragged end read
                                            # what the unpadded tensors' neighbours would hold: a finite value)


def tile_reach(kernel, grid, args, kwargs) -> int:
    """How far an attention kernel's 2-D tile can hang over a tensor's end: the larger block times D."""
    bound = bind(kernel, grid, args, kwargs)[1]
    return max(int(bound.get("BLOCK_M", 1)), int(bound.get("BLOCK_N", 1))) * int(bound.get("HEAD_DIM", 1))


def launch_guarded(outputs, kernel, grid, args, kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` on padded copies (`run_padded`), copied back; fails, naming the
    kernel and the tensor, if it stored outside any tensor. ``outputs``: the names of the kernel's
    output pointers (``{"O", "L"}``). Use as ``PaddedLaunch(kernel, functools.partial(launch_guarded, outputs))``."""
    copies = run_padded(kernel, grid, args, kwargs, lambda name: AROUND_OUTPUTS if name in outputs else AROUND_INPUTS,
                        extra_reach=tile_reach(kernel, grid, args, kwargs))
    problems = []
    name_of_kernel = getattr(getattr(kernel, "fn", None), "__name__", "the kernel")
    for name, (t, fill, buffer, inside, copy) in copies.items():
        t.copy_(copy)
        written = written_outside(buffer, inside, fill)
        if written:
            where = "output" if name in outputs else "input"
            problems.append(
                f"{name_of_kernel} stored {written} value{'s' * (written != 1)} outside {name} (an {where}, shape "
                f"{tuple(t.shape)}, {t.numel()} elements): mask each store to the rows that exist where a block "
                f"hangs over the end (e.g. mask=offs_m[:, None] < n_q), and build each pointer from its own tensor's "
                f"base and strides (L is one value per query row: head·N + offs_m, not head·N·D + offs_m)")
    require(not problems, "; ".join(problems))
