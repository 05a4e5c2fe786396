"""Exercise kernels launched on copies of their tensors placed at the start of larger buffers, so
that a load or store past the end of a tensor lands in memory the test owns (Triton's interpreter
reads and writes the addresses it computes: a store past the end of an output aborts pytest).
Used by the ex00 and ex02 tests, each with its own check of what lies around the tensors."""

import inspect
import math

import torch


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


def run_padded(kernel, grid, args, kwargs, fill_for):
    """Launches ``kernel`` with each tensor argument copied into a buffer filled with
    ``fill_for(name)`` and ``reach`` elements longer; {name: (tensor, fill, buffer, inside, copy)},
    ``inside`` True on the copy's elements."""
    names, bound, reach = bind(kernel, grid, args, kwargs)
    copies = {}
    for name, t in bound.items():
        if isinstance(t, torch.Tensor):
            fill = fill_for(name)
            span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
            buffer = torch.full((span + reach,), fill, dtype=t.dtype, device=t.device)
            inside = torch.zeros(buffer.shape, dtype=torch.bool, device=t.device)
            inside.as_strided(t.shape, t.stride()).fill_(True)
            copies[name] = (t, fill, buffer, inside, buffer.as_strided(t.shape, t.stride()).copy_(t))
    kernel[grid](*[copies[n][4] if n in copies else a for n, a in zip(names, args)],
                 **{n: copies[n][4] if n in copies else a for n, a in kwargs.items()})
    return copies
