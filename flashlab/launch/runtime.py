"""Where flashlab's Triton kernels run, decided per call: compiled for CUDA tensors, in
Triton's interpreter for CPU tensors.

Triton decides when a kernel is *defined* (``@triton.jit``) whether it will ever be
compiled or interpreted, by reading ``TRITON_INTERPRET``. Setting that variable from a
library would switch every other Triton user of the process to the interpreter (and it
is too late anyway once ``triton`` was imported first: ``triton.language``'s own helpers,
``tl.max``, ``tl.rand``…, were then defined compiled). flashlab therefore sets nothing at
import. Each launch site asks for the kernel that fits its tensors' device:

    kernel_for(flash_forward_kernel, q.device)[grid](q, k, ...)

- CUDA tensors: the ``@triton.jit`` kernel itself, compiled as usual.
- CPU tensors: an *interpreted twin*, Triton's ``InterpretedFunction`` built from the same
  Python source, run while calls to other ``@triton.jit`` functions (the kernel's helpers,
  ``tl.max``, ``tl.rand``) are routed to their own interpreted twins. Triton's interpreter
  patches ``triton.language`` for the duration of a launch in the same way; both patches are
  undone when the launch returns (launches on CPU are serialised by a lock).
- ``TRITON_INTERPRET=1`` set by you before ``triton`` is imported: every kernel already is
  an interpreted function and is launched as it is, on any device.

The twins work on Triton 3.6 (the course's GPU) and 3.9 (its CPU): both define
``InterpretedFunction(fn)`` and a ``JITFunction.__call__`` that only raises.

`triton_available` says whether Triton is installed at all; `require_triton` raises the
message a caller sees when a kernel is needed without it (the PyTorch paths need no Triton).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import threading

import torch

from . import switches

# checked once, without importing triton (a plain constant: torch.compile traces through it)
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


@functools.cache
def triton_version() -> tuple[int, int]:
    """(major, minor) of the installed Triton."""
    import triton
    return tuple(int(part) for part in triton.__version__.split(".")[:2])


@functools.cache
def device_capability(device: torch.device) -> tuple[int, int]:
    """The CUDA compute capability of ``device``, asked once."""
    return torch.cuda.get_device_capability(device)


def triton_available() -> bool:
    """True if ``import triton`` would work."""
    return _TRITON_INSTALLED


def require_triton(what: str = "this Triton kernel") -> None:
    """Raise a clear error if Triton is missing; flashlab's PyTorch paths need no Triton."""
    if not triton_available():
        raise ImportError(f"{what} needs Triton, which is not installed. Install it with "
                          "`pip install triton` (Linux; on a CUDA machine it comes with torch), "
                          "or use CPU tensors: flashlab.attention then runs its PyTorch path.")


def cpu_kernels_enabled() -> bool:
    """``FLASHLAB_CPU_KERNELS=0`` (read per call): CPU tensors take the PyTorch paths of
    `flashlab.attention`, `decode_attention` and `varlen_attention` instead of their kernels in
    Triton's interpreter (a model's CPU tests then run at PyTorch's speed)."""
    return switches.cpu_kernels()


def interpreting_everything() -> bool:
    """True if ``TRITON_INTERPRET`` is set: Triton then interprets every kernel it defines,
    flashlab's included, whatever the device."""
    return switches.interpreting_everything()


_launch_lock = threading.RLock()


