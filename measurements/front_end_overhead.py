"""The Python cost of one flashlab attention call, without the kernels: every Triton launch
is replaced by a no-op, then an eager forward+backward (and a forward alone, no grad) is timed
per call on the CPU. What is left is what runs around the kernels: argument checks, the
autograd.Function, autotune look-ups, strides, grids, allocations. At routing-model sizes
(N ≤ 128) the kernels take tens of µs on a GPU, so this cost is the call's floor.

    python -m measurements.front_end_overhead [--calls 200] [--shape B,H,N,D] [--causal]

Prints CPU µs per call (the best of 25 repeats of --calls calls), and beside it the floor no
attention function can go under: an autograd.Function that only clones q, called and
differentiated the same way. Any CPU works; no GPU is used. The stub replaces ``kernel_for``
in every flashlab module that imported it, so every launch site (the dense kernels, the
small-sequence kernels) is stubbed the same way, before and after a change.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch


class _NoLaunch:
    """What the stubbed ``kernel_for`` returns: ``stub[grid](*args, **kwargs)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def kernels_stubbed():
    """Every flashlab launch site's ``kernel_for`` returns a no-op launcher while inside."""
    import flashlab
    saved = []
    for name, module in list(sys.modules.items()):
        if (name == "flashlab" or name.startswith("flashlab.")) and hasattr(module, "kernel_for"):
            if module.kernel_for is not None and module is not flashlab.launch.runtime:
                saved.append((module, module.kernel_for))
                module.kernel_for = lambda kernel, device: _NoLaunch()
    try:
        yield
    finally:
        for module, original in saved:
            module.kernel_for = original


def per_call_us(fn, calls: int, repeats: int = 25) -> float:
    """The least, over ``repeats``, of the mean CPU µs per call of ``fn`` over ``calls`` calls.
    CPU time of this thread (time.thread_time), not wall time: on a shared machine the time
    other processes hold the core is not counted, and the least disturbed repeat is kept."""
    for _ in range(min(calls, 50)):
        fn()                                      # warm-up: caches, first-call paths
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        times.append((time.thread_time() - start) / calls * 1e6)
    return min(times)


def measure(shape=(2, 8, 20, 16), is_causal=False, calls: int = 200, dtype=torch.float32) -> dict:
    """µs per eager call with the kernels stubbed: forward+backward, forward alone (no grad).
    fp32 inputs by default: CPU half-precision calls also pay an fp32 round trip
    (`flashlab.api.ops._on_cpu_in_fp32`) that a GPU call does not."""
    import flashlab

    # import every launch module first, so the stub reaches all of them
    import flashlab.launch.dense  # noqa: F401
    with contextlib.suppress(ImportError):
        import flashlab.launch.small  # noqa: F401
    B, H, N, D = shape
    q, k, v = (torch.randn(B, H, N, D, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(B, H, N, D, dtype=dtype)

    # .grad reset before each backward, as optimizer.zero_grad() leaves it: the gradients are
    # then handed over, not added (the stubbed kernels leave garbage that would be summed)
    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        out = flashlab.attention(q, k, v, is_causal=is_causal)
        out.backward(grad)

    def fwd():
        with torch.no_grad():
            flashlab.attention(q, k, v, is_causal=is_causal)

    def floor():
        q.grad = k.grad = v.grad = None
        _CloneQ.apply(q, k, v).backward(grad)

    with kernels_stubbed():
        return {"shape": list(shape), "is_causal": is_causal, "dtype": str(dtype),
                "fwd+bwd_us": per_call_us(fwd_bwd, calls), "fwd_us": per_call_us(fwd, calls),
                "floor_fwd+bwd_us": per_call_us(floor, calls)}


class _CloneQ(torch.autograd.Function):
    """The least an attention function's forward+backward can cost in eager PyTorch: one
    output allocated, one autograd node, three gradients handed back."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, grad, grad


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per repeat (default 200)")
    parser.add_argument("--shape", default="2,8,20,16", help="B,H,N,D (default 2,8,20,16)")
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args(argv)
    try:
        shape = tuple(int(x) for x in args.shape.split(","))
        assert len(shape) == 4
    except (ValueError, AssertionError):
        parser.error(f"--shape: expected four integers B,H,N,D, got {args.shape!r}")
    result = measure(shape, args.causal, args.calls)
    print(f"shape {shape} causal={args.causal}: forward+backward {result['fwd+bwd_us']:.1f} µs/call, "
          f"forward alone {result['fwd_us']:.1f} µs/call (kernels stubbed); floor "
          f"{result['floor_fwd+bwd_us']:.1f} µs (an autograd.Function that clones q)")


if __name__ == "__main__":
    main()
