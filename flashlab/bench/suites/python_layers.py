"""python-layers: what flashlab's own Python costs per eager call on the small path, with the
kernels taken out: every small-path launch is replaced by a no-op, so what is left is the host's
part of a call, on any machine, the CPU included. µs per call (`flashlab.launch.timing.wall_ms`:
median of 5 rounds of back-to-back calls, each round after 20 warm-up calls):

  attention_fwd_bwd      flashlab.attention(q, k, v).backward(grad): a training step's share
  attention_fwd_grad     the same call, autograd recording, no backward
  attention_fwd_nograd   the same call under no_grad
  views_fwd_bwd          attention on q, k, v as a layer passes them, three views of one (B, N, 3, H, D)
                         projection split along dimension 2: autograd stacks their gradients (a copy)
  packed_fwd_bwd         flashlab.attention_qkvpacked on that projection: no stack
  thin_fwd_bwd           the small kernels behind the thinnest autograd.Function (no checks, no options:
                         `flashlab.bench.suites.host_time.ThinSmallAttention`)
  empty_fwd_bwd          an autograd.Function that allocates and computes nothing
  cpp_op_fwd_bwd         (x * 2).backward(grad): a C++ op and its C++ backward node, for scale

``attention - thin`` (layers_above_thin) is what flashlab's layers add to the floor of a Python
autograd.Function around two launches. On a GPU the allocations and the engine's device thread are
included, the kernels are not (host-time times the whole call)."""

from __future__ import annotations

import contextlib
import platform
import subprocess

import torch

from flashlab.bench.suite import Context, Suite

GPU_SHAPE, CPU_SHAPE = (512, 8, 20, 16), (2, 2, 20, 16)      # (B, H, N, D)
CALLS, QUICK_CALLS = 2000, 20


@contextlib.contextmanager
def kernels_removed():
    """Every small-path launch a no-op for the duration: the interpreted twins on a CPU
    (`flash_small.kernel_for`) and the direct launch on a GPU (`flash_small.direct_launch`)."""
    from flashlab.launch import small as flash_small

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


def measure(calls: int, device: str) -> dict:
    from flashlab.api.attention import attention, attention_qkvpacked
    from flashlab.bench.suites.host_time import EmptyFunction, ThinSmallAttention
    from flashlab.launch.timing import wall_ms

    def median_us(fn):
        return wall_ms(fn, calls, device, warmup=20, repeats=5) * 1e3

    B, H, N, D = GPU_SHAPE if device == "cuda" else CPU_SHAPE
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
            "attention_fwd_bwd": median_us(fwd_bwd(lambda: attention(q, k, v))),
            "attention_fwd_grad": median_us(lambda: attention(q, k, v)),
            "attention_fwd_nograd": median_us(nograd),
            "views_fwd_bwd": median_us(fwd_bwd(views, grad_packed)),
            "packed_fwd_bwd": median_us(fwd_bwd(lambda: attention_qkvpacked(qkv), grad_packed)),
            "thin_fwd_bwd": median_us(fwd_bwd(lambda: ThinSmallAttention.apply(q, k, v))),
            "empty_fwd_bwd": median_us(fwd_bwd(lambda: EmptyFunction.apply(q, k, v))),
            "cpp_op_fwd_bwd": median_us(fwd_bwd(lambda: x * 2)),
        }
    rows["layers_above_thin"] = rows["attention_fwd_bwd"] - rows["thin_fwd_bwd"]
    return {"shape": [B, H, N, D], "dtype": str(dtype), "device": device, "us_per_call": rows}


def commit() -> str:
    """The checkout's commit, and whether flashlab/ has uncommitted changes ("unknown" outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "flashlab"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    return (head + (" with uncommitted changes to flashlab/" if head and dirty else "")) or "unknown"


def run(ctx: Context) -> None:
    ctx.record["environment"].update(machine=platform.processor() or platform.machine(), commit=commit())
    ctx.record.update(measure(QUICK_CALLS if ctx.quick else CALLS, ctx.device))
    ctx.record["how"] = __doc__
    for name, value in ctx.record["us_per_call"].items():
        ctx.log(f"{name:24s} {value:8.1f} µs")


SUITE = Suite(
    name="python-layers",
    summary="flashlab's own Python per eager small-path call, kernels removed",
    measures="host µs per call of flashlab.attention (forward+backward, forward with and without autograd), "
             "attention on three views against attention_qkvpacked, the thinnest autograd.Function around the "
             "small kernels, an empty Function and a C++ op, every launch replaced by a no-op",
    shapes=f"(B, H, N, D) = {GPU_SHAPE}, bf16 on a GPU; {CPU_SHAPE}, fp32 on a CPU; {CALLS} calls a figure "
           f"(--quick: {QUICK_CALLS})",
    budget_s=120, min_s=10, run=run, needs="any")
