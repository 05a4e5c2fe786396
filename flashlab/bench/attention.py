"""The attention benchmark of notebook 07 and ``python -m flashlab bench``: flashlab against
naive attention, every SDPA backend and FlexAttention, forward, backward and both, in
TFLOP/s (`flashlab.launch.timing.attention_flops`) and extra memory."""

from __future__ import annotations

import contextlib

import torch

from flashlab.api.attention import attention
from flashlab.launch.timing import attention_flops, cpu_threads, extra_memory, time_ms
from flashlab.reference.naive import naive_attention


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
    # size flex_attention would silently fall back to its unfused implementation,
    # so allow one compiled variant per shape of the sweep.
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
    # On a CPU (the notebooks' tiny live shapes) one thread: see timing.cpu_threads
    with cpu_threads(1) if device == "cpu" else contextlib.nullcontext():
        for n, d, is_causal, dtype in tqdm(configs, desc="attention benchmark"):
            _benchmark_shape(rows, impls, n, d, is_causal, dtype, tokens, heads, modes, device, flex_seq_lens, skip,
                             warmup_ms, rep_ms)
            if on_progress is not None:
                on_progress(rows)
    return rows


def _benchmark_shape(rows, impls, n, d, is_causal, dtype, tokens, heads, modes, device, flex_seq_lens, skip,
                     warmup_ms, rep_ms):
    """`benchmark_attention`'s rows for one shape, every implementation, appended to ``rows``."""
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
