"""The softmax benchmark of notebook 02: flashlab's fused Triton softmax against
torch.softmax and the same softmax as five separate PyTorch ops."""

from __future__ import annotations

import contextlib

import torch

from flashlab.launch.timing import cpu_threads, time_ms
from flashlab.lessons.fused_softmax import fused_softmax
from flashlab.lessons.traffic import softmax_traffic


def unfused_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax as five separate PyTorch ops (each a round trip through memory)."""
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(dim=-1, keepdim=True)


def benchmark_softmax(rows: int, col_list, dtype=torch.float16, device=None, progress: bool = True) -> list[dict]:
    """Time fused Triton softmax, torch.softmax and the unfused ops on ``rows × cols``
    matrices; effective bandwidth = bytes of the fused traffic model (one read, one
    write) / time, the same numerator for every implementation. ``progress``: a progress
    bar over the row lengths (off in a notebook, whose saved output would keep it at 0%)."""
    from tqdm.auto import tqdm

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    impls = {"flashlab fused (Triton)": fused_softmax, "torch.softmax": lambda x: torch.softmax(x, -1),
             "unfused PyTorch ops": unfused_softmax}
    results = []
    # on a CPU (the notebook's tiny live shapes) one thread: with two on a busy machine, one op can wait a
    # whole scheduler slice and time milliseconds for microseconds of work
    with cpu_threads(1) if device == "cpu" else contextlib.nullcontext():
        for cols in tqdm(list(col_list), desc="softmax benchmark", disable=not progress):
            x = torch.randn(rows, cols, device=device, dtype=dtype)
            moved = sum(s.total for s in softmax_traffic(rows, cols, dtype, fused=True))
            for name, fn in impls.items():
                ms = time_ms(lambda fn=fn, x=x: fn(x), device)
                results.append({"impl": name, "rows": rows, "cols": cols, "dtype": str(dtype), "ms": ms,
                                "GB/s": moved / ms / 1e6})
    return results
