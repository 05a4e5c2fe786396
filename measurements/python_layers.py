"""What flashlab's own Python costs per eager call on the small path, with the kernels taken out
(issue 19): every small-path launch is replaced by a no-op, so what is left is the host's part of
a call, on any machine, the CPU included.

    PYTHONPATH=. python -m measurements.python_layers OUT_DIR [--calls 2000] [--label NAME]

Times, in µs per call (median of 5 repeats of ``--calls`` back-to-back calls, each after 20
warm-up calls), at (B, H, N, D) = (2, 2, 20, 16), fp32 on a CPU (few enough tiles for the kernels' route)
or (512, 8, 20, 16), bf16 on a GPU:

  attention_fwd_bwd      flashlab.attention(q, k, v).backward(grad): a training step's share
  attention_fwd_grad     the same call, autograd recording, no backward
  attention_fwd_nograd   the same call under no_grad
  views_fwd_bwd          attention on q, k, v as a layer passes them, three views of one (B, N, 3, H, D)
                         projection split along dimension 2: autograd stacks their gradients (a copy)
  packed_fwd_bwd         flashlab.attention_qkvpacked on that projection: no stack
  thin_fwd_bwd           the small kernels behind the thinnest autograd.Function (no checks, no options:
                         `measurements.small_host_time.ThinSmallAttention`)
  empty_fwd_bwd          an autograd.Function that allocates and computes nothing
  cpp_op_fwd_bwd         (x * 2).backward(grad): a C++ op and its C++ backward node, for scale

``attention - thin`` is what flashlab's layers add to the floor of a Python autograd.Function
around two launches. Run at two commits (``--label``) to see a change's effect; on a GPU the
allocations and the engine's device thread are included, the kernels are not (see
`measurements.small_host_time` for the whole call). Writes OUT_DIR/python_layers_<label>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import subprocess
from pathlib import Path

import torch

from flashlab import attention, attention_qkvpacked
from flashlab.launch import small as flash_small

from .small_eager_profile import per_call_us
from .small_host_time import EmptyFunction, ThinSmallAttention


@contextlib.contextmanager
def kernels_removed():
    """Every small-path launch a no-op for the duration: the interpreted twins on a CPU
    (`flash_small.kernel_for`) and the direct launch on a GPU (`flash_small.direct_launch`)."""
    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

        @staticmethod
        def launch(*args, **kwargs):
            return None

    saved = flash_small.kernel_for, flash_small.direct_launch
    flash_small.kernel_for, flash_small.direct_launch = (lambda kernel, device: NoLaunch()), NoLaunch
    try:
        yield
    finally:
        flash_small.kernel_for, flash_small.direct_launch = saved


def median_us(fn, calls: int, device: str, repeats: int = 5) -> float:
    """The median over ``repeats`` of `small_eager_profile.per_call_us` (each one warmed up)."""
    return statistics.median(per_call_us(fn, calls, device) for _ in range(repeats))


def measure(calls: int) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    B, H, N, D = (512, 8, 20, 16) if device == "cuda" else (2, 2, 20, 16)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v, x = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(4))
    grad = torch.randn_like(q)
    qkv = torch.randn(B, N, 3, H, D, device=device, dtype=dtype, requires_grad=True)
    grad_packed = torch.randn(B, N, H, D, device=device, dtype=dtype)

    def fwd_bwd(fn, grad=grad):
        def step():
            q.grad = k.grad = v.grad = x.grad = qkv.grad = None
            fn().backward(grad)
        return step

    def views():
        return attention(*(t.transpose(1, 2) for t in qkv.unbind(2))).transpose(1, 2)

    def nograd():
        with torch.no_grad():
            attention(q, k, v)

    with kernels_removed():
        rows = {
            "attention_fwd_bwd": median_us(fwd_bwd(lambda: attention(q, k, v)), calls, device),
            "attention_fwd_grad": median_us(lambda: attention(q, k, v), calls, device),
            "attention_fwd_nograd": median_us(nograd, calls, device),
            "views_fwd_bwd": median_us(fwd_bwd(views, grad_packed), calls, device),
            "packed_fwd_bwd": median_us(fwd_bwd(lambda: attention_qkvpacked(qkv), grad_packed), calls, device),
            "thin_fwd_bwd": median_us(fwd_bwd(lambda: ThinSmallAttention.apply(q, k, v)), calls, device),
            "empty_fwd_bwd": median_us(fwd_bwd(lambda: EmptyFunction.apply(q, k, v)), calls, device),
            "cpp_op_fwd_bwd": median_us(fwd_bwd(lambda: x * 2), calls, device),
        }
    rows["layers_above_thin"] = rows["attention_fwd_bwd"] - rows["thin_fwd_bwd"]
    return {"shape": [B, H, N, D], "dtype": str(dtype), "device": device, "us_per_call": rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--label", default="now")
    args = parser.parse_args(argv)
    result = measure(args.calls)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if commit and subprocess.run(["git", "status", "--porcelain", "flashlab"], capture_output=True, text=True).stdout:
        commit += " with uncommitted changes to flashlab/"
    result["environment"] = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
                             "torch": torch.__version__, "commit": commit or "unknown", "label": args.label,
                             "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    result["how"] = __doc__
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"python_layers_{args.label}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for name, value in result["us_per_call"].items():
        print(f"{name:24s} {value:8.1f} µs")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
