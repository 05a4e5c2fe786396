"""train and train-long-context: the trainer's causal transformer (notebook 08), its step time and
peak memory for five precision and attention configurations at 4096 tokens, the longest sequence
each trains at (batch 1, powers of two), and how far past 131072 tokens the leaner ones go
(`flashlab.bench.train_step.measure_step`: median step time, peak allocated bytes, MFU)."""

from __future__ import annotations

import dataclasses

import torch

from flashlab.bench.suite import Context, Suite

MODEL = dict(seq_len=4096, num_pairs=512, vocab_size=8192, d_model=512, n_layers=4, n_heads=8, batch_size=8,
             steps=10, warmup_steps=2, progress=False, device="cuda")
QUICK_MODEL = dict(MODEL, seq_len=64, num_pairs=8, vocab_size=64, d_model=32, n_layers=1, n_heads=2, batch_size=2)
CONFIGS = [("32-true", "naive"), ("32-true", "flashlab"), ("bf16-mixed", "sdpa"), ("bf16-mixed", "flashlab"),
           ("16-mixed", "flashlab")]
LENGTHS = [4096, 8192, 16384, 32768, 65536, 131072]
LONG_CONFIGS = [("bf16-mixed", "flashlab"), ("16-mixed", "flashlab"), ("bf16-mixed", "sdpa"), ("32-true", "flashlab")]
LONG_LENGTHS = [262144, 524288]


def attempt(config: dict, steps: int, warmup: int) -> dict:
    """`measure_step` of one flat trainer configuration, or its out-of-memory error."""
    from flashlab.bench.train_step import measure_step
    from flashlab.train.trainer import split_flat_config
    try:
        return measure_step(*split_flat_config(config), steps=steps, warmup=warmup)
    except torch.OutOfMemoryError as error:
        return {"error": "out of memory", "detail": str(error).splitlines()[0][:200]}
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def whole_config(config: dict) -> dict:
    """Every field of the trainer's configuration for ``config`` (its defaults filled in, tf32 among them)."""
    from flashlab.train.trainer import split_flat_config
    task, run = split_flat_config(config)
    return {**dataclasses.asdict(task), **dataclasses.asdict(run)}


def model_for(ctx: Context) -> dict:
    return dict(QUICK_MODEL if ctx.quick else MODEL, device=ctx.device)


def run_train(ctx: Context) -> None:
    model = model_for(ctx)
    lengths = [model["seq_len"], 2 * model["seq_len"]] if ctx.quick else LENGTHS
    ctx.record.update(model=whole_config(model), at_4096=[], largest=[])
    for precision, attention in CONFIGS:
        if ctx.over():
            ctx.record["at_4096"].append({"precision": precision, "attention": attention, "skipped": ctx.skipped()})
            continue
        result = attempt(dict(model, precision=precision, attention=attention), steps=5, warmup=2)
        ctx.record["at_4096"].append({"precision": precision, "attention": attention, **result})
        ctx.log(f"{precision} {attention} {result}")
        ctx.save()
    for precision, attention in CONFIGS:
        best, failed, stopped = None, None, False
        for n in lengths:
            if ctx.over():
                stopped = True
                break
            result = attempt(dict(model, precision=precision, attention=attention, seq_len=n, batch_size=1),
                             steps=1, warmup=1)
            ctx.log(f"{precision} {attention} {n} {result}")
            if "error" in result:
                failed = n
                break
            best = {"seq_len": n, **result}
        entry = {"precision": precision, "attention": attention, "largest": best, "next_failed": failed}
        if stopped:
            entry["stopped"] = ctx.skipped()
        ctx.record["largest"].append(entry)
        ctx.save()


def run_long_context(ctx: Context) -> None:
    model = model_for(ctx)
    lengths = [4 * model["seq_len"], 8 * model["seq_len"]] if ctx.quick else LONG_LENGTHS
    ctx.record.update(model=whole_config(model), rows=[], skipped=[])
    for precision, attention in LONG_CONFIGS:
        for n in lengths:
            if ctx.over():
                ctx.record["skipped"].append({"precision": precision, "attention": attention, "seq_len": n})
                continue
            result = attempt(dict(model, precision=precision, attention=attention, seq_len=n, batch_size=1),
                             steps=1, warmup=1)
            ctx.record["rows"].append({"precision": precision, "attention": attention, "seq_len": n, **result})
            ctx.log(f"{precision} {attention} {n} {result}")
            ctx.save()
            if "error" in result:
                break


SHAPE = "4 layers, width 512, 8 heads, vocabulary 8192, MQAR"
SUITES = [
    Suite(name="train", summary="notebook 08: the trainer's step time and memory, and its longest sequence",
          measures="median step time, peak memory, tokens/s and MFU of one optimizer step for 32-true + naive, "
                   "32-true + flashlab, bf16-mixed + SDPA, bf16-mixed + flashlab and 16-mixed + flashlab; the "
                   "longest sequence (powers of two) each trains at with batch 1",
          shapes=f"{SHAPE}; 4096 tokens, batch 8; then batch 1 at {LENGTHS[0]}-{LENGTHS[-1]} tokens. --quick: "
                 "1 layer, width 32, 64 tokens",
          budget_s=570, min_s=60, run=run_train, needs="gpu, or quick"),
    Suite(name="train-long-context", summary="notebook 08: training steps past 131072 tokens, batch 1",
          measures="step time and peak memory of one training step at 262144 and 524288 tokens (until one runs "
                   "out of memory) for bf16-mixed and 16-mixed + flashlab, bf16-mixed + SDPA, 32-true + flashlab",
          shapes=f"{SHAPE}; batch 1, {' and '.join(map(str, LONG_LENGTHS))} tokens. --quick: 1 layer, width 32, "
                 "256 and 512 tokens",
          budget_s=570, min_s=60, run=run_long_context, needs="gpu, or quick"),
]
