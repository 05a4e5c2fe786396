"""small-table: flashlab's small path at routing-model sizes against the general kernels and SDPA's
backends, one attention call timed eagerly and replayed from a CUDA graph (the kernels' time
without the host's), checked against float64 first; then the TSP Attention Model's encoder
training step (notebook 09b's table and encoder step). Sections, in order of importance:

  correctness  the small path (and the general path just above its limit) vs float64:
               out, dQ, dK, dV relative errors, bf16/fp16/fp32, D 16/64, causal and full
  table        forward and forward+backward, eager and CUDA-graph replay, for flashlab,
               flashlab with FLASHLAB_SMALL_PATH=0 (the general kernels) and SDPA's flash /
               memory-efficient / cuDNN backends (refusals recorded); per row flashlab ÷ the
               fastest SDPA backend (target ≤ 1.1)
  tsp_encoder  the encoder's training step (forward + backward + Adam) with flashlab and with SDPA's
               default dispatch, eager, with the encoder compiled (reduce-overhead), and the whole step
               captured in one CUDA graph and replayed (target: flashlab ≥ 1.1× faster)"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashlab.bench.suite import Context, Suite
from flashlab.bench.suites.small_path import (
    captured_encoder_step_ms,
    eager_ms,
    encoder_step,
    graph_ms,
    implementations,
    refusal,
    run_sections,
    sizes,
    small_path,
    steps,
)


def correctness(device, size, ctx) -> dict:
    from flashlab.api.attention import attention
    from flashlab.launch import small as flash_small
    from flashlab.reference.float64 import TOLERANCE, reference_attention, reference_gradients, rel_error
    dtypes = [torch.bfloat16, torch.float16, torch.float32] if device == "cuda" else [torch.float32]
    B, H = size["correct_bh"]
    rows, skipped = [], 0
    for dtype in dtypes:
        for D in size["correct_d"]:
            limit = flash_small.max_keys(D, dtype)
            # bf16 over the whole list; fp16 and fp32 (no dtype-specific code in the kernels) a subset
            # and the general path just above the limit (bf16): every compile costs a second or two
            ns = [*size["correct_n"], limit + 1] if dtype == torch.bfloat16 or device != "cuda" else [17, 100]
            for N in ns:
                for is_causal in (False, True):
                    if ctx.over():
                        skipped += 1
                        continue
                    q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True)
                               for _ in range(3))
                    with small_path(True):
                        out = attention(q, k, v, is_causal=is_causal, exact_fp32=True)
                        grad = torch.randn_like(out)
                        out.backward(grad)
                        took_small = flash_small.applies(N, N, D, dtype)
                    ref = reference_attention(q, k, v, None, is_causal)
                    dq, dk, dv = reference_gradients(q, k, v, grad, None, is_causal)
                    errors = {name: rel_error(got, want) for name, got, want in
                              (("out", out, ref), ("dq", q.grad, dq), ("dk", k.grad, dk), ("dv", v.grad, dv))}
                    tol = TOLERANCE[dtype]
                    rows.append({"dtype": str(dtype), "D": D, "N": N, "causal": is_causal,
                                 "path": "small" if took_small else "general",
                                 "errors": errors, "tolerance": tol,
                                 "ok": all(e <= tol for e in errors.values())})
    bad = [r for r in rows if not r["ok"]]
    ctx.log(f"correctness: {len(rows) - len(bad)}/{len(rows)} within tolerance"
            + (f", {skipped} skipped" if skipped else ""))
    return {"rows": rows, "all_ok": not bad, "skipped_rows": skipped}


def time_attention(fn, q, k, v, grad, device, size) -> dict:
    """fwd and fwd+bwd, eager and graph replay, for one implementation and shape."""
    forward, forward_backward = steps(fn, q, k, v, grad)
    result = {}
    for mode, step in (("fwd", forward), ("fwd+bwd", forward_backward)):
        for how, timer in (("eager", eager_ms), ("graph", graph_ms)):
            try:
                result[f"{mode}_{how}_ms"] = timer(step, device, size)
            except Exception as exc:                 # a backend that refuses the shape, or a failure
                result[f"{mode}_{how}_ms"] = refusal(exc)
                if device == "cuda":
                    torch.cuda.synchronize()
    return result


def table(device, size, ctx) -> dict:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    B, H = size["table_bh"]
    rows, skipped = [], []
    for D in size["table_d"]:
        for N in size["table_n"]:
            if ctx.over():
                skipped.append({"N": N, "D": D})
                continue
            q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            grad = torch.randn_like(q)
            row = {"B": B, "H": H, "N": N, "D": D, "dtype": str(dtype)}
            for name, (fn, small) in implementations().items():
                with small_path(small if small is not None else True):
                    row[name] = time_attention(fn, q, k, v, grad, device, size)
            for mode in ("fwd_eager", "fwd_graph", "fwd+bwd_eager", "fwd+bwd_graph"):
                sdpa = [row[n][f"{mode}_ms"] for n in row if n.startswith("sdpa")
                        if isinstance(row[n][f"{mode}_ms"], float)]
                ours = row["flashlab"][f"{mode}_ms"]
                if sdpa and isinstance(ours, float):
                    row[f"ratio_{mode}"] = ours / min(sdpa)        # flashlab / fastest SDPA; target ≤ 1.1
            rows.append(row)
            ctx.log(f"table N={N} D={D}: " + ", ".join(f"{m} {row.get('ratio_' + m, float('nan')):.2f}×"
                                                       for m in ("fwd_graph", "fwd+bwd_graph", "fwd+bwd_eager")))
            ctx.save()
    return {"rows": rows, "skipped_rows": skipped, "target_ratio": 1.1}


def tsp_encoder(device, size, ctx) -> dict:
    from flashlab.api.attention import attention
    from flashlab.train.tsp import random_instances
    rows, skipped = [], []
    for n in size["tsp_nodes"]:
        if ctx.over():
            skipped.append(n)
            continue
        coords = random_instances(size["tsp_batch"], n, seed=n, device=device)
        row = {"nodes": n, "instances": size["tsp_batch"], "dtype": "bf16 autocast" if device == "cuda" else "fp32"}
        modes = [None] + (["reduce-overhead"] if device == "cuda" or size.get("compile_on_cpu") else [])
        for mode in modes:
            for name, fn in (("flashlab", attention), ("sdpa", F.scaled_dot_product_attention)):
                column = f"{name}{'_compiled' if mode else ''}_ms_per_step"
                if mode and ctx.over():
                    row[column] = ctx.skipped()
                    continue
                torch._dynamo.reset()
                step = encoder_step(fn, coords, device, mode)
                try:
                    for _ in range(3 if mode else 0):
                        step()                         # compilation and CUDA-graph recording, untimed
                    row[column] = eager_ms(step, device, size)
                except Exception as exc:
                    row[column] = refusal(exc)
        if device == "cuda":
            for name, fn in (("flashlab", attention), ("sdpa", F.scaled_dot_product_attention)):
                column = f"{name}_captured_ms_per_step"
                if ctx.over():
                    row[column] = ctx.skipped()
                    continue
                try:
                    row[column] = captured_encoder_step_ms(fn, coords, size)
                except Exception as exc:
                    row[column] = refusal(exc)
                    torch.cuda.synchronize()
        for suffix in ("", "_compiled", "_captured"):
            ours, theirs = row.get(f"flashlab{suffix}_ms_per_step"), row.get(f"sdpa{suffix}_ms_per_step")
            if isinstance(ours, float) and isinstance(theirs, float):
                row[f"speedup_vs_sdpa{suffix}"] = theirs / ours            # target ≥ 1.1
        if isinstance(row.get("flashlab_compiled_ms_per_step"), float) and isinstance(row["sdpa_ms_per_step"], float):
            row["compiled_speedup_vs_sdpa_eager"] = row["sdpa_ms_per_step"] / row["flashlab_compiled_ms_per_step"]
        rows.append(row)
        ctx.log(f"tsp_encoder n={n}: " + ", ".join(f"{k[:-12]} {v if isinstance(v, str) else f'{v:.3f}'} ms"
                                                   for k, v in row.items() if k.endswith("_ms_per_step")))
        ctx.save()
    return {"rows": rows, "skipped_nodes": skipped, "target_speedup": 1.1,
            "what": "encoder forward + squared-output loss + backward + Adam step; eager, with the encoder "
                    "compiled (torch.compile mode reduce-overhead, as train-tsp --compile does; Adam eager), and "
                    "the whole step captured in one CUDA graph (PyTorch's whole-network capture, Adam "
                    "capturable=True; replayed: the GPU's time, without the host's)"}


def run(ctx: Context) -> None:
    run_sections(ctx, (("correctness", correctness), ("table", table), ("tsp_encoder", tsp_encoder)),
                 sizes(ctx.quick))
    if not ctx.record["sections"].get("correctness", {}).get("all_ok", True):
        ctx.record["error"] = "the small path disagrees with float64 (sections.correctness)"


SUITE = Suite(
    name="small-table",
    summary="notebook 09b's table: the small path vs SDPA at routing sizes, and the TSP encoder step",
    measures="the small path against float64; one attention call's forward and forward+backward, eager and "
             "replayed from a CUDA graph, for flashlab, flashlab on its general kernels and SDPA's flash, "
             "memory-efficient and cuDNN backends (flashlab ÷ the fastest); the TSP encoder's training step "
             "with flashlab and with SDPA, eager, compiled and captured whole in a CUDA graph",
    shapes="correctness: B = H = 4, N = 1-128 and one past the small path's limit, D = 16 and 64, bf16 (fp16, "
           "fp32: N = 17, 100), causal and full; table: B = 512, H = 8, N = 20, 50, 100, 128, 1000, D = 16 and "
           "64, bf16; encoder step: batch 512, 20, 50 and 100 cities (embed 128, 8 heads, 3 layers), bf16 "
           "autocast. --quick: B = 1-2, N ≤ 40, 4 cities",
    budget_s=240, min_s=60, run=run, needs="gpu, or quick")
