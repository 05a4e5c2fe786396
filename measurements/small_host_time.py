"""Where an eager small-path forward+backward spends its time on a GPU (issue 19), piece by piece,
with Triton's launch and the direct launch (`flashlab.launch.direct`) side by side.

    python -m measurements.small_host_time OUT_DIR [--calls 400]

Every figure is wall-clock µs per call over ``--calls`` back-to-back calls, the GPU synchronised
once before and once after (no L2 flush between calls, unlike `flashlab.launch.timing.time_ms`: a
training loop does not flush either), median of 5 repeats. A call shorter than its own host
time is timed at its host time; the GPU time alone is the CUDA-graph replay. Pieces, at
B = 512, H = 8, bf16 (the routing encoder's attention) and N, D = 20/50/100 × 16, 128 × 64:

  graph             forward+backward replayed from a CUDA graph: the GPU's time alone
  fwd_nograd        flashlab.attention under no_grad
  fwd_grad          flashlab.attention with autograd recording, no backward
  fwd_bwd           flashlab.attention(...).backward(grad): what a training step pays (since
                    2026-12-04's third session through the small path's own Function, `flash_small.SmallAttention`)
  general_route_fwd_bwd  the same kernels through the general eager route attention took before,
                    `ops.EagerFlashAttention` (eleven inputs, `flash_launch`'s dispatch), called directly
  bwd_direct_call   flashlab.api.ops.backward_kernels called on the main thread (no autograd engine)
  launch_fwd        the small forward kernel launched alone with prebuilt arguments
  empty_function    an autograd.Function whose forward and backward only allocate, fwd+bwd
                    (also with flashlab's eleven inputs and two outputs: ..._like_flashlab)
  thin_small        the small kernels behind the thinnest autograd.Function (no options)
  sdpa_*            SDPA, default dispatch and each backend, fwd_bwd and fwd_nograd

each with FLASHLAB_DIRECT_LAUNCH=0 and =1 where it matters; then a correctness check of the
direct launch (outputs and gradients identical, bit for bit, to Triton's launch, with masks,
causal, dropout, GQA), a cProfile of fwd_bwd, and torch.profiler's CPU/CUDA operator table.
Writes OUT_DIR/small_host_time.json and small_host_time.txt.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from flashlab.launch import small as flash_small

from .small_eager_profile import per_call_us
from .small_graphs import _implementations, _steps, switch

SHAPES = [(20, 16), (50, 16), (100, 16), (128, 64)]
B, H = 512, 8


def direct(on: bool):
    """FLASHLAB_DIRECT_LAUNCH for the duration."""
    return switch("FLASHLAB_DIRECT_LAUNCH", on)


def wall_us(fn, calls: int, repeats: int = 5) -> float:
    """The median over ``repeats`` of `small_eager_profile.per_call_us` (each one warmed up)."""
    return statistics.median(per_call_us(fn, calls, "cuda") for _ in range(repeats))


class EmptyFunction(torch.autograd.Function):
    """Allocates its outputs and gradients, computes nothing: the cost of a Python
    autograd.Function and of the autograd engine's call into Python on a CUDA backward."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class EmptyFunctionLikeFlashlab(torch.autograd.Function):
    """EmptyFunction with flashlab's signature: eleven inputs (q, k, v, then eight options), two
    outputs of which the second (the log-sum-exp) is non-differentiable, no materialised
    gradients, eleven gradients returned: what that signature alone costs."""

    @staticmethod
    def forward(ctx, q, k, v, mask, dropout_p, seed, is_causal, scale, precision, left, right):
        ctx.set_materialize_grads(False)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, lse, mask, seed)
        ctx.options = (dropout_p, is_causal, scale, precision)
        return torch.empty_like(q), lse

    @staticmethod
    def backward(ctx, grad, _grad_lse):
        q, k, v, lse, mask, seed = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), *(None,) * 8


class ThinSmallAttention(torch.autograd.Function):
    """The small kernels behind the thinnest autograd.Function: no checks, no dispatch, no
    options (no mask, no dropout, not causal, default scale): the floor of an eager call made of
    a Python autograd.Function and two Triton launches."""

    @staticmethod
    def forward(ctx, q, k, v):
        out, lse = flash_small.small_forward(q, k, v, q, (0, 0, 0, 0), False, False, 0.0, 0, False,
                                             q.shape[-1] ** -0.5, "ieee")
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        return flash_small.small_backward(q, k, v, out, lse, grad.contiguous(), q, (0, 0, 0, 0), False, False, 0.0,
                                          0, False, q.shape[-1] ** -0.5, "ieee")


