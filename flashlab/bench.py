"""Timing helpers and benchmarks. GPU: medians of `triton.testing.do_bench` (CUDA
events, after warm-up, L2 flushed between runs). CPU: median of a plain wall-clock
timer over a few runs (Triton's benchmarking needs a GPU driver)."""

from __future__ import annotations

import statistics
import time

import torch

from .fused_softmax import fused_softmax
from .traffic import softmax_traffic


def time_ms(fn, device: str | None = None, warmup_ms: int = 25, rep_ms: int = 100, cpu_runs: int = 5) -> float:
    """Median time of ``fn()`` in milliseconds."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()  # warm-up
    times = []
    for _ in range(cpu_runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def unfused_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax as five separate PyTorch ops (each a round trip through memory)."""
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(dim=-1, keepdim=True)


def benchmark_softmax(rows: int, col_list, dtype=torch.float16, device=None) -> list[dict]:
    """Time fused Triton softmax, torch.softmax and the unfused ops on ``rows × cols``
    matrices; effective bandwidth = bytes of the fused traffic model (one read, one
    write) / time, the same numerator for every implementation."""
    from tqdm.auto import tqdm

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    impls = {"flashlab fused (Triton)": fused_softmax, "torch.softmax": lambda x: torch.softmax(x, -1),
             "unfused PyTorch ops": unfused_softmax}
    results = []
    for cols in tqdm(list(col_list), desc="softmax benchmark"):
        x = torch.randn(rows, cols, device=device, dtype=dtype)
        moved = sum(s.total for s in softmax_traffic(rows, cols, dtype, fused=True))
        for name, fn in impls.items():
            ms = time_ms(lambda fn=fn, x=x: fn(x), device)
            results.append({"impl": name, "rows": rows, "cols": cols, "dtype": str(dtype), "ms": ms,
                            "GB/s": moved / ms / 1e6})
    return results
