"""How much memory naive attention needs: a byte-exact model, and a way to measure it.

The model follows `flashlab.naive_attention` op by op (tensor sizes in elements, times
the element size of the dtype):

    forward                          backward (autograd, retain_graph=False)
    S  = (Q·scale) Kᵀ   Nq·Nk        dV = Pᵀ dO             Nk·Dv
    P  = softmax(S)     Nq·Nk        dP = dO Vᵀ             Nq·Nk
    Q·scale             Nq·D         dS = P ∘ (dP − rowsum(dP ∘ P))   Nq·Nk
    O  = P V            Nq·Dv        dQ = dS K · scale, dK = dSᵀ (Q·scale)

Autograd saves P (for dV and dS) and Q·scale (for dK); q, k, v are the caller's tensors.
Every count is per (batch, head) pair and multiplied by B·H.

Peaks, over and above the inputs (dominant terms; the properties below give exact maxima):
    inference (no_grad):      S + P                       (S is freed once P exists)
    forward with autograd:    S + P + Q·scale
    kept after forward:       P + Q·scale + O
    forward + backward:       P + dP + dS + Q·scale + O + dV   (at the softmax backward)

The three N×N terms of the last line are why naive attention runs out of memory: they
grow like N² while everything else grows like N·D.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NaiveAttentionMemory:
    """Predicted bytes of every intermediate of naive attention (all B·H heads)."""

    scores: int            # S = Q Kᵀ·scale, (B, H, Nq, Nk)
    probabilities: int     # P = softmax(S), (B, H, Nq, Nk); saved for backward
    scaled_queries: int    # Q·scale, (B, H, Nq, D); saved for backward
    output: int            # O = P V, (B, H, Nq, Dv)
    grad_probabilities: int  # dP = dO Vᵀ, (B, H, Nq, Nk)
    grad_scores: int       # dS, (B, H, Nq, Nk)
    grad_values: int       # dV, (B, H, Nk, Dv)

    @property
    def inference_peak(self) -> int:
        """Peak extra bytes of a forward under ``torch.no_grad()``: the largest of
        (Q·scale + S) during the first einsum, (S + P) in the softmax, (P + O) last."""
        return max(self.scaled_queries + self.scores, self.scores + self.probabilities,
                   self.probabilities + self.output)

    @property
    def forward_peak(self) -> int:
        """Peak extra bytes of a forward that records the autograd graph (Q·scale is
        kept for the backward, so it stays alive throughout)."""
        return self.scaled_queries + max(self.scores + self.probabilities,
                                         self.probabilities + self.output)

    @property
    def saved_for_backward(self) -> int:
        """Bytes alive between forward and backward: what autograd keeps, and O."""
        return self.probabilities + self.scaled_queries + self.output

    @property
    def training_peak(self) -> int:
        """Peak extra bytes of forward + backward, reached in the softmax backward.

        Exact while the N×N terms dominate (Nq and Nk of a few times D or more); at
        tiny N the N·D temporaries of the dQ/dK einsums, not modelled, take over."""
        return (self.probabilities + self.grad_probabilities + self.grad_scores
                + self.scaled_queries + self.output + self.grad_values)


def dtype_bytes(dtype: torch.dtype) -> int:
    """Bytes per element of a torch dtype (2 for fp16/bf16, 4 for fp32, …)."""
    return torch.empty((), dtype=dtype).element_size()


def predict_naive_attention_memory(batch: int, heads: int, seq_len: int, head_dim: int,
                                   dtype: torch.dtype = torch.float32,
                                   kv_seq_len: int | None = None,
                                   value_dim: int | None = None) -> NaiveAttentionMemory:
    """Predict the bytes of each intermediate of `naive_attention` for B, H, N, D, dtype.

    ``kv_seq_len`` (Nk) and ``value_dim`` (Dv) default to ``seq_len`` and ``head_dim``.
    Valid without a mask (with ``is_causal`` too: the causal mask is a boolean N×N
    tensor of 1 byte per element, not counted here).
    """
    for name, value in (("batch", batch), ("heads", heads), ("seq_len", seq_len),
                        ("head_dim", head_dim)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name}: expected a positive integer, got {value!r}.")
    n_keys = seq_len if kv_seq_len is None else kv_seq_len
    d_value = head_dim if value_dim is None else value_dim
    bh, size = batch * heads, dtype_bytes(dtype)
    square = bh * seq_len * n_keys * size
    return NaiveAttentionMemory(
        scores=square,
        probabilities=square,
        scaled_queries=bh * seq_len * head_dim * size,
        output=bh * seq_len * d_value * size,
        grad_probabilities=square,
        grad_scores=square,
        grad_values=bh * n_keys * d_value * size,
    )


def largest_seq_len(capacity_bytes: float, batch: int, heads: int, head_dim: int,
                    dtype: torch.dtype = torch.float16, training: bool = True) -> int:
    """Largest N whose naive-attention peak (training or inference) fits in
    ``capacity_bytes``, counting the inputs q, k, v (and their gradients in training).

    Solved exactly by bisection over the model above.
    """
    def needed(n: int) -> int:
        m = predict_naive_attention_memory(batch, heads, n, head_dim, dtype)
        inputs = 3 * m.scaled_queries * (2 if training else 1)
        return inputs + (m.training_peak if training else m.inference_peak)

    lo, hi = 0, 1
    while needed(hi) <= capacity_bytes:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if needed(mid) <= capacity_bytes else (lo, mid)
    return lo


@dataclass(frozen=True)
class MemoryMeasurement:
    peak_bytes: int   # peak bytes allocated during the call, above what was allocated before
    method: str       # what exactly was measured, in words


def measure_peak_memory(fn, device: torch.device | str | None = None) -> MemoryMeasurement:
    """Run ``fn()`` once and measure the peak memory it allocated beyond what was
    already allocated.

    CUDA: ``torch.cuda.max_memory_allocated`` − ``memory_allocated`` before the call,
    i.e. the peak of live tensor bytes in PyTorch's caching allocator (not the bytes it
    reserved from the driver, not other processes).

    CPU: the peak of live tensor bytes that PyTorch's CPU allocator handed out during
    the call, rebuilt from the profiler's allocation and free events (PyTorch's memory
    timeline). It is not the process's resident memory (RSS), which also holds the
    interpreter, libraries and freed-but-cached pages.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        return MemoryMeasurement(peak, "CUDA: peak allocated tensor bytes (caching allocator)")
    if device.type != "cpu":
        raise ValueError(f"device: {device} is not supported; use 'cpu' or 'cuda'.")
    return MemoryMeasurement(_cpu_peak_bytes(fn),
                             "CPU: peak live tensor bytes from PyTorch's profiler memory "
                             "timeline (not process RSS)")


