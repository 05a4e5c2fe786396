"""tsp-encoder: the capstone's TSP Attention Model encoder (3 layers, 8 heads, width 128) with naive,
SDPA and flashlab attention, from 10 to 10,000 cities, forward and forward+backward, and the extra
memory of a forward+backward (`flashlab.bench.encoder`; notebooks 07 and 09)."""

from __future__ import annotations

from flashlab.bench.suite import Context, Suite

NODES = [10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
TOKENS = 512 * 10            # instances × cities, kept as the number of cities grows


def run(ctx: Context) -> None:
    from flashlab.bench.encoder import benchmark_encoder
    nodes, tokens = ([4], 8) if ctx.quick else (NODES, TOKENS)
    ctx.record.update(tokens=tokens, rows=[], skipped=[])
    for n in nodes:
        if ctx.over():
            ctx.record["skipped"].append({"nodes": n, "why": ctx.skipped()})
            continue
        rows = benchmark_encoder([n], tokens=tokens, device=ctx.device, warmup_ms=1 if ctx.quick else 10,
                                 rep_ms=1 if ctx.quick else 50)
        ctx.record["rows"] += rows
        ctx.save()
        for r in rows:
            ctx.log(str(r))


SUITE = Suite(
    name="tsp-encoder",
    summary="the TSP encoder with naive, SDPA and flashlab attention, 10-10,000 cities",
    measures="forward and forward+backward time of the Attention Model's encoder and the extra memory of a "
             "forward+backward, with naive attention, SDPA's default dispatch and flashlab",
    shapes=f"{', '.join(map(str, NODES))} cities, {TOKENS} instances × cities (at least one instance), embed 128, "
           "8 heads, 3 layers, bf16 autocast. --quick: 4 cities, 2 instances, fp32",
    budget_s=240, min_s=30, run=run, needs="gpu, or quick")
