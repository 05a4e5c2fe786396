"""Where an eager flashlab call at routing size spends its host time (issue 19): cProfile over
many forward+backward calls of flashlab.attention and of SDPA (B = 512, H = 8, N = 20, D = 16,
bf16 on a GPU; fp32 on the CPU, where the kernels run in Triton's interpreter and only the
profile's shape means anything), and torch.profiler's table of the CPU-side operators.

    python -m measurements.small_eager_profile OUT_DIR [--calls 300] [--shape B,H,N,D]

Writes OUT_DIR/small_eager_profile.txt: µs per call (wall, GPU synchronised once at the end),
then the top functions by own time and by cumulative time, then the operator table.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def per_call_us(fn, calls: int, device: str) -> float:
    for _ in range(20):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--shape", default="512,8,20,16")
    args = parser.parse_args(argv)
    from flashlab import attention
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    B, H, N, D = (int(x) for x in args.shape.split(","))
    if device == "cpu":
        B, H = min(B, 2), min(H, 2)
    q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)

    def step(fn):
        def run():
            q.grad = k.grad = v.grad = None
            fn(q, k, v).backward(grad)
        return run

    report = io.StringIO()
    calls = args.calls if device == "cuda" else 10
    for name, fn in (("flashlab", attention), ("sdpa", F.scaled_dot_product_attention)):
        run = step(fn)
        us = per_call_us(run, calls, device)
        report.write(f"== {name}: {us:.1f} µs per eager forward+backward ({device}, {dtype}, B,H,N,D = "
                     f"{B},{H},{N},{D}, {calls} calls)\n")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            run()
        if device == "cuda":
            torch.cuda.synchronize()
        profile.disable()
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(order).print_stats(35)
            report.write(f"-- {name}, by {order}\n{text.getvalue()}\n")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                run()
        report.write(f"-- {name}, torch.profiler (20 calls)\n"
                     + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25) + "\n")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "small_eager_profile.txt").write_text(report.getvalue())
    print(report.getvalue()[:3000])


if __name__ == "__main__":
    main()
