"""roofline: the two numbers notebook 02's roofline rests on, measured on the GPU at hand: the bf16
matmul rate PyTorch reaches and the device-to-device copy bandwidth (read + write counted), each
timed by `flashlab.launch.timing.time_ms` (triton.testing.do_bench's median)."""

from __future__ import annotations

import torch

from flashlab.bench.suite import Context, Suite

MATMUL_N = 8192
COPY_BYTES = 2 * 2**30


def run(ctx: Context) -> None:
    from flashlab.launch.timing import time_ms

    n = MATMUL_N
    left = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    right = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    matmul_ms = time_ms(lambda: torch.matmul(left, right), "cuda")
    source = torch.empty(COPY_BYTES // 2, device="cuda", dtype=torch.int16)
    target = torch.empty_like(source)
    copy_ms = time_ms(lambda: target.copy_(source), "cuda")
    moved = 2 * source.numel() * source.element_size()                    # read + write
    ctx.record.update(bf16_matmul={"shape": [n, n, n], "ms": matmul_ms, "tflops": 2 * n**3 / matmul_ms / 1e9},
                      copy={"bytes_read_and_written": moved, "ms": copy_ms, "tb_per_s": moved / copy_ms / 1e9},
                      how="flashlab.launch.timing.time_ms (triton.testing.do_bench, median, 25 ms warm-up, 100 ms "
                          "timed); matmul FLOPs 2·n³")
    ctx.log(f"bf16 matmul {ctx.record['bf16_matmul']['tflops']:.0f} TFLOP/s, "
            f"copy {ctx.record['copy']['tb_per_s']:.2f} TB/s")


SUITE = Suite(
    name="roofline",
    summary="notebook 02's roofline: bf16 matmul peak and copy bandwidth",
    measures="the bf16 matmul rate torch.matmul reaches (2·n³ FLOPs) and the bandwidth of a device-to-device "
             "copy (bytes read + written)",
    shapes=f"{MATMUL_N}³ bf16 matmul; a {COPY_BYTES // 2**30} GiB copy",
    budget_s=30, min_s=15, run=run, needs="gpu")
