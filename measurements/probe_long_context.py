"""GPU probe (H200): how far past 131072 tokens each configuration of the trainer's causal
transformer trains (batch 1, one step), continuing measurements/train_measurements.py.

    python -m measurements.probe_long_context OUT.json
"""

import dataclasses
import json
import sys

from flashlab.bench.records import environment

from .train_measurements import MODEL, attempt

CONFIGS = [("bf16-mixed", "flashlab"), ("16-mixed", "flashlab"), ("bf16-mixed", "sdpa"), ("32-true", "flashlab")]


def main(path):
    record = {"environment": environment(), "model": dataclasses.asdict(MODEL), "rows": []}
    for precision, attention in CONFIGS:
        for n in (262144, 524288):
            config = dataclasses.replace(MODEL, precision=precision, attention=attention, seq_len=n, batch_size=1)
            result = attempt(config, steps=1, warmup=1)
            record["rows"].append({"precision": precision, "attention": attention, "seq_len": n, **result})
            print(precision, attention, n, result, flush=True)
            json.dump(record, open(path, "w"), indent=1)
            if "error" in result:
                break


if __name__ == "__main__":
    main(sys.argv[1])
