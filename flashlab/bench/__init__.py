"""The benchmark harness and the measurement suites: the top layer of flashlab, which may import
every implementation.

- `flashlab.bench.attention`: flashlab vs naive, SDPA's backends, FlexAttention (notebook 07,
  ``python -m flashlab bench``).
- `flashlab.bench.softmax`: the fused softmax vs PyTorch's (notebook 02).
- `flashlab.bench.encoder`: the TSP Attention Model's encoder per attention (notebooks 07b and 09b).
- `flashlab.bench.train_step`: one trainer configuration's step time, memory and MFU.
- `flashlab.bench.analysis`: reading benchmark records: targets, ratios, fits, plots.
- `flashlab.bench.suite`, `flashlab.bench.suites`: the measurement suites, each declared once
  (what it measures, its shapes, its budget, its record), and `flashlab.bench.runner`, which runs
  them by name within one budget: ``python -m flashlab.bench run SUITE… --out DIR --budget-s S``.
- `flashlab.bench.records`: the suites' committed records, ``results/<gpu>/<suite>.json``, by name.

The measuring primitives they share (timers, FLOP counts, peak FLOP/s) are `flashlab.launch.timing`,
at the bottom, so that the autotuner and the trainer can time things without importing this.
"""
