#!/usr/bin/env bash
# What the next GPU session should run first, as two calls of under 10 minutes on an H200:
#   bash results/next_gpu_session.sh check OUT
#       the GPU attention tests (the 1-D grid and the backward's unmasked fast path were
#       written after the last GPU test run and are checked only in the interpreter), then
#       compiled-kernel resources (registers, spills, shared memory) for issue 5's analysis;
#   bash results/next_gpu_session.sh bench OUT
#       the benchmark sweep again (N = 512 … 16384) with the backward fast path and the
#       FlexAttention fix, to replace results/h200/attention*.json.
set -u
phase=$1 out=$2
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "$phase" = check ]; then
  timeout 480 python -m pytest -q -o addopts="" -p no:cacheprovider tests/test_attention.py \
    > "$out/gpu_tests_attention.log" 2>&1; tail -n 3 "$out/gpu_tests_attention.log"
  timeout 60 python results/kernel_resources.py "$out/kernel_resources.json" > "$out/kernel_resources.log" 2>&1
  tail -n 2 "$out/kernel_resources.log"
else
  timeout 560 python -m flashlab bench --seq-lens 512 1024 2048 4096 8192 16384 --warmup-ms 10 --rep-ms 25 \
    --flex-seq-lens 1024 4096 --out "$out/attention.json" > "$out/bench.log" 2>&1; tail -n 2 "$out/bench.log"
fi
