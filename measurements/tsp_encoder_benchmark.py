"""GPU measurement for the capstone: the TSP Attention Model's encoder (3 layers, 8 heads,
width 128) with naive, SDPA and flashlab attention, 10 … 10,000 nodes, forward and
forward+backward in bf16, with extra memory (claim 5 of notebook 07).

    python -m measurements.tsp_encoder_benchmark OUT.json
"""

import json
import sys

from flashlab.bench.encoder import benchmark_encoder
from flashlab.bench.records import environment

NODES = [10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]

if __name__ == "__main__":
    rows = benchmark_encoder(NODES, batch=512, warmup_ms=10, rep_ms=50)
    json.dump({"environment": environment(), "tokens": 512 * 10, "rows": rows}, open(sys.argv[1], "w"), indent=1)
    for r in rows:
        print(r, flush=True)
