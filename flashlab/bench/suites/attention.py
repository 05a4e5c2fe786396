"""attention: the standard benchmark, FlashAttention's: B·N = 16384 tokens, H·D = 2048, bf16 and
fp16, causal and full, flashlab against naive attention, every SDPA backend and FlexAttention in
the same run (`flashlab.bench.attention`), forward, backward and both, FLOPs counted as
FlashAttention's papers count them (`flashlab.launch.timing.attention_flops`). The record ends
with the autotuner's report; its log ends with the targets per shape (`analysis.target_table`)."""

from __future__ import annotations

import torch

from flashlab.bench.suite import Context, Suite

SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
HIDDEN = 2048                  # H·D
TOKENS = 16384                 # B·N
DTYPES = (torch.bfloat16, torch.float16)
FLEX_SEQ_LENS = (1024, 4096)   # FlexAttention compiles per shape: two lengths keep the run within its budget
QUICK = dict(seq_lens=(32, 64), head_dims=(16,), hidden=32, tokens=128, dtypes=(torch.float32,))


def run(ctx: Context) -> None:
    from flashlab.bench.analysis import shapes, target_table
    from flashlab.bench.attention import attention_implementations, benchmark_attention
    from flashlab.bench.records import measured_on
    from flashlab.launch import autotune

    size = QUICK if ctx.quick else dict(seq_lens=SEQ_LENS, head_dims=HEAD_DIMS, hidden=HIDDEN, tokens=TOKENS,
                                        dtypes=DTYPES)
    impls = attention_implementations(ctx.device)
    ctx.record.update(tokens=size["tokens"], hidden=size["hidden"], flex_seq_lens=list(FLEX_SEQ_LENS),
                      rows=[], skipped=[])
    warmup_ms, rep_ms = (1, 1) if ctx.quick else (10, 25)
    for dtype in size["dtypes"]:
        for d in size["head_dims"]:
            for n in size["seq_lens"]:
                for causal in (False, True):
                    if ctx.over():
                        ctx.record["skipped"].append({"N": n, "D": d, "causal": causal, "dtype": str(dtype),
                                                      "why": ctx.skipped()})
                        continue
                    rows = benchmark_attention(
                        [n], (d,), (causal,), (dtype,), tokens=size["tokens"], heads=size["hidden"] // d,
                        device=ctx.device, impls=impls, flex_seq_lens=FLEX_SEQ_LENS, warmup_ms=warmup_ms,
                        rep_ms=rep_ms)
                    ctx.record["rows"] += rows
                    ctx.record["autotune"] = autotune.tuner.report()
                    ctx.save()
                    ctx.log(f"N={n} D={d} causal={causal} {dtype}, forward+backward TFLOP/s: " + ", ".join(
                        f"{r['impl']} {r['tflops']:.1f}" if "tflops" in r else f"{r['impl']} refused"
                        for r in rows if r["mode"] in ("fwd+bwd", "all")))
    if ctx.record["rows"] and not ctx.quick:
        ctx.log("targets (SDPA's time ÷ flashlab's; memory: flashlab's ÷ the flash backend's):\n"
                + targets_markdown(ctx.record, measured_on, shapes, target_table))


def targets_markdown(record, measured_on, shapes, target_table) -> str:
    """The target table as Markdown, one row per shape; ✗ marks a missed target."""
    columns = [("fwd", "sdpa_flash"), ("fwd", "sdpa_cudnn"), ("fwd+bwd", "sdpa_flash"), ("fwd+bwd", "sdpa_cudnn"),
               ("memory fwd+bwd", "sdpa_flash")]
    cells = {(r["mode"], r["baseline"], r["N"], r["D"], r["causal"], r["dtype"]):
             f"{r['ratio']:.2f}" + ("" if r["met"] else " ✗") for r in target_table(record)}
    lines = [f"Targets on {measured_on(record)}; ✗ = missed.", "",
             "| dtype | N | D | causal | fwd vs flash | fwd vs cuDNN | fwd+bwd vs flash | fwd+bwd vs cuDNN "
             "| memory vs flash |", "|---|---|---|---|---|---|---|---|---|"]
    for n, d, causal, dtype in sorted(shapes(record), key=lambda s: (s[3], s[1], s[2], s[0])):
        row = [cells.get((m, b, n, d, causal, dtype), "–") for m, b in columns]
        lines.append(f"| {dtype[6:]} | {n} | {d} | {'yes' if causal else 'no'} | " + " | ".join(row) + " |")
    return "\n".join(lines)


SUITE = Suite(
    name="attention",
    summary="the standard benchmark: flashlab vs naive, every SDPA backend and FlexAttention",
    measures="forward, backward and forward+backward time, TFLOP/s (4·B·H·N²·D forward, halved when causal, "
             "backward 2.5× forward) and extra memory of flashlab.attention, naive attention, SDPA's flash, "
             "memory-efficient, cuDNN and math backends (where they fit) and FlexAttention, in one run; "
             "the autotuner's choices; the targets per shape in the log",
    shapes=f"B·N = {TOKENS}, H·D = {HIDDEN}, N = {', '.join(map(str, SEQ_LENS))}, D = 64 and 128, causal and full, "
           f"bf16 and fp16; FlexAttention at N = {' and '.join(map(str, FLEX_SEQ_LENS))}. --quick: B·N = 128, "
           "H·D = 32, N = 32 and 64, D = 16, fp32",
    budget_s=570, min_s=60, run=run, needs="gpu, or quick")
