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


def attention_flops(batch, heads, seq_len, head_dim, is_causal, mode) -> float:
    """FLOPs as FlashAttention's papers count them: 4·B·H·N²·D forward, halved when
    causal; the backward is 2.5× the forward (so fwd+bwd is 3.5×)."""
    forward = 4 * batch * heads * seq_len * seq_len * head_dim * (0.5 if is_causal else 1.0)
    return forward * {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[mode]


def _sdpa_with(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, is_causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    return run


def attention_implementations(device: str) -> dict:
    """name -> fn(q, k, v, is_causal): flashlab and each SDPA backend forced (GPU)."""
    from .flash_attention import attention

    impls = {"flashlab": lambda q, k, v, is_causal: attention(q, k, v, is_causal=is_causal)}
    if device == "cuda":
        from torch.nn.attention import SDPBackend
        impls.update({"sdpa_flash": _sdpa_with(SDPBackend.FLASH_ATTENTION),
                      "sdpa_cudnn": _sdpa_with(SDPBackend.CUDNN_ATTENTION),
                      "sdpa_efficient": _sdpa_with(SDPBackend.EFFICIENT_ATTENTION)})
    return impls


def benchmark_attention(seq_lens, head_dims=(64, 128), causal=(False, True), dtypes=(torch.bfloat16,),
                        tokens=16384, heads=16, modes=("fwd", "fwd+bwd"), device=None) -> list[dict]:
    """Time every implementation with B·N = ``tokens``; TFLOP/s by `attention_flops`."""
    from tqdm.auto import tqdm

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    impls = attention_implementations(device)
    configs = [(n, d, c, dt) for n in seq_lens for d in head_dims for c in causal for dt in dtypes]
    rows = []
    for n, d, is_causal, dtype in tqdm(configs, desc="attention benchmark"):
        batch = max(1, tokens // n)
        q, k, v = (torch.randn(batch, heads, n, d, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        grad_out = torch.randn(batch, heads, n, d, device=device, dtype=dtype)
        for name, fn in impls.items():
            for mode in modes:
                def step(fn=fn, mode=mode, is_causal=is_causal, qkv=(q, k, v), grad_out=grad_out):
                    out = fn(*qkv, is_causal)
                    if mode == "fwd+bwd":
                        torch.autograd.grad(out, qkv, grad_out)
                try:
                    if mode == "fwd":
                        with torch.no_grad():
                            ms = time_ms(step, device)
                    else:
                        ms = time_ms(step, device)
                except RuntimeError as exc:  # a backend that refuses this shape
                    rows.append({"impl": name, "B": batch, "H": heads, "N": n, "D": d, "causal": is_causal,
                                 "dtype": str(dtype), "mode": mode, "error": str(exc).splitlines()[0][:200]})
                    continue
                rows.append({"impl": name, "B": batch, "H": heads, "N": n, "D": d, "causal": is_causal,
                             "dtype": str(dtype), "mode": mode, "ms": ms,
                             "tflops": attention_flops(batch, heads, n, d, is_causal, mode) / ms / 1e9})
    return rows