class _Twin:
    """What ``kernel_for(kernel, cpu)`` returns: ``twin[grid](*args)`` launches the
    interpreted twin of ``kernel`` with its helper calls interpreted too."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            import numpy
            # Overflow to ±inf is IEEE arithmetic the kernels rely on (a float mask of
            # finfo(float32).min times log2(e) in base-2 scores is −inf, a key never attended),
            # silent on a GPU; numpy, which the interpreter computes with, would warn about it.
            with _helpers_interpreted(), numpy.errstate(over="ignore"):
                return _interpreted(self.kernel, refresh=True)[grid](*args, **kwargs)
        return launch

    def __call__(self, *args, **kwargs):  # called from inside another interpreted kernel
        return _interpreted(self.kernel)(*args, **kwargs)

    def __getattr__(self, name):          # .fn, .src, __name__: as the kernel has them
        return getattr(self.kernel, name)


def kernel_for(kernel, device):
    """The kernel to launch for tensors on ``device``: ``kernel`` itself on a GPU (compiled),
    an interpreted twin on the CPU. Adopt it at a launch site in one line:
    ``kernel_for(my_kernel, x.device)[grid](x, ...)``."""
    if torch.device(device).type != "cpu" or not _is_compiled_kernel(kernel):
        return kernel
    return _Twin(kernel)


def _is_compiled_kernel(kernel) -> bool:
    from triton.runtime.jit import JITFunction
    return isinstance(kernel, JITFunction)


_twins: dict = {}          # id(JITFunction) → (JITFunction, its InterpretedFunction)
_shadow_globals: dict = {}  # id(module globals) → (those globals, the copy the twins run in)


def _interpreted(jit_function, refresh: bool = False):
    """The interpreted twin of a ``@triton.jit`` function (built once). Its Python function is
    a copy of the original whose globals are a private copy of the module's: the interpreter
    writes its own names into a kernel's globals, and those must not land in the module."""
    # keyed by id: hashing a JITFunction hashes its source and dependencies, which fails
    # while the interpreter has triton.language patched
    entry = _twins.get(id(jit_function))
    twin = entry[1] if entry is not None else None
    if twin is None:
        import types

        from triton.runtime.interpreter import InterpretedFunction
        _repair_scalar_index()
        fn = jit_function.fn
        shadow = _shadow_globals.setdefault(id(fn.__globals__), (fn.__globals__, dict(fn.__globals__)))[1]
        copy = types.FunctionType(fn.__code__, shadow, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__kwdefaults__, copy.__annotations__ = fn.__kwdefaults__, fn.__annotations__
        copy.__module__, copy.__qualname__, copy.__doc__ = fn.__module__, fn.__qualname__, fn.__doc__
        twin = InterpretedFunction(copy)
        _twins[id(jit_function)] = (jit_function, twin)
    elif refresh:
        # a notebook may have redefined a helper since: look names up afresh
        twin.fn.__globals__.update(jit_function.fn.__globals__)
    return twin


def _repair_scalar_index() -> None:
    """Triton ≤ 3.6's interpreter turns a scalar into a Python int with ``int(array)`` on a
    one-element 1-D array (to run ``range(lo, hi, BLOCK)`` with runtime bounds, as every flashlab
    kernel does). NumPy 2.5 refuses that ("only 0-dimensional arrays can be converted to Python
    scalars"), so with those versions every interpreted call failed (Triton 3.6 with NumPy 2.5).
    Triton 3.7+ squeezes the array first; on older versions
    the interpreter's patch step is wrapped to do the same. The wrapper only changes how that one
    conversion is done, for every interpreter user in the process, and only where it would fail."""
    from triton.runtime import interpreter
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_flashlab_repaired", False):
        return
    try:
        if "int(self.handle.data))" not in inspect.getsource(original):
            return                                    # a Triton that squeezes already
    except (OSError, TypeError):
        return

    def patch_lang_tensor(tensor, scope, *args, **kwargs):
        original(tensor, scope, *args, **kwargs)
        # set after the original: the scope restores in reverse order, so both undo cleanly
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor._flashlab_repaired = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _patched_by_the_interpreter() -> tuple:
    """What Triton's interpreter patches while it runs a kernel: ``triton.language`` and its
    ``core`` and ``math`` modules, and the ``tensor``, ``dtype`` and ``tensor_descriptor_base``
    classes (``_patch_lang`` in ``triton/runtime/interpreter.py``)."""
    import triton.language as tl
    core = tl.core
    return tuple(x for x in (tl, core, tl.math, core.tensor, core.dtype, getattr(core, "tensor_descriptor_base", None))
                 if x is not None)


_MISSING = object()


def _snapshot_language() -> list:
    return [(owner, dict(vars(owner))) for owner in _patched_by_the_interpreter()]


def _restore_language(snapshot) -> None:
    """Put back every attribute an interpreted launch changed. Triton (3.6 to 3.9 at least)
    undoes its patches when a kernel launch returns, but not those made when an interpreted
    kernel calls another ``@triton.jit`` function (``InterpretedFunction.__call__`` patches and
    never restores). A helper from another module, ``tl.cdiv`` from ``triton.language.standard``
    for one, patches ``triton.language.core`` for good, and from then on every kernel *compiled*
    in the process fails ("'block_argument' object has no attribute 'dtype'"): one CPU call of
    flashlab broke every later CUDA call (found by the GPU tests, which share processes).
    Attributes that were added (``__index__``, say) are removed; modules imported meanwhile stay."""
    import types
    for owner, before in snapshot:
        now = vars(owner)
        for name in [n for n in now if n not in before]:
            if not isinstance(now[name], types.ModuleType):
                delattr(owner, name)
        for name, value in before.items():
            if now.get(name, _MISSING) is not value:
                setattr(owner, name, value)



@contextlib.contextmanager
def _helpers_interpreted():
    """While an interpreted kernel runs, a call to a compiled ``@triton.jit`` function (which
    otherwise raises "Cannot call @triton.jit'd outside of the scope of a kernel") runs its
    interpreted twin. Undone on exit, with whatever the interpreter left patched in
    ``triton.language`` (`_restore_language`); nested launches share one patch."""
    from triton.runtime.jit import JITFunction
    with _launch_lock:
        original = JITFunction.__dict__["__call__"]
        if getattr(original, "_flashlab_twin_call", False):
            yield
            return

        def call_twin(self, *args, **kwargs):
            return _interpreted(self)(*args, **kwargs)

        call_twin._flashlab_twin_call = True
        snapshot = _snapshot_language()
        JITFunction.__call__ = call_twin
        try:
            yield
        finally:
            JITFunction.__call__ = original
            _restore_language(snapshot)


def input_precision(dtype: torch.dtype, device: torch.device, exact_fp32: bool = False) -> str:
    """How the kernels multiply: "ieee" (exact) unless the inputs are float32 on a GPU and torch itself
    allows TF32 for float32 matmuls (``torch.backends.cuda.matmul.allow_tf32 = True``, which
    ``torch.set_float32_matmul_precision("high")`` also sets), as SDPA does. ``exact_fp32=True``
    forces exact products even then. fp16/bf16 inputs are exact products with fp32 sums anyway.
    In TF32 the kernels round each fp32 operand to nearest first (`flashlab.kernels.tile.dot`), as cuBLAS
    does; the tensor cores alone truncate.

    Exact fp32 costs: without tensor cores an exact fp32 forward runs about a hundred times slower
    than in TF32, and each exact kernel takes minutes to compile; set
    ``torch.backends.cuda.matmul.allow_tf32 = True`` to train in fp32."""
    if dtype != torch.float32 or exact_fp32 or torch.device(device).type != "cuda":
        return "ieee"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def describe() -> dict[str, str]:
    """What runs where on this machine, for the setup notebook and bug reports."""
    import platform

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": str(torch.cuda.is_available()),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only",
        "triton_kernels": ("interpreter for every kernel (TRITON_INTERPRET is set)" if interpreting_everything()
                           else "compiled for CUDA tensors, interpreted for CPU tensors"),
    }
    if triton_available():
        import triton
        info["triton"] = triton.__version__
    else:
        info["triton"] = "not installed (CPU tensors use flashlab's PyTorch path)"
    return info
