"""host-time: where an eager small-path forward+backward spends its time on a GPU, piece by piece,
with Triton's launch and the direct launch (`flashlab.launch.direct`) side by side (notebook 09b).

Every figure is wall-clock µs per call over ``CALLS`` back-to-back calls, the GPU synchronised once
before and once after (`flashlab.launch.timing.wall_ms`: no L2 flush between calls, as in a training
loop), median of 5 rounds. A call shorter than its own host time is timed at its host time; the
GPU's time alone is the CUDA-graph replay. Pieces (row keys):

  graph_us          forward+backward replayed from a CUDA graph: the GPU's time alone
  fwd_nograd_*      flashlab.attention under no_grad
  fwd_grad_*        flashlab.attention with autograd recording, no backward
  fwd_bwd_*         flashlab.attention(...).backward(grad): what a training step pays
  bwd_direct_call_* flashlab.api.ops.backward_kernels called on the main thread (no autograd engine)
  launch_fwd_*      the small forward kernel launched alone with prebuilt arguments
  empty_function_*  an autograd.Function whose forward and backward only allocate, fwd+bwd (also
                    with flashlab's eleven inputs and two outputs: ..._like_flashlab)
  thin_small_*      the small kernels behind the thinnest autograd.Function (no options)
  general_route_*   the same kernels through the general eager route (`ops.EagerFlashAttention`)
  sdpa_*            SDPA, default dispatch and each backend, fwd_bwd and fwd_nograd

``*_triton`` with FLASHLAB_DIRECT_LAUNCH=0, ``*_direct`` with =1. Before them, a check that the
direct launch gives outputs and gradients identical, bit for bit, to Triton's (masks, causal,
dropout, GQA); after them, cProfile's and torch.profiler's tables of fwd_bwd, in the log."""

from __future__ import annotations

import cProfile
import io
import os
import pstats

import torch
import torch.nn.functional as F

from flashlab.bench.suite import Context, Suite
from flashlab.bench.suites.small_path import implementations, steps, switch

SHAPES = [(20, 16), (50, 16), (100, 16), (128, 64)]     # (N, D)
B, H = 512, 8
CALLS = 200
REPEATS = 5


def direct(on: bool):
    """FLASHLAB_DIRECT_LAUNCH for the duration."""
    return switch("FLASHLAB_DIRECT_LAUNCH", on)


def wall_us(fn, calls: int) -> float:
    from flashlab.launch.timing import wall_ms
    return wall_ms(fn, calls, "cuda", warmup=20, repeats=REPEATS) * 1e3


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
    a Python autograd.Function and two Triton launches. (The one direct call into the launchers
    this suite makes, with `pieces`' below.)"""

    @staticmethod
    def forward(ctx, q, k, v):
        from flashlab.launch import small as flash_small
        from flashlab.launch.masks import MaskArgs
        from flashlab.launch.spec import AttentionSpec
        out, lse = flash_small.forward(q, k, v, MaskArgs(q, (0, 0, 0, 0), False, False),
                                       AttentionSpec(q.shape[-1] ** -0.5))
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        from flashlab.launch import small as flash_small
        from flashlab.launch.masks import MaskArgs
        from flashlab.launch.spec import AttentionSpec
        q, k, v, out, lse = ctx.saved_tensors
        return flash_small.backward(q, k, v, out, lse, grad.contiguous(), MaskArgs(q, (0, 0, 0, 0), False, False),
                                    AttentionSpec(q.shape[-1] ** -0.5))


def pieces(n: int, d: int, calls: int) -> dict:
    from flashlab.api import ops
    from flashlab.api.attention import attention
    from flashlab.launch import direct as direct_launch
    from flashlab.launch import small as flash_small
    from flashlab.launch.small import small_forward_kernel
    from flashlab.launch.timing import time_graph_ms
    q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    scale = d ** -0.5

    def fwd_bwd(fn=attention):
        return steps(fn, q, k, v, grad)[1]

    def fwd_nograd(fn=attention):
        return steps(fn, q, k, v, grad)[0]

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
    args = (qd, kd, vd, qd, o, l_, *ints, 0, 0.0, 0)    # ints end with qk_scale, softcap; then seed, dropout_p, l_fix
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
    backends = {"sdpa_default": F.scaled_dot_product_attention}
    backends.update((name, fn) for name, (fn, _) in implementations().items() if name.startswith("sdpa"))
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
    from flashlab.api.attention import attention
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


def profiles(ctx: Context) -> None:
    """cProfile's and torch.profiler's tables of eager fwd_bwd at N = 20, D = 16, into the log."""
    from flashlab.api.attention import attention
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
            ctx.log(f"cProfile, 300 fwd+bwd at N = 20, D = 16, direct launch {'on' if on else 'off'}\n"
                    f"{stats.getvalue()}")
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(30):
                    run()
                torch.cuda.synchronize()
            ctx.log(f"torch.profiler, 30 fwd+bwd, direct launch {'on' if on else 'off'}\n"
                    + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def run(ctx: Context) -> None:
    from flashlab.launch import direct as direct_launch
    os.environ["FLASHLAB_AUTOTUNE"] = "0"
    shapes = SHAPES[:1] if ctx.quick else SHAPES
    calls = 20 if ctx.quick else CALLS
    ctx.record.update(how=__doc__, B=B, H=H, dtype="bfloat16", calls=calls, rows=[], skipped=[])
    ctx.record["identical"] = same_bits()
    bad = [c for c in ctx.record["identical"] if not c["identical"]]
    ctx.log(f"direct launch identical to Triton's in {len(ctx.record['identical']) - len(bad)}/"
            f"{len(ctx.record['identical'])} cases" + (f"; differs: {bad}" if bad else ""))
    if bad:
        ctx.record["error"] = "the direct launch differs from Triton's (identical)"
    ctx.save()
    for n, d in shapes:
        if ctx.over():
            ctx.record["skipped"].append({"N": n, "D": d, "why": ctx.skipped()})
            continue
        ctx.record["rows"].append(pieces(n, d, calls))
        ctx.record["direct_launch_entries"] = len(direct_launch._compiled)
        ctx.save()
        ctx.log(", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in ctx.record["rows"][-1].items()))
    if not ctx.over():
        profiles(ctx)


SUITE = Suite(
    name="host-time",
    summary="where an eager small-path call spends its time, piece by piece",
    measures="µs per eager call of each piece of a small-path forward+backward (the GPU's time alone, the "
             "call with and without autograd, the backward alone, one launch, an empty autograd.Function, "
             "the thinnest Function around the small kernels, SDPA's backends), with Triton's launch and the "
             "direct launch; that the direct launch gives Triton's bits; the host's profile in the log",
    shapes=f"B = {B}, H = {H}, bf16, (N, D) = {', '.join(f'({n}, {d})' for n, d in SHAPES)}; {CALLS} calls a "
           "figure, median of 5 rounds. --quick: N = 20, D = 16, 20 calls",
    budget_s=240, min_s=60, run=run, needs="gpu")
