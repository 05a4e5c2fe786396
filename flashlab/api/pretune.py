"""Tuning ahead of time: run the attention kernels (forward and backward) once for each shape
a job will use, so the autotuner times its candidates now rather than in the middle of the
first training steps, and keeps its decisions in the cache every later process reads.

    python -m flashlab tune --shape 8,16,2048,64 --shape 4,8,4096,128 --dtype bf16 --causal both
    flashlab.api.pretune.pretune([(8, 16, 2048, 64)], dtypes=(torch.bfloat16,))

`ship` turns a tuner's decisions into the file the package ships for a GPU model
(flashlab/tuned/<gpu>.json, read by `flashlab.launch.autotune` when a shape is not in the cache).
"""

from __future__ import annotations

import time
from datetime import date

import torch

from flashlab.launch import autotune, autotune_cache

from .attention import attention


def pretune(shapes, dtypes=(torch.bfloat16,), causal=(False, True), backward: bool = True,
            device="cuda", deadline_s: float | None = None, on_shape=None) -> list[dict]:
    """Tunes every ``(B, H, N, D)`` or ``(B, H, N, D, H_kv)`` shape in ``shapes`` for each dtype
    and causal flag: one forward (and backward) call each, through `flashlab.attention`, so the
    decisions land in the autotuner's cache. Shapes whose bucket is already decided cost one
    call. Stops starting new shapes after ``deadline_s`` seconds. Returns the decisions made
    (the tuner's report entries added), ``on_shape(shape, dtype, causal, seconds)`` is told
    about each shape as it finishes."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"device: tuning times the compiled kernels, which needs a CUDA device, got {device!r} "
                         "(under Triton's interpreter there is nothing to tune)")
    if not autotune.enabled():
        raise RuntimeError("FLASHLAB_AUTOTUNE=0 turns tuning off: unset it to pre-tune")
    start, before = time.perf_counter(), len(autotune.tuner.report())
    for shape in shapes:
        B, H, N, D, *rest = (int(x) for x in shape)
        h_kv = rest[0] if rest else H
        for dtype in dtypes:
            for is_causal in causal:
                if deadline_s is not None and time.perf_counter() - start > deadline_s:
                    return autotune.tuner.report()[before:]
                began = time.perf_counter()
                q = torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=backward)
                k, v = (torch.randn(B, h_kv, N, D, device=device, dtype=dtype, requires_grad=backward)
                        for _ in range(2))
                out = attention(q, k, v, is_causal=is_causal, enable_gqa=h_kv != H)
                if backward:
                    out.sum().backward()
                torch.cuda.synchronize(device)
                if on_shape is not None:
                    on_shape((B, H, N, D, h_kv), dtype, is_causal, time.perf_counter() - began)
    return autotune.tuner.report()[before:]


def ship(entries: list[dict], gpu: str, environment: dict | None = None, source: str = "") -> dict:
    """The shipped-decisions file for ``gpu`` from tuner report entries (``Autotuner.report``
    or the "autotune" list of a results record): {"format", "gpu", "environment", "source",
    "decisions": {shape key: config}}. Later entries win."""
    decisions = {}
    for entry in entries:
        kernel, _device, *rest = entry["key"]
        decisions[autotune.shipped_key((kernel, None, *rest))] = entry["chosen"]
    return {"format": autotune_cache.FORMAT, "gpu": gpu, "environment": environment or {},
            "source": source or f"flashlab.api.pretune, {date.today()}", "decisions": dict(sorted(decisions.items()))}
