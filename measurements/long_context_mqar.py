"""GPU run for the capstone's long-context task (issue 7, task 2) on one H200.

Multi-query associative recall (flashlab.train.tasks) with the trainer's causal transformer,
bf16-mixed, flashlab attention, rotary positions on a quarter of each head's dimensions
(the rest carry content only, so "same key" looks the same at any distance):

1. flashlab against naive attention on this model at 4096 tokens (the same losses); the long
   length: one training step with naive attention at 65536 tokens, then 131072 if
   65536 fitted; the run goes on at the first length where naive ran out of memory, with
   flashlab's step time and peak memory there;
2. training in three phases, each resumed from the last: short sequences with every query
   slot asking (many sequences per step: where the recall mechanism forms), 2048 tokens with
   1 slot in 16 asking (keys last mentioned hundreds of tokens back), then the long length
   with 1 in 64 asking, one sequence per step;
3. after each phase, recall at the long length with 1 slot in 1024 asking, so that most
   queried keys were last mentioned thousands of tokens back, split by that distance
   (`flashlab.train.tasks.lookback`); also with every slot asking, and at twice the long length
   (never trained on); and the peak memory.

    python -m measurements.long_context_mqar OUT_DIR MINUTES_SHORT MINUTES_MEDIUM MINUTES_LONG [SEED]
"""

import dataclasses
import json
import sys
import time

import torch

from flashlab.bench.records import environment
from flashlab.train import checkpoint
from flashlab.train.tasks import AssociativeRecall
from flashlab.train.trainer import split_flat_config, train_in_phases

from .train_measurements import attempt

# History: the first run (2026-12-02: N = 1024, 64 sequences per step, 4 layers of width 256)
# stayed on MQAR's plateau (11%). measurements/mqar_settle.py then learned MQAR to 100% within a
# minute with this model (2 layers, width 128, 4 heads of 32) at N = 128 and 512 sequences
# per step; but with every query slot asking, the previous mention of a key is a few dozen
# tokens back at any length, which tests recall, not reach. Hence sparse queries here.
MODEL = dict(seq_len=128, num_pairs=8, vocab_size=64, d_model=128, n_layers=2, n_heads=4,
                    positions="rotary", rotary_fraction=0.25, attention="flashlab", precision="bf16-mixed",
                    batch_size=512, lr=1e-3, warmup_steps=200, min_lr_ratio=1.0, steps=10**7, log_every=100,
                    progress=False, device="cuda")
MEDIUM = dict(seq_len=2048, query_rate=1 / 16, batch_size=32)
LONG = dict(query_rate=1 / 64, batch_size=1)
TEST_RATE, TEST_SEQUENCES = 1 / 1024, 16
EDGES = (1, 64, 512, 4096, 16384, 65536, 2**31)


def recall(trainer, n, query_rate=TEST_RATE, sequences=TEST_SEQUENCES):
    task = AssociativeRecall(n, trainer.task_config.num_pairs, trainer.task_config.vocab_size, query_rate)
    rows = trainer.evaluate_by_lookback(EDGES, batches=sequences, task=task, rows=1)
    answers = sum(r["answers"] for r in rows)
    overall = sum(r["accuracy"] * r["answers"] for r in rows if r["answers"]) / max(answers, 1)
    return {"seq_len": n, "query_rate": query_rate, "sequences": sequences, "answers": answers,
            "accuracy": overall, "by_lookback": rows}


def main(out, minutes, model=MODEL, long_lengths=(65536, 131072)):
    start = time.time()
    record = {"environment": environment(), "model": model, "medium": MEDIUM, "long": LONG,
              "test": {"query_rate": TEST_RATE, "sequences": TEST_SEQUENCES}, "one_step": []}
    path = f"{out}/long_context_mqar.json"
    save = lambda: json.dump(record, open(path, "w"), indent=1)   # noqa: E731
    # flashlab's kernels at this model's head dimension (32) against naive attention: three
    # steps from the same weights on the same data must give the same losses (bf16 rounding)
    record["agreement_at_4096"] = {name: attempt(dict(model, attention=name, seq_len=4096,
                                                                     batch_size=4), steps=2, warmup=1)
                                   for name in ("naive", "flashlab")}
    print(record["agreement_at_4096"], flush=True)
    for n in long_lengths:
        step = {"seq_len": n}
        for name in ("naive", "flashlab"):
            step[name] = attempt(dict(model, attention=name, seq_len=n, batch_size=1,
                                                     query_rate=LONG["query_rate"]), steps=2, warmup=1)
        record["one_step"].append(step)
        print(step, flush=True)
        save()
        if "error" in step["naive"] and "error" not in step["flashlab"]:
            break
    long_len = record["long_len"] = n
    record["phases"] = []
    phases = [("short", {}, minutes[0]), ("medium", MEDIUM, minutes[1]), ("long", dict(LONG, seq_len=long_len),
                                                                         minutes[2])]
    record["phase_plan"] = phases
    steps_before = 0
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()          # from here on: training only
    for name, trainer in train_in_phases(*split_flat_config(model), phases, out):
        phase = {"name": name, "seq_len": trainer.task_config.seq_len, "query_rate": trainer.task_config.query_rate,
                 "batch_size": trainer.run.batch_size, "steps": trainer.step - steps_before,
                 "train_minutes": trainer.train_seconds / 60,
                 "peak_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
                 "accuracy_as_trained": trainer.evaluate(batches=4),
                 "recall_at_long": recall(trainer, long_len),
                 "recall_at_long_every_slot_asking": recall(trainer, long_len, query_rate=1.0, sequences=2),
                 "recall_at_twice_long": recall(trainer, 2 * long_len, sequences=8)}
        if name == "long":
            weights = {k: v.cpu() for k, v in trainer.model.state_dict().items()}
            checkpoint.save(f"{out}/mqar_long_model.pt", "lm-model",
                            {"task": dataclasses.asdict(trainer.task_config), "run": dataclasses.asdict(trainer.run)},
                            {"model": weights})
        record["phases"].append(phase)
        steps_before = trainer.step
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        print(name, {k: v for k, v in phase.items() if k != "recall_at_long"},
              phase["recall_at_long"]["accuracy"], flush=True)
        record["wall_minutes"] = (time.time() - start) / 60
        save()


if __name__ == "__main__":
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    main(sys.argv[1], [float(m) for m in sys.argv[2:5]], model=dict(MODEL, seed=seed))
