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


def _flex_attention():
    """FlexAttention (torch.compile'd), with the causal block mask cached per length."""
    import torch._dynamo
    import torch._functorch.config
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # The harness times the backward alone by calling autograd.grad(…, retain_graph=True)
    # repeatedly on one graph, which compiled backward functions refuse when they donate
    # buffers. And every (N, D, dtype, causal) is a recompile: past dynamo's default cache
    # size flex_attention would silently fall back to its unfused implementation (the
    # first H200 run did), so allow one compiled variant per shape of the sweep.
    torch._functorch.config.donated_buffer = False
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 256))
    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def run(q, k, v, is_causal):
        mask = None
        if is_causal:
            key = (q.shape[2], k.shape[2], q.device)
            if key not in masks:
                masks[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, q.shape[2], k.shape[2],
                                               device=q.device)
            mask = masks[key]
        return compiled(q, k, v, block_mask=mask)
    return run


def attention_implementations(device: str, flex: bool = True) -> dict:
    """name -> fn(q, k, v, is_causal): flashlab, naive attention, and on a GPU each SDPA
    backend forced (flash, cuDNN, memory-efficient, math) and FlexAttention."""
    from .flash_attention import attention
    from .naive import naive_attention

    impls = {"flashlab": lambda q, k, v, is_causal: attention(q, k, v, is_causal=is_causal),
             "naive": lambda q, k, v, is_causal: naive_attention(q, k, v, is_causal=is_causal)}
    from torch.nn.attention import SDPBackend
    impls["sdpa_math"] = _sdpa_with(SDPBackend.MATH)
    if device == "cuda":
        impls.update({"sdpa_flash": _sdpa_with(SDPBackend.FLASH_ATTENTION),
                      "sdpa_cudnn": _sdpa_with(SDPBackend.CUDNN_ATTENTION),
                      "sdpa_efficient": _sdpa_with(SDPBackend.EFFICIENT_ATTENTION)})
        if flex:
            impls["flex"] = _flex_attention()
    return impls


def extra_memory(fn, device) -> int | None:
    """Peak bytes allocated while ``fn`` runs, above what was allocated before (CUDA)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def benchmark_attention(seq_lens, head_dims=(64, 128), causal=(False, True), dtypes=(torch.bfloat16,),
                        tokens=16384, heads=16, modes=("fwd", "bwd", "fwd+bwd"), device=None, impls=None,
                        flex_seq_lens=None, skip=(), warmup_ms=25, rep_ms=100, on_progress=None) -> list[dict]:
    """Time every implementation with B·N = ``tokens``: forward (no autograd graph),
    backward alone (forward done outside the timing) and forward+backward; TFLOP/s by
    `attention_flops`; on CUDA the extra memory (peak above the inputs) of a forward
    and of a forward+backward. ``flex_seq_lens`` limits FlexAttention (compiled per
    shape) to these N; ``skip`` holds (impl, N) pairs not to run. A backend that
    refuses a shape (or runs out of memory) gets a row with its error. ``on_progress(rows)``
    is called after every shape (to save partial results of a long run)."""
    from tqdm.auto import tqdm

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    impls = impls or attention_implementations(device)
    configs = [(n, d, c, dt) for n in seq_lens for d in head_dims for c in causal for dt in dtypes]
    rows = []
    for n, d, is_causal, dtype in tqdm(configs, desc="attention benchmark"):
        batch = max(1, tokens // n)
        q, k, v = (torch.randn(batch, heads, n, d, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        grad_out = torch.randn(batch, heads, n, d, device=device, dtype=dtype)
        for name, fn in impls.items():
            if (name == "flex" and flex_seq_lens is not None and n not in flex_seq_lens) or (name, n) in skip:
                continue
            base = {"impl": name, "B": batch, "H": heads, "N": n, "D": d, "causal": is_causal, "dtype": str(dtype)}

            def forward(fn=fn, is_causal=is_causal, qkv=(q, k, v)):
                with torch.no_grad():
                    fn(*qkv, is_causal)

            def forward_backward(fn=fn, is_causal=is_causal, qkv=(q, k, v), grad_out=grad_out):
                torch.autograd.grad(fn(*qkv, is_causal), qkv, grad_out)

            def backward(out, qkv=(q, k, v), grad_out=grad_out):
                torch.autograd.grad(out, qkv, grad_out, retain_graph=True)

            try:
                out = fn(q, k, v, is_causal)          # warm-up (and compilation), and the graph for "bwd"
                forward_backward()                    # compiles (flex) and autotunes (flashlab) the backward
                                                      # too, so neither counts in the memory peaks below
                memory = {"fwd": extra_memory(forward, device), "fwd+bwd": extra_memory(forward_backward, device)}
                for mode in modes:
                    if mode == "fwd":
                        ms = time_ms(forward, device, warmup_ms, rep_ms)
                    elif mode == "bwd":
                        ms = time_ms(lambda out=out: backward(out), device, warmup_ms, rep_ms)
                    else:
                        ms = time_ms(forward_backward, device, warmup_ms, rep_ms)
                    rows.append({**base, "mode": mode, "ms": ms,
                                 "tflops": attention_flops(batch, heads, n, d, is_causal, mode) / ms / 1e9,
                                 "extra_bytes": memory.get(mode)})
                del out
            except (RuntimeError, torch.OutOfMemoryError) as exc:   # a backend that refuses this shape
                rows.append({**base, "mode": "all", "error": str(exc).splitlines()[0][:200]})
            if device == "cuda":
                torch.cuda.empty_cache()
        if on_progress is not None:
            on_progress(rows)
    return rows