def _cpu_peak_bytes(fn) -> int:
    # PyTorch exposes no CPU counterpart of torch.cuda.max_memory_allocated; its
    # profiler records every allocation and free, and its memory-timeline module turns
    # them into live bytes over time. That module is private, so fail loudly if it moves.
    from torch.profiler import ProfilerActivity, profile
    try:
        from torch.profiler._memory_profiler import Action
    except ImportError as exc:  # pragma: no cover - depends on the PyTorch version
        raise RuntimeError("measure_peak_memory on CPU needs torch.profiler's memory "
                           "profile, which this PyTorch does not have") from exc
    with _stderr_to_devnull(), profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                                       record_shapes=True, with_stack=True) as prof:
        fn()
    # The memory profile is a time-ordered list of (time, action, tensor, bytes).
    # Tensors that existed before the call appear as PREEXISTING: they are the
    # baseline, not part of the peak.
    live = peak = 0
    for _, action, (key, _), size in prof._memory_profile().timeline:
        if key.device.type != "cpu":
            continue
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return int(peak)


@contextlib.contextmanager
def _stderr_to_devnull():
    # The profiler's C++ backend writes start/stop markers with timestamps straight to
    # file descriptor 2; they would clutter notebooks and break nbval's comparison.
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def format_bytes(n: float) -> str:
    """Human-readable bytes in powers of 1024 (KiB, MiB, GiB)."""
    if n < 1024:
        return f"{int(n)} B"
    exponent = min(int(math.log(n, 1024)), 4)
    return f"{n / 1024 ** exponent:.2f} {['B', 'KiB', 'MiB', 'GiB', 'TiB'][exponent]}"