def pieces(n: int, d: int, calls: int) -> dict:
    from flashlab import attention
    from flashlab.api import ops
    from flashlab.launch import direct as direct_launch
    from flashlab.launch.small import LOG2E, small_forward_kernel
    from flashlab.launch.timing import time_graph_ms
    q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    scale = d ** -0.5

    def fwd_bwd(fn=attention):
        return _steps(fn, q, k, v, grad)[1]

    def fwd_nograd(fn=attention):
        return _steps(fn, q, k, v, grad)[0]

    def fwd_grad():
        attention(q, k, v)

    out, lse = ops.forward_kernels(q.detach(), k.detach(), v.detach(), None, 0.0, None, False, scale, "ieee")

    def bwd_direct_call():
        ops.backward_kernels(grad, q.detach(), k.detach(), v.detach(), out, lse, None, 0.0, None, False, scale,
                             "ieee", False)

    row = {"N": n, "D": d}
    row["graph_us"] = time_graph_ms(fwd_bwd(), 10, 40) * 1e3
    for on in (False, True):
        tag = "direct" if on else "triton"
        with direct(on):
            row[f"fwd_nograd_{tag}"] = wall_us(fwd_nograd(), calls)
            row[f"fwd_grad_{tag}"] = wall_us(fwd_grad, calls)
            row[f"fwd_bwd_{tag}"] = wall_us(fwd_bwd(), calls)
            row[f"bwd_direct_call_{tag}"] = wall_us(bwd_direct_call, calls)

    # the forward kernel alone, arguments prebuilt (what the plan holds), Triton's launch vs direct
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o, l_ = torch.empty_like(qd), torch.empty(B, H, n, device="cuda")
    ops.forward_kernels(qd, kd, vd, None, 0.0, None, False, scale, "ieee")     # makes the plan
    plan = next(p for key, p in flash_small._plans.items() if key[0] == "forward" and key[1] == qd.shape)
    grid, ints, constants = plan[:3]
    args = (qd, kd, vd, qd, o, l_, *ints, scale * LOG2E, 0, 0.0, 0)        # ..., seed, dropout_p, l_fix_offset
    row["launch_fwd_triton"] = wall_us(lambda: small_forward_kernel[grid](*args, **constants), calls)
    with direct(True):
        row["launch_fwd_direct"] = wall_us(lambda: direct_launch.launch(small_forward_kernel, plan, grid, args, 6,
                                                                        constants), calls)
    row["empty_function_fwd_bwd"] = wall_us(fwd_bwd(EmptyFunction.apply), calls)
    row["empty_function_like_flashlab_fwd_bwd"] = wall_us(
        fwd_bwd(lambda q_, k_, v_: EmptyFunctionLikeFlashlab.apply(q_, k_, v_, None, 0.0, None, False, 0.25, "ieee",
                                                                   -1, -1)[0]), calls)
    with direct(True):
        row["thin_small_fwd_bwd_direct"] = wall_us(fwd_bwd(ThinSmallAttention.apply), calls)
        row["general_route_fwd_bwd_direct"] = wall_us(fwd_bwd(
            lambda q_, k_, v_: ops.EagerFlashAttention.apply(q_, k_, v_, None, 0.0, None, False, scale, "ieee", -1,
                                                             -1)[0]), calls)
    row["torch_empty_like_x3"] = wall_us(lambda: (torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)),
                                         calls)
    # SDPA's default dispatch, then each backend as small_graphs' table times it
    backends = {"sdpa_default": F.scaled_dot_product_attention}
    backends.update((name, fn) for name, (fn, _) in _implementations("cuda").items() if name.startswith("sdpa"))
    for name, sdpa in backends.items():
        try:
            row[f"{name}_fwd_bwd"] = wall_us(fwd_bwd(sdpa), calls)
            row[f"{name}_fwd_nograd"] = wall_us(fwd_nograd(sdpa), calls)
            row[f"{name}_graph_us"] = time_graph_ms(fwd_bwd(sdpa), 10, 40) * 1e3
        except Exception as exc:                       # a backend that refuses the shape
            row[f"{name}_fwd_bwd"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            torch.cuda.synchronize()
    return row


def same_bits() -> list[dict]:
    """The direct launch against Triton's: identical outputs and gradients (the kernels are
    deterministic), over masks, causal, dropout, GQA and odd sizes."""
    from flashlab import attention
    cases = []
    for n, d, dtype in ((1, 16, torch.bfloat16), (17, 16, torch.float16), (50, 16, torch.bfloat16),
                        (100, 64, torch.bfloat16), (33, 32, torch.float32)):
        for extra in ({}, {"is_causal": True}, {"mask": "bool"}, {"mask": "float"}, {"dropout_p": 0.2},
                      {"gqa": True}, {"view": True}):
            torch.manual_seed(0)
            kv_heads = 2 if extra.get("gqa") else 4
            if extra.get("view"):     # q, k, v as views into one (B, N, 3, H, D) tensor, as a fused QKV gives
                qkv = torch.randn(3, n, 3, 4, d, device="cuda", dtype=dtype)
                q, k, v = (t.detach().requires_grad_() for t in qkv.permute(2, 0, 3, 1, 4))
            else:
                q = torch.randn(3, 4, n, d, device="cuda", dtype=dtype, requires_grad=True)
                k, v = (torch.randn(3, kv_heads, n, d, device="cuda", dtype=dtype, requires_grad=True)
                        for _ in range(2))
            mask = None
            if extra.get("mask") == "bool":
                mask = torch.rand(n, n, device="cuda") > 0.3
            elif extra.get("mask") == "float":
                mask = torch.randn(3, 1, n, n, device="cuda", dtype=dtype)
            grad = torch.randn(3, 4, n, d, device="cuda", dtype=dtype)
            results = []
            for on in (False, True, True):         # the second direct call is the one that skips Triton
                with direct(on):
                    for t in (q, k, v):
                        t.grad = None
                    torch.manual_seed(1)
                    out = attention(q, k, v, attn_mask=mask, is_causal=extra.get("is_causal", False),
                                    dropout_p=extra.get("dropout_p", 0.0), enable_gqa=bool(extra.get("gqa")))
                    out.backward(grad)
                    results.append([out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()])
            same = all(torch.equal(a, b) for a, b in zip(results[0], results[2]))
            cases.append({"N": n, "D": d, "dtype": str(dtype), "case": extra or "plain", "identical": same})
    return cases


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--shapes", default=None, help="N×D,… (default: 20x16,50x16,100x16,128x64)")
    parser.add_argument("--quick", action="store_true", help="the timed pieces only: no identity check, no profiles")
    args = parser.parse_args(argv)
    shapes = SHAPES if args.shapes is None else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FLASHLAB_AUTOTUNE", "0")
    import triton

    from flashlab.launch import direct as direct_launch
    result = {"environment": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")},
              "how": __doc__, "B": B, "H": H, "dtype": "bfloat16", "calls": args.calls}
    text = io.StringIO()
    if not args.quick:
        result["identical"] = same_bits()
        bad = [c for c in result["identical"] if not c["identical"]]
        print(f"direct launch identical to Triton's in {len(result['identical']) - len(bad)}/"
              f"{len(result['identical'])} cases" + (f"; differs: {bad}" if bad else ""), flush=True)
    result["rows"] = []
    for n, d in shapes:
        row = pieces(n, d, args.calls)
        result["rows"].append(row)
        print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    result["direct_launch_entries"] = len(direct_launch._compiled)
    if args.quick:
        (args.out_dir / "small_host_time.json").write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out_dir}/small_host_time.json", flush=True)
        return

    from flashlab import attention
    q, k, v = (torch.randn(B, H, 20, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)

    def run():
        q.grad = k.grad = v.grad = None
        attention(q, k, v).backward(grad)
    for on in (False, True):
        with direct(on):
            for _ in range(20):
                run()
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(300):
                run()
            torch.cuda.synchronize()
            profile.disable()
            stats = io.StringIO()
            pstats.Stats(profile, stream=stats).sort_stats("tottime").print_stats(30)
            text.write(f"== cProfile, 300 fwd+bwd at N = 20, D = 16, direct launch {'on' if on else 'off'}\n"
                       f"{stats.getvalue()}\n")
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(30):
                    run()
                torch.cuda.synchronize()
            text.write(f"== torch.profiler, 30 fwd+bwd, direct launch {'on' if on else 'off'}\n"
                       + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25) + "\n")
            if on:
                prof.export_chrome_trace(str(args.out_dir / "small_host_time_trace.json"))
    (args.out_dir / "small_host_time.json").write_text(json.dumps(result, indent=1))
    (args.out_dir / "small_host_time.txt").write_text(text.getvalue())
    print(f"wrote {args.out_dir}/small_host_time.json, .txt", flush=True)


if __name__ == "__main__":
    main()
