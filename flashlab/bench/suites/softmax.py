"""softmax: notebook 02's fused softmax against torch.softmax and five unfused PyTorch ops
(`flashlab.bench.softmax`), in effective bandwidth (the fused kernel's bytes over the time)."""

from __future__ import annotations

import torch

from flashlab.bench.suite import Context, Suite

ROWS = 4096
COLS = (256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK = dict(rows=16, cols=(64, 128))


def run(ctx: Context) -> None:
    from flashlab.bench.softmax import benchmark_softmax

    rows, cols = (QUICK["rows"], QUICK["cols"]) if ctx.quick else (ROWS, COLS)
    ctx.record.update(rows=[], skipped=[])
    for n in cols:
        if ctx.over():
            ctx.record["skipped"].append({"cols": n, "why": ctx.skipped()})
            continue
        ctx.record["rows"] += benchmark_softmax(rows, [n], torch.float16, device=ctx.device)
        ctx.save()
        ctx.log(", ".join(f"{r['impl']} {r['GB/s']:.0f} GB/s" for r in ctx.record["rows"] if r["cols"] == n)
                + f" at {rows} × {n}")


SUITE = Suite(
    name="softmax",
    summary="notebook 02's fused softmax vs torch.softmax and the unfused ops",
    measures="time and effective bandwidth (one read and one write of the matrix over the time) of flashlab's "
             "fused Triton softmax, torch.softmax and the same softmax as five PyTorch ops",
    shapes=f"{ROWS} rows × {', '.join(map(str, COLS))} columns, fp16. --quick: 16 × 64 and 128",
    budget_s=60, min_s=15, run=run, needs="gpu, or quick")
