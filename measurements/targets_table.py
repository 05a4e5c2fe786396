"""Issue 5's target table as Markdown, one row per measured shape, from a benchmark record:
each ratio is SDPA's time over flashlab's (memory: flashlab's extra bytes over the flash
backend's), measured in the same run; ✗ marks a missed target, – a ratio with no target there.

    python -m measurements.targets_table results/h200/attention.json > results/h200/targets_table.md
"""

import json
import sys

from flashlab.bench.analysis import shapes, target_table
from flashlab.bench.records import describe

COLUMNS = [("fwd", "sdpa_flash"), ("fwd", "sdpa_cudnn"), ("fwd+bwd", "sdpa_flash"), ("fwd+bwd", "sdpa_cudnn"),
           ("memory fwd+bwd", "sdpa_flash")]


def main(path):
    record = json.load(open(path))
    cells = {}
    for r in target_table(record):
        cells[(r["mode"], r["baseline"], r["N"], r["D"], r["causal"], r["dtype"])] = \
            f"{r['ratio']:.2f}" + ("" if r["met"] else " ✗")
    print(f"Targets on {describe(record)} (`{path}`); ✗ = missed.\n")
    print("| dtype | N | D | causal | fwd vs flash | fwd vs cuDNN | fwd+bwd vs flash | fwd+bwd vs cuDNN "
          "| memory vs flash |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, d, causal, dtype in sorted(shapes(record), key=lambda s: (s[3], s[1], s[2], s[0])):
        row = [cells.get((m, b, n, d, causal, dtype), "–") for m, b in COLUMNS]
        print(f"| {dtype[6:]} | {n} | {d} | {'yes' if causal else 'no'} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
