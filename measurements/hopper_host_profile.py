"""Host time of flashlab's eager Hopper path (2026-12-06): at 4 x 16 heads x N = 1024 x D = 64 (bf16) an eager
forward+backward took 0.63 ms against 0.21 ms replayed from a CUDA graph (mid_n_eager_check.py): the backward's
Python. Per-call wall time of each piece with the GPU kept ahead (no synchronisation inside the loop), and a
cProfile of eager forward+backward calls. Run: PYTHONPATH=. python -m measurements.hopper_host_profile OUT.txt"""
import cProfile
import io
import pstats
import sys
import time

import torch

import flashlab
from flashlab.launch import hopper as hl
from measurements.inputs import attention_inputs


def per_call_us(fn, calls=200):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main(path=None):
    B, H, N, D = 4, 16, 1024, 64
    q, k, v, grad = attention_inputs(B, H, N, D)
    scale = D ** -0.5
    out, lse = hl.hopper_forward(q.detach(), k.detach(), v.detach(), False, scale)
    lines = [f"device {torch.cuda.get_device_name()}, torch {torch.__version__}; host µs per call (GPU not waited for)"]
    pieces = {
        "hopper_forward": lambda: hl.hopper_forward(q.detach(), k.detach(), v.detach(), False, scale),
        "hopper_backward": lambda: hl.hopper_backward(q.detach(), k.detach(), v.detach(), out, lse, grad, False,
                                                      scale),
        "one TensorDescriptor": lambda: hl._descriptor(q, 128, True),
        "torch.empty_like x3": lambda: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)),
        "flashlab.attention forward (grad)": lambda: flashlab.attention(q, k, v),
        "flashlab.attention forward+backward": lambda: torch.autograd.grad(flashlab.attention(q, k, v), (q, k, v),
                                                                           grad),
        "SDPA forward+backward": lambda: torch.autograd.grad(
            torch.nn.functional.scaled_dot_product_attention(q, k, v), (q, k, v), grad),
    }
    for name, fn in pieces.items():
        lines.append(f"  {name:40s} {per_call_us(fn):8.1f}")
        print(lines[-1], flush=True)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(100):
        torch.autograd.grad(flashlab.attention(q, k, v), (q, k, v), grad)
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    lines.append(text.getvalue())
    print(text.getvalue())
    if path:
        open(path, "w").write("\n".join(lines) + "\n")



def threads(path=None):
    """Whether the backward's host time grows on autograd's device thread: the same kernels called from
    the main thread and from a custom Function's backward (which autograd runs on its CUDA worker thread)."""
    from flashlab.api import ops
    B, H, N, D = 4, 16, 1024, 64
    q, k, v, grad = attention_inputs(B, H, N, D)
    scale = D ** -0.5
    out, lse = hl.hopper_forward(q.detach(), k.detach(), v.detach(), False, scale)
    qd, kd, vd = q.detach(), k.detach(), v.detach()

    class Probe(torch.autograd.Function):
        body = None

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            Probe.body()
            return g

    x = torch.randn(8, device="cuda", requires_grad=True)
    bodies = {
        "nothing": lambda: None,
        "hopper_backward": lambda: hl.hopper_backward(qd, kd, vd, out, lse, grad, False, scale),
        "ops.backward_kernels": lambda: ops.backward_kernels(grad, qd, kd, vd, out, lse, None, 0.0, None, False,
                                                             scale, "ieee", False),
        "preprocess launch only": lambda: hl.kernel_for(hl.flash_backward_preprocess_kernel, q.device)[(64 * 16,)](
            out, grad, lse, *hl._strides(out), *hl._strides(grad), H, N, D, BLOCK_M=64, BLOCK_D=D),
    }
    lines = ["host µs per call: from the main thread | inside autograd's backward (minus 'nothing' there)"]
    base = None
    for name, body in bodies.items():
        Probe.body = body
        main = per_call_us(body)
        inside = per_call_us(lambda: torch.autograd.grad(Probe.apply(x).sum(), x))
        base = inside if base is None else base
        lines.append(f"  {name:28s} {main:8.1f} | {inside - base:8.1f}  (all {inside:.1f})")
        print(lines[-1], flush=True)
    if path:
        open(path, "a").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    (threads if "--threads" in sys.argv else main)(*[a for a in sys.argv[1:2] if a != "--threads"])
