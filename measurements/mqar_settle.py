"""GPU probe (issue 7): can the trainer's transformer learn MQAR at all, given enough
sequences? Short sequences, large batches, SDPA attention, for a fixed time; recall accuracy
on held-out batches logged as it trains. CPU runs of 3000 steps × 64 sequences plateaued
at 21% (8 pairs, chance 3%).

    python -m measurements.mqar_settle OUT MINUTES
"""

import json
import sys
import time

from flashlab.bench.records import environment
from flashlab.train.trainer import Trainer, split_flat_config


def main(out: str, minutes: float) -> None:
    config = dict(seq_len=128, num_pairs=8, vocab_size=64, d_model=128, n_layers=2, n_heads=4, attention="sdpa",
                         positions="rotary", precision="bf16-mixed", batch_size=512, lr=1e-3, warmup_steps=200,
                         min_lr_ratio=1.0, steps=10**7, log_every=200, progress=False, device="cuda",
                         time_limit_min=minutes, out_dir=f"{out}/settle")
    start = time.time()
    trainer = Trainer(*split_flat_config(config))
    trainer.fit()
    record = {"environment": environment(), "config": {k: str(v) for k, v in config.items()},
              "steps": trainer.step, "sequences": trainer.step * config["batch_size"],
              "accuracy": trainer.evaluate(batches=8), "wall_minutes": (time.time() - start) / 60}
    print(record["steps"], record["accuracy"], flush=True)
    json.dump(record, open(f"{out}/mqar_settle.json", "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
