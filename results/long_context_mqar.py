"""GPU run for the capstone's long-context task (issue 7, task 2) on one H200.

Multi-query associative recall (flashlab.tasks) with the trainer's causal transformer,
rotary positions, bf16-mixed, flashlab attention:

1. one training step of the same model at the long length with naive attention (expected to
   run out of memory) and with flashlab (its peak memory);
2. training: most of the time at length SHORT (many sequences per step), then at length
   LONG (the key–value pairs open the sequence; queries about them fill the rest, so the
   first occurrence of a key can be up to LONG tokens back);
3. recall accuracy on held-out sequences at SHORT and at LONG, and peak memory.

    PYTHONPATH=. python results/long_context_mqar.py OUT_DIR SHORT_MINUTES LONG_MINUTES
"""

import dataclasses
import json
import sys
import time

import torch

from flashlab.results import environment
from flashlab.train import TrainConfig, Trainer
from results.train_measurements import attempt

# The first run (2026-12-02: N = 1024, 64 sequences per step) stayed on MQAR's plateau (11%).
# results/mqar_settle.py then learned it to 100% in under a minute with 512 sequences per step
# at N = 128, so the short phase now uses short sequences and large batches.
SHORT, LONG = 256, 65536
MODEL = TrainConfig(seq_len=SHORT, num_pairs=16, vocab_size=128, d_model=256, n_layers=4, n_heads=4,
                    positions="rotary", attention="flashlab", precision="bf16-mixed", batch_size=512, lr=1e-3,
                    warmup_steps=200, min_lr_ratio=1.0, steps=10**7, log_every=100, progress=False, device="cuda")


def main(out, short_minutes, long_minutes, model=MODEL, short_len=SHORT, long_len=LONG):
    record = {"environment": environment(), "model": dataclasses.asdict(model), "short": short_len, "long": long_len}
    path = f"{out}/long_context_mqar.json"
    save = lambda: json.dump(record, open(path, "w"), indent=1)   # noqa: E731
    record["one_step_at_long"] = {
        name: attempt(dataclasses.replace(model, attention=name, seq_len=long_len, batch_size=1), steps=1, warmup=1)
        for name in ("naive", "flashlab")}
    print(record["one_step_at_long"], flush=True)
    save()
    start = time.time()
    short = Trainer(dataclasses.replace(model, out_dir=f"{out}/short", time_limit_min=short_minutes))
    short.fit()
    record["short_phase"] = {"steps": short.step, "minutes": short.train_seconds / 60,
                             "accuracy_at_short": short.evaluate(batches=8)}
    print(record["short_phase"], flush=True)
    save()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    long = Trainer(dataclasses.replace(model, seq_len=long_len, batch_size=1, out_dir=f"{out}/long",
                                       resume=f"{out}/short/checkpoint_last.pt",
                                       time_limit_min=short_minutes + long_minutes))
    accuracy_before = long.evaluate(batches=4)
    long.fit()
    record["long_phase"] = {"steps": long.step - short.step, "minutes": long.train_seconds / 60 - short_minutes,
                            "accuracy_at_long_before": accuracy_before, "accuracy_at_long": long.evaluate(batches=4),
                            "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                            "answers_per_sequence": long.task.targets_per_example,
                            "wall_minutes": (time.time() - start) / 60}
    print(record["long_phase"], flush=True)
    save()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
