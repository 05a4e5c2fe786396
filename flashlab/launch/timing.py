"""How long, how much memory, how many FLOPs, and the hardware's peak: the measuring layer
at the bottom of flashlab. It imports nothing from the package, so anything may use it
(the autotuner, the trainer, the benchmark harness) without an import circle.

Timing: on a GPU the median of `triton.testing.do_bench` (CUDA events, after warm-up, L2
flushed between runs); on a CPU the median of a plain wall-clock timer over a few runs
(Triton's benchmarking needs a GPU driver)."""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

CPU_MAX_RUNS = 10_000          # a call of microseconds would otherwise run rep_ms / its time times


def time_ms(fn, device: str | None = None, warmup_ms: int = 25, rep_ms: int = 100, cpu_runs: int = 5) -> float:
    """Median time of ``fn()`` in milliseconds. On a GPU, `triton.testing.do_bench` (the L2 cache
    flushed before each call); on a CPU, calls until ``warmup_ms`` have passed (at least one), then
    until ``rep_ms`` have (at least ``cpu_runs`` calls, at most CPU_MAX_RUNS), timed one by one."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    start = time.perf_counter()
    fn()
    while (time.perf_counter() - start) * 1e3 < warmup_ms:
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < cpu_runs or ((time.perf_counter() - start) * 1e3 < rep_ms and len(times) < CPU_MAX_RUNS):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def wall_ms(fn, calls: int = 1, device: str | None = None, warmup: int = 0, repeats: int = 1) -> float:
    """Wall-clock milliseconds per call of ``fn()`` run ``calls`` times back to back, the GPU
    synchronised once before and once after: what a loop pays that neither flushes the cache nor
    waits between calls, the host's time included where a call is shorter than its own launch
    cost (`time_ms` times each call alone, after an L2 flush). Each of ``repeats`` rounds runs
    ``warmup`` untimed calls first; the median round is returned."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rounds = []
    for _ in range(repeats):
        for _ in range(warmup):
            fn()
        _synchronize(device)
        watch = Stopwatch()
        for _ in range(calls):
            fn()
        _synchronize(device)
        rounds.append(watch.seconds() * 1e3 / calls)
    return statistics.median(rounds)


class Stopwatch:
    """Seconds since it was made: how long a piece of work took as a whole, compilation and
    warm-up included (a time budget, a phase of a run), where `time_ms` and `wall_ms` time calls."""

    def __init__(self):
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.start


@contextlib.contextmanager
def cpu_threads(n: int):
    """PyTorch's CPU ops on ``n`` intra-op threads for the duration. Timing small CPU shapes on a
    shared machine wants one: with two threads on two cores and another process busy, each op's
    threads wait for each other a scheduler slice (the course's CPU: 32 ms for naive attention at
    N = 64, 0.13 ms on one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def capture_cuda_graph(fn):
    """``(graph, output)``: ``fn()`` captured once in a CUDA graph, and what the captured call
    returned (its tensors are the graph's static outputs, rewritten by every ``graph.replay()``).
    ``fn`` must not synchronise with the host; it runs three times on a side stream first
    (compilation, autotuning, allocator warm-up), as torch.cuda.graphs asks before a capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn()
    return graph, output


def time_graph_ms(fn, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median time of ``fn()`` captured once in a CUDA graph and replayed (milliseconds): the
    GPU's time alone, without the Python and launch cost that `time_ms` also counts when a call
    is shorter than its own overhead (`capture_cuda_graph` says what ``fn`` must allow)."""
    graph, _ = capture_cuda_graph(fn)
    return time_ms(graph.replay, "cuda", warmup_ms, rep_ms)


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


def attention_flops(batch, heads, seq_len, head_dim, is_causal, mode) -> float:
    """FLOPs as FlashAttention's papers count them: 4·B·H·N²·D forward, halved when
    causal; the backward is 2.5× the forward (so fwd+bwd is 3.5×)."""
    forward = 4 * batch * heads * seq_len * seq_len * head_dim * (0.5 if is_causal else 1.0)
    return forward * {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[mode]


# Dense peak FLOP/s of GPUs the course meets, for model-FLOPs utilisation (MFU).
# Vendor datasheet numbers without sparsity; fp32 is the non-tensor-core rate.
PEAK_FLOPS = {
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
}


def peak_flops(device_name: str, compute_dtype: torch.dtype) -> float | None:
    """The datasheet peak for this GPU when its matmuls run in ``compute_dtype`` (fp32 counts
    as TF32 when PyTorch allows TF32 matmuls), or None for a GPU the table does not know."""
    kind = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(compute_dtype)
    if kind is None:
        kind = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    for gpu, peaks in PEAK_FLOPS.items():
        if gpu in device_name:
            return peaks[kind]
    return None
