"""mqar-training: the capstone's long-context task (notebook 09, task 2) trained on one GPU.

Multi-query associative recall (`flashlab.train.tasks`) with the trainer's causal transformer,
bf16-mixed, flashlab attention, rotary positions on a quarter of each head's dimensions (the rest
carry content only, so "same key" looks the same at any distance):

1. flashlab against naive attention on this model at 4096 tokens (the same losses); then one training
   step with naive attention at 65536 tokens, and 131072 if 65536 fitted; training goes on at the first
   length where naive ran out of memory, with flashlab's step time and peak memory there;
2. training in three phases, each resumed from the last: short sequences with every query slot asking
   (many sequences per step: where the recall mechanism forms), 2048 tokens with 1 slot in 16 asking
   (keys last mentioned hundreds of tokens back), then the long length with 1 in 64 asking, one
   sequence per step;
3. after each phase, recall at the long length with 1 slot in 1024 asking, so that most queried keys
   were last mentioned thousands of tokens back, split by that distance (`flashlab.train.tasks.lookback`);
   also with every slot asking, and at twice the long length (never trained on); and the peak memory.

Each phase's metrics go beside the record, as <phase>_metrics.csv."""

from __future__ import annotations

import shutil

import torch

from flashlab.bench.suite import Context, Suite
from flashlab.bench.suites.train import attempt

MODEL = dict(seq_len=128, num_pairs=8, vocab_size=64, d_model=128, n_layers=2, n_heads=4,
             positions="rotary", rotary_fraction=0.25, attention="flashlab", precision="bf16-mixed",
             batch_size=512, lr=1e-3, warmup_steps=200, min_lr_ratio=1.0, steps=10**7, log_every=100,
             progress=False, device="cuda", seed=0)
MEDIUM = dict(seq_len=2048, query_rate=1 / 16, batch_size=32)
LONG = dict(query_rate=1 / 64, batch_size=1)
TEST_RATE, TEST_SEQUENCES = 1 / 1024, 16
EDGES = (1, 64, 512, 4096, 16384, 65536, 2**31)
MINUTES = (1.5, 1.0, 2.5)                 # short, medium, long phases
LONG_LENGTHS = (65536, 131072)
QUICK = dict(model=dict(MODEL, batch_size=8, warmup_steps=1, log_every=1), minutes=(0.05, 0.05, 0.05),
             long_lengths=(512,), agreement_len=256)


def recall(trainer, n, query_rate=TEST_RATE, sequences=TEST_SEQUENCES):
    from flashlab.train.tasks import AssociativeRecall
    task = AssociativeRecall(n, trainer.task_config.num_pairs, trainer.task_config.vocab_size, query_rate)
    rows = trainer.evaluate_by_lookback(EDGES, batches=sequences, task=task, rows=1)
    answers = sum(r["answers"] for r in rows)
    overall = sum(r["accuracy"] * r["answers"] for r in rows if r["answers"]) / max(answers, 1)
    return {"seq_len": n, "query_rate": query_rate, "sequences": sequences, "answers": answers,
            "accuracy": overall, "by_lookback": rows}


def run(ctx: Context) -> None:
    from flashlab.train.trainer import split_flat_config, train_in_phases
    quick = QUICK if ctx.quick else dict(model=MODEL, minutes=MINUTES, long_lengths=LONG_LENGTHS,
                                         agreement_len=4096)
    model = dict(quick["model"], device=ctx.device)
    record = ctx.record
    record.update(model=model, medium=MEDIUM, long=LONG, test={"query_rate": TEST_RATE, "sequences": TEST_SEQUENCES},
                  one_step=[])
    # flashlab's kernels at this model's head dimension (32) against naive attention: three steps
    # from the same weights on the same data must give the same losses (bf16 rounding)
    record["agreement_at_4096"] = {name: attempt(dict(model, attention=name, seq_len=quick["agreement_len"],
                                                      batch_size=4), steps=2, warmup=1)
                                   for name in ("naive", "flashlab")}
    ctx.log(str(record["agreement_at_4096"]))
    for n in quick["long_lengths"]:
        step = {"seq_len": n}
        for name in ("naive", "flashlab"):
            step[name] = attempt(dict(model, attention=name, seq_len=n, batch_size=1, query_rate=LONG["query_rate"]),
                                 steps=2, warmup=1)
        record["one_step"].append(step)
        ctx.log(str(step))
        ctx.save()
        if "error" in step["naive"] and "error" not in step["flashlab"]:
            break
    long_len = record["long_len"] = n
    record["phases"] = []
    minutes = quick["minutes"]
    phases = [("short", {}, minutes[0]), ("medium", MEDIUM, minutes[1]), ("long", dict(LONG, seq_len=long_len),
                                                                         minutes[2])]
    record["phase_plan"] = phases
    steps_before, cuda = 0, torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()          # from here on: training only
    out = ctx.files
    for name, trainer in train_in_phases(*split_flat_config(model), phases, str(out)):
        phase = {"name": name, "seq_len": trainer.task_config.seq_len, "query_rate": trainer.task_config.query_rate,
                 "batch_size": trainer.run.batch_size, "steps": trainer.step - steps_before,
                 "train_minutes": trainer.train_seconds / 60,
                 "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                 "accuracy_as_trained": trainer.evaluate(batches=4),
                 "recall_at_long": recall(trainer, long_len),
                 "recall_at_long_every_slot_asking": recall(trainer, long_len, query_rate=1.0, sequences=2),
                 "recall_at_twice_long": recall(trainer, 2 * long_len, sequences=8)}
        record["phases"].append(phase)
        steps_before = trainer.step
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        ctx.log(f"{name}: {({k: v for k, v in phase.items() if k != 'recall_at_long'})} "
                f"recall at the long length {phase['recall_at_long']['accuracy']:.3f}")
        record["wall_minutes"] = ctx.watch.seconds() / 60
        ctx.save()
    for name, _, _ in phases:                # the metrics beside the record; the checkpoints go
        if (out / name / "metrics.csv").exists():
            shutil.move(out / name / "metrics.csv", out / f"{name}_metrics.csv")
        shutil.rmtree(out / name, ignore_errors=True)


SUITE = Suite(
    name="mqar-training",
    summary="the capstone's long-context recall task, trained in three phases",
    measures="flashlab against naive attention (same losses at 4096 tokens; one step at 65536 and 131072 "
             "tokens: where naive runs out of memory), then MQAR trained in three phases (short, 2048 tokens, "
             "the long length) with recall after each, by how far back the queried key was, and peak memory",
    shapes="2 layers, width 128, 4 heads of 32, rotary on a quarter, bf16-mixed; phases of 1.5, 1 and 2.5 "
           "minutes; 512 sequences of 128 tokens, 32 of 2048, 1 of the long length. --quick: seconds per phase, "
           "512 tokens",
    budget_s=570, min_s=300, run=run, needs="gpu")
