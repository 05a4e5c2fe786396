"""Launching a Triton kernel that is already compiled, without Triton's per-call Python.

``kernel[grid](*args, **constexprs)`` (Triton's ``JITFunction.run``) does, on every call: read
its knobs, bind the arguments to the signature, work out each argument's specialisation (the
dtype and 16-byte alignment of every pointer, whether each int is 1 or a multiple of 16), hash
that into a key, look the compiled kernel up, check the kernel's globals, build the launch
metadata, and only then call the C launcher. At routing-model sizes that Python is longer than
the kernel: on an H200 a small-path forward at N = 20 runs for 16 µs (replayed from a CUDA
graph), and launching it took 34 µs through Triton's launch, 16 µs directly
(an earlier host-time record, in the git history of results/h200/; results/h200/host-time.json is
the current one).

`launch(kernel, plan, grid, args, n_pointers, constants)` keeps, per call signature, the
``CompiledKernel`` that Triton's own launch returned the first time, and afterwards calls its C
launcher directly. ``plan`` is the caller's object for one signature, everything Triton
specialises on except the pointers: the small path keeps one per shapes, strides, dtype and
flags already (`flash_small._plan`), which fix every int argument; it is looked up by identity
(hashing the signature again would cost what this saves) and kept alive by the entry, so its
id cannot be reused while the entry exists. The pointers' dtypes and 16-byte alignment, and
the current CUDA device (a loaded kernel belongs to one device's context), are added here, so a
tensor Triton would compile differently never reuses a kernel compiled for another.

Triton's launch is taken instead for the first call of a signature, under ``TRITON_INTERPRET=1``
(the interpreter returns no compiled kernel), while a profiler's launch hooks are installed, for a
signature whose constexprs it cannot put in order, and with ``FLASHLAB_DIRECT_LAUNCH=0``: the
same kernel runs either way. CPU tensors never come here (`flash_small` launches their
interpreted twins, `flashlab.launch.runtime`).
"""

from __future__ import annotations

import torch

from . import switches

_compiled: dict = {}        # (id(kernel), id(plan), device, pointer facts) → (plan, CompiledKernel, constexprs)
_MAX_ENTRIES = 1024         # emptied when full


def enabled() -> bool:
    """``FLASHLAB_DIRECT_LAUNCH=0`` sends every launch through Triton's ``JITFunction.run``."""
    return switches.direct_launch()


def _hooks_installed() -> bool:
    """Whether something (a profiler such as Proton) asked Triton to call it around launches:
    then Triton's own launch runs, which calls the hooks. Triton 3.6 keeps the hooks in a chain
    object (empty: ``.calls == []``), later versions as None or a callable."""
    from triton import knobs
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _constexpr_tail(kernel, n_args: int, constants: dict):
    """The constexpr values in signature order, as Triton passes them to its launcher after the
    runtime arguments; None if the signature is not "runtime arguments, then constexprs"."""
    params = kernel.params
    if any(p.is_constexpr for p in params[:n_args]) or not all(p.is_constexpr for p in params[n_args:]):
        return None
    try:
        return tuple(constants[p.name] for p in params[n_args:])
    except KeyError:                     # a constexpr left to its default: not handled here
        return None


def launch(kernel, plan, grid: tuple, args: tuple, n_pointers: int, constants: dict) -> None:
    """``kernel[grid](*args, **constants)`` for CUDA tensors. ``args`` are the runtime arguments
    in signature order, the first ``n_pointers`` of them tensors; ``constants`` the constexprs
    plus Triton's launch options (num_warps, num_stages); ``plan`` the caller's object for a
    signature that fixes every non-pointer argument's specialisation (see the module docstring)."""
    if not enabled():
        kernel[grid](*args, **constants)
        return
    device = torch.cuda.current_device()
    pointers = tuple((t.dtype, t.data_ptr() % 16 == 0) for t in args[:n_pointers])
    key = (id(kernel), id(plan), device, pointers)
    entry = _compiled.get(key)     # the entry holds plan, so no other plan can have its id meanwhile
    if entry is None or _hooks_installed():
        compiled = kernel[grid](*args, **constants)         # Triton's launch (compiles the first time)
        if entry is None:
            if len(_compiled) >= _MAX_ENTRIES:
                _compiled.clear()
            # under TRITON_INTERPRET=1 the "kernel" is Triton's interpreter, which returns no CompiledKernel
            tail = _constexpr_tail(kernel, len(args), constants) if hasattr(compiled, "packed_metadata") else None
            usable = tail is not None
            _compiled[key] = (plan, compiled, tail) if usable else (plan, None, None)
        return
    _, compiled, tail = entry
    if compiled is None:                 # a signature this module does not handle: Triton's launch
        kernel[grid](*args, **constants)
        return
    grid_1 = grid[1] if len(grid) > 1 else 1
    grid_2 = grid[2] if len(grid) > 2 else 1
    compiled.run(grid[0], grid_1, grid_2, torch._C._cuda_getCurrentRawStream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *args, *tail)
