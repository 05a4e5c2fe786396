"""GPU measurements (H200) for the trainer: step time and peak memory of the causal
transformer at sequence length 4096 for five precision/attention configurations, and the
largest sequence length each one can train at (batch 1, powers of two).

Run on a GPU from the repository root:
    python -m measurements.train_measurements OUT.json [deadline_seconds]
"""

import json
import sys
import time

import torch

from flashlab.bench.records import environment
from flashlab.bench.train_step import measure_step
from flashlab.train.trainer import split_flat_config

MODEL = dict(seq_len=4096, num_pairs=512, vocab_size=8192, d_model=512, n_layers=4, n_heads=8, batch_size=8,
                    steps=10, warmup_steps=2, progress=False, device="cuda")
CONFIGS = [("32-true", "naive"), ("32-true", "flashlab"), ("bf16-mixed", "sdpa"), ("bf16-mixed", "flashlab"),
           ("16-mixed", "flashlab")]
LENGTHS = [4096, 8192, 16384, 32768, 65536, 131072]


def attempt(config, steps, warmup):
    try:
        return measure_step(*split_flat_config(config), steps=steps, warmup=warmup)
    except torch.OutOfMemoryError as error:
        return {"error": "out of memory", "detail": str(error).splitlines()[0][:200]}
    finally:
        torch.cuda.empty_cache()


def main(path, deadline):
    start = time.time()
    record = {"environment": environment(), "model": MODEL, "at_4096": [], "largest": []}
    for precision, attention in CONFIGS:
        config = dict(MODEL, precision=precision, attention=attention)
        result = attempt(config, steps=5, warmup=2)
        record["at_4096"].append({"precision": precision, "attention": attention, **result})
        print(precision, attention, result, flush=True)
        json.dump(record, open(path, "w"), indent=1)
    for precision, attention in CONFIGS:
        best = None
        for n in LENGTHS:
            if time.time() - start > deadline:
                record["largest"].append({"precision": precision, "attention": attention, "stopped": "deadline",
                                          "largest_seq_len": best})
                break
            config = dict(MODEL, precision=precision, attention=attention, seq_len=n, batch_size=1)
            result = attempt(config, steps=1, warmup=1)
            print(precision, attention, n, result, flush=True)
            if "error" in result:
                break
            best = {"seq_len": n, **result}
        record["largest"].append({"precision": precision, "attention": attention, "largest": best,
                                  "next_failed": n if best is None or best["seq_len"] != n else None})
        json.dump(record, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e9)
