"""The two numbers notebook 02's roofline rests on, measured on the GPU at hand: the bf16 matmul
rate PyTorch reaches (8192 × 8192 × 8192, ``torch.matmul``) and the device-to-device copy
bandwidth (a 2 GiB tensor copied, read + write counted), each timed by the project's GPU timer
(`flashlab.launch.timing.time_ms`: triton.testing.do_bench's median).

    PYTHONPATH=. python -m measurements.roofline_peaks OUT_DIR

Writes OUT_DIR/roofline_peaks.json (with flashlab.bench.records.environment(): which GPU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from flashlab.bench.records import environment
from flashlab.launch.timing import time_ms


def measure() -> dict:
    n = 8192
    left = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    right = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    matmul_ms = time_ms(lambda: torch.matmul(left, right), "cuda")
    source = torch.empty(2**30, device="cuda", dtype=torch.int16)         # 2 GiB
    target = torch.empty_like(source)
    copy_ms = time_ms(lambda: target.copy_(source), "cuda")
    moved = 2 * source.numel() * source.element_size()                    # read + write
    return {"environment": environment(),
            "bf16_matmul": {"shape": [n, n, n], "ms": matmul_ms, "tflops": 2 * n**3 / matmul_ms / 1e9},
            "copy": {"bytes_read_and_written": moved, "ms": copy_ms, "tb_per_s": moved / copy_ms / 1e9},
            "how": "flashlab.launch.timing.time_ms (triton.testing.do_bench, median, 25 ms warm-up, 100 ms timed); "
                   "matmul FLOPs 2·n³"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m measurements.roofline_peaks OUT_DIR", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("roofline_peaks: needs a CUDA GPU (this machine has none)", file=sys.stderr)
        return 2
    record = measure()
    out = Path(argv[0]) / "roofline_peaks.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print(f"{record['environment'].get('gpu')}: bf16 matmul {record['bf16_matmul']['tflops']:.0f} TFLOP/s, "
          f"copy {record['copy']['tb_per_s']:.2f} TB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
