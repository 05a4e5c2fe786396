"""Where flashlab's Triton kernels run: compiled on an NVIDIA GPU, interpreted on CPU.

Triton decides at the moment a kernel is *defined* (``@triton.jit``) whether it will be
compiled or interpreted, by reading ``TRITON_INTERPRET``. flashlab therefore settles the
question when it is imported, before any of its kernels exist:

- ``TRITON_INTERPRET`` already set by you: respected as it is.
- no CUDA GPU visible: set to ``1``, so the same kernels run in Triton's interpreter
  (NumPy on the CPU; slow, so the course uses small sizes there).
- a CUDA GPU: left unset, kernels are compiled for it.
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def triton_interpreted() -> bool:
    """True if Triton kernels defined from now on run in the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def describe() -> dict[str, str]:
    """What runs where on this machine, for the setup notebook and bug reports."""
    import platform

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": str(torch.cuda.is_available()),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only",
        "triton_kernels": "interpreter (CPU)" if triton_interpreted() else "compiled (GPU)",
    }
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    return info
