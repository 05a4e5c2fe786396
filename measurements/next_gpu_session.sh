#!/usr/bin/env bash
# One GPU call's work, by phase: bash measurements/next_gpu_session.sh PHASE OUT (OUT: the device's $OUT).
# Each phase fits one call (under 10 minutes); each says above its code what it runs and why. The history of
# the calls, what each found and what came next, is measurements/GPU_SESSIONS.md; the records, results/README.md.
#
# Next, on an H200 (2026-12-07 ran h200-targets, h200-in-one-call and rl4co-and-suite: results/README.md):
#   rl4co-100-and-suite OUT with carry=[".whl"]: RL4CO's REINFORCE step at 100 cities with the fp32 tour check
#                           (the 2026-12-07 call had time for 20 and 50), then the GPU suite to its end (~9 min).
#   A call returns at most 8 files: a phase that writes more packs them (h200-in-one-call: defaults.tgz).
set -u
phase=$1 out=$2
gpu_suite() {   # seconds: the GPU tests of issues 17, 19 and 21, 8 workers; SIGINT at the limit lets
                # pytest print its summary of what ran (step-and-verify's run of 2026-12-03 was
                # before tests/api/test_dropin.py joined the list)
  timeout -s INT -k 20 "$1" python -m pytest -q -p no:cacheprovider -o addopts= -n 8 tests/api/test_attention.py \
    tests/kernels/test_flash_hopper.py tests/launch/test_autotune.py tests/lessons/test_tf32.py tests/kernels/test_flash_small.py tests/api/test_dropin.py \
    tests/api/test_qkvpacked.py \
    -k "gpu or hopper or tf32 or cuda or masked_everywhere or leading_dimensions or shifted_far or mask or shipped" -rf --tb=short > "$out/gpu_tests.log" 2>&1; tail -n 25 "$out/gpu_tests.log"
}
small_path_suite() {   # the small path's tests, which run on the GPU whatever their names (gpu_suite's -k
                       # filter leaves them out)
  timeout -s INT -k 20 "$1" python -m pytest -q -p no:cacheprovider -o addopts= -n 8 tests/kernels/test_flash_small.py \
    tests/api/test_qkvpacked.py -rf \
    --tb=short > "$out/small_path_gpu_tests.log" 2>&1; tail -n 3 "$out/small_path_gpu_tests.log"
}
roofline_peaks() {   # notebook 02's two peaks: a bf16 8192³ matmul and a device-to-device copy (15 s)
  timeout 60 python -m measurements.roofline_peaks "$out" > "$out/roofline_peaks.log" 2>&1; tail -n 1 "$out/roofline_peaks.log"
}
qkvpacked_gpu_tests() {   # flashlab.attention_qkvpacked's tests on the GPU (70 s)
  timeout -s INT 70 python -m pytest -q -p no:cacheprovider -o addopts= tests/api/test_qkvpacked.py -rf --tb=short \
    > "$out/qkvpacked_gpu_tests.log" 2>&1; tail -n 3 "$out/qkvpacked_gpu_tests.log"
}
d16_choices_and_encoder() {   # the small kernels' launch choices at D = 16, then the encoder step (300 s)
  timeout 300 python -m measurements.small_graphs "$out" --sections choices encoder_tiles --choice-d 16 \
    --choice-n 100 50 20 --tsp-nodes 100 50 20 --budget-s 260 > "$out/small_graphs.log" 2>&1; tail -n 8 "$out/small_graphs.log"
}
mask_grid() {   # FILE LABEL: mask_overhead_check's small-path grid into FILE (.json, and .log beside it), one line
  FLASHLAB_AUTOTUNE=0 timeout 110 python -m measurements.mask_overhead_check "$1" small-grid > "${1%.json}.log" 2>&1
  python - "$1" "$2" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print(f"{sys.argv[2]}: " + " ".join(f"N{r['N']}D{r['D']}{r['mask'][0]} {r['fwd_ms']:.4f}/{r['step_ms']:.4f}" for r in rows))
PY
}
if [ "$phase" = rl4co-wheels ]; then
  mkdir -p .whl
  for p in rl4co==0.7.0 torchrl==0.12.0 tensordict==0.12.4 hydra-core==1.3.8 omegaconf==2.3.0 colorlog==6.12.0 \
      robust-downloader==0.0.2 pyvers==0.2.3 importlib_metadata==10.2.0 orjson==3.13.0; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d .whl "$p" || exit 1
  done
  python3 -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w .whl || exit 1   # an sdist only: built here
  ls .whl; exit 0
fi
tsp100_train() {   # SECONDS MINUTES LOG [--resume PATH]: train-tsp on TSP100 (small path, step compiled) into runs/tsp100
  local seconds=$1 minutes=$2 log=$3; shift 3
  timeout "$seconds" python -m flashlab train-tsp --n-nodes 100 --precision bf16-mixed --attention flashlab \
    --steps 10000000 --time-limit-min "$minutes" --checkpoint-every 500 --no-progress --out-dir runs/tsp100 \
    --compile reduce-overhead "$@" > "$out/$log" 2>&1; tail -n 2 "$out/$log"
}
tsp100_export_and_eval() {   # SECONDS: runs/tsp100's last checkpoint exported, evaluated on 10,000 instances, and
                             # the metrics and the training state (gzipped: under the 16 MiB a returned file may have) to OUT
  python -m measurements.export_tsp_policy runs/tsp100/checkpoint_last.pt "$out/am_tsp100.pt"
  timeout "$1" python -m flashlab eval-tsp --checkpoint "$out/am_tsp100.pt" --nodes 100 --instances 10000 \
    --save-tours "$out/tsp100_test_tours.npz" > "$out/tsp100_eval.log" 2>&1; cat "$out/tsp100_eval.log"
  gzip -n -c runs/tsp100/metrics.csv > "$out/tsp100_metrics.csv.gz"   # results/ keeps it compressed
  gzip -c runs/tsp100/checkpoint_last.pt > "$out/tsp100_training_state.pt.gz"
}
rl4co_step() {   # SECONDS [ARGS...]: the carried wheels (.whl/) installed to /tmp/site, then measurements.rl4co_step
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$out/rl4co_install.log" 2>&1 || { tail -n 5 "$out/rl4co_install.log"; exit 1; }
  PYTHONPATH=".:/tmp/site" timeout "$1" python -m measurements.rl4co_step "$out" "${@:2}" > "$out/rl4co_step.log" 2>&1
  grep -v Warning "$out/rl4co_step.log" | tail -n 8
}
export PYTHONUNBUFFERED=1   # run from the repository root: python -m finds flashlab and measurements there
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
if [ "$phase" = check ]; then
  timeout 400 python -m pytest -q -o addopts="" -p no:cacheprovider tests/api/test_attention.py -k "gpu" \
    --durations=15 > "$out/gpu_tests_attention.log" 2>&1; tail -n 25 "$out/gpu_tests_attention.log"
  timeout 120 python -m measurements.kernel_resources "$out/kernel_resources.json" > "$out/kernel_resources.log" 2>&1
  tail -n 4 "$out/kernel_resources.log"
elif [ "$phase" = mqar ]; then
  timeout 570 python -m measurements.long_context_mqar "$out" 1.5 1 2.5 > "$out/mqar.log" 2>&1; tail -n 6 "$out/mqar.log"
  rm -f "$out"/*/checkpoint_*.pt
elif [ "$phase" = mqar-seed1-and-check ]; then
  # a second seed of the long-context run (short phase cut to 0.5 min: the first run was at
  # 100% after 5 s of it), then as much of "check" as fits in the rest of the 10 minutes
  timeout 330 python -m measurements.long_context_mqar "$out" 0.5 1 2 1 > "$out/mqar.log" 2>&1; tail -n 3 "$out/mqar.log"
  rm -f "$out"/*/checkpoint_*.pt
  timeout 235 python -m pytest -q -o addopts="" -p no:cacheprovider tests/api/test_attention.py -k "gpu" -rf \
    --tb=line > "$out/gpu_tests_attention.log" 2>&1; tail -n 8 "$out/gpu_tests_attention.log"
elif [ "$phase" = verify ]; then
  gpu_suite 420
  small_path_suite 120
elif [ "$phase" = profile-and-ladder ]; then
  # issue 19: where an eager small call spends its host time; issue 21: the ladder again, step 4
  # reordered from the first full run (its dispatched tiles are each list's first)
  timeout 60 python -m measurements.small_eager_profile "$out" > /dev/null 2>&1; head -n 3 "$out/small_eager_profile.txt"
  timeout 500 python -m measurements.hopper_ladder "$out" --budget-s 430 > "$out/ladder.log" 2>&1; tail -n 8 "$out/ladder.log"
elif [ "$phase" = ladder ]; then
  timeout 570 python -m measurements.hopper_ladder "$out" --budget-s 450 > "$out/ladder.log" 2>&1; tail -n 12 "$out/ladder.log"
elif [ "$phase" = checks ]; then
  # correctness first, in parallel (compilation-bound; 16 CPU cores): the property test as 8
  # processes of 100 examples with different seeds, the dense-window tests, the TF32 tests;
  # then, alone on the GPU, notebook 10's window timing
  for s in 0 1 2 3 4 5 6 7; do
    FLASHLAB_PROPERTY_SEED=$s FLASHLAB_PROPERTY_EXAMPLES=100 timeout 260 python -m pytest -q -p no:cacheprovider \
      -o addopts= tests/api/test_attention_properties.py -rA --tb=short > "/tmp/property_seed$s.log" 2>&1 &
  done
  timeout 150 python -m pytest -q -p no:cacheprovider -o addopts= tests/api/test_attention.py -k window -rA \
    > "$out/window_tests.log" 2>&1; tail -n 3 "$out/window_tests.log"
  timeout 150 python -m pytest -q -p no:cacheprovider -o addopts= tests/launch/test_autotune.py -k "tf32" -rA \
    --tb=long > "$out/tf32.log" 2>&1; tail -n 30 "$out/tf32.log"
  wait
  for s in 0 1 2 3 4 5 6 7; do echo "== seed $s"; cat "/tmp/property_seed$s.log"; done > "$out/property_gpu.log"
  grep -h "passed\|failed\|error" /tmp/property_seed*.log | tail -n 8
  mkdir -p "$out/nb10" && cp results/h200/decode_varlen.json "$out/nb10/"
  timeout 200 python -m measurements.nb10_h200 "$out/nb10" windows > "$out/nb10/windows.log" 2>&1; tail -n 6 "$out/nb10/windows.log"
elif [ "$phase" = verify-and-resume ]; then
  gpu_suite 150
  mkdir -p runs/tsp50 && cp checkpoints/tsp50_training_state.pt runs/tsp50/checkpoint_last.pt
  gunzip -c results/h200/tsp/tsp50_metrics.csv.gz > runs/tsp50/metrics.csv
  # a kill by the timeout keeps the last checkpoint (every 500 steps); the export below reads it
  timeout 400 python -m flashlab train-tsp --n-nodes 50 --precision bf16-mixed --attention flashlab --steps 10000000 \
    --time-limit-min 16 --checkpoint-every 500 --no-progress --out-dir runs/tsp50 --compile reduce-overhead \
    --resume runs/tsp50/checkpoint_last.pt > "$out/tsp50_train_third.log" 2>&1; tail -n 2 "$out/tsp50_train_third.log"
  python -m measurements.export_tsp_policy runs/tsp50/checkpoint_last.pt "$out/am_tsp50.pt"
  python -m flashlab eval-tsp --checkpoint "$out/am_tsp50.pt" --nodes 50 --instances 10000 \
    --save-tours "$out/tsp50_test_tours.npz" > "$out/tsp50_eval.log" 2>&1; cat "$out/tsp50_eval.log"
  gzip -n -c runs/tsp50/metrics.csv > "$out/tsp50_metrics.csv.gz"; gzip -c runs/tsp50/checkpoint_last.pt > "$out/tsp50_training_state.pt.gz"   # under 16 MiB
elif [ "$phase" = step-and-verify ]; then
  # issue 19 first (it decides how the retraining runs): the TSP50 REINFORCE step, eager and
  # compiled (reduce-overhead), SDPA and flashlab; then the GPU tests for the rest of the 10 minutes
  timeout 250 python -m measurements.small_graphs "$out" --sections tsp_train --train-nodes 50 --budget-s 200 \
    > "$out/small_graphs.log" 2>&1; tail -n 6 "$out/small_graphs.log"
  gpu_suite 300
elif [ "$phase" = finish ]; then
  # 2026-12-04, after verify-and-resume and compiled-steps: fp32 exact against TF32 with the
  # operand rounding (time and error), then the whole GPU suite with room to finish
  timeout 120 python -m measurements.dropin_gpu "$out" fp32_exact_vs_tf32 > "$out/fp32_tf32.log" 2>&1; tail -n 3 "$out/fp32_tf32.log"
  gpu_suite 330
elif [ "$phase" = small-path-correct ]; then
  # 2026-12-04: the small path's own tests on the GPU (the suite's -k filter had left them out, and
  # small_graphs' correctness section checked only the general kernels there): whether it can be
  # on by default on a GPU
  small_path_suite 200     # (as run on 2026-12-04 it gave -rA: every test's PASSED line)
  timeout 120 python -m measurements.small_graphs "$out" --sections correctness --budget-s 90 \
    > "$out/small_graphs_correctness.log" 2>&1; tail -n 3 "$out/small_graphs_correctness.log"
elif [ "$phase" = small-table ]; then
  # 2026-12-04: the table again with the small path ahead of the Hopper kernels (D = 64: the
  # "general" column is now the Hopper path, which was off when small_graphs.json was recorded)
  timeout 150 python -m measurements.small_graphs "$out" --sections table --budget-s 100 \
    > "$out/small_graphs.log" 2>&1; tail -n 12 "$out/small_graphs.log"
elif [ "$phase" = host-and-encoder ]; then
  # issue 19, 2026-12-04 (second session): where an eager small-path forward+backward spends its
  # time, piece by piece, Triton's launch against flashlab.launch.direct (and whether the two give
  # identical bits); the direct launch's GPU tests; then the encoder step on the small path
  timeout 300 python -m measurements.small_host_time "$out" > "$out/small_host_time.log" 2>&1; tail -n 7 "$out/small_host_time.log"
  timeout 90 python -m pytest -q -p no:cacheprovider -o addopts= tests/launch/test_direct_launch.py -rA --tb=short \
    > "$out/direct_launch_gpu_tests.log" 2>&1; tail -n 3 "$out/direct_launch_gpu_tests.log"
  small_path_suite 80      # the small path's own tests, now through the direct launch
  timeout 150 python -m measurements.small_graphs "$out" --sections tsp_encoder --budget-s 120 \
    > "$out/small_graphs.log" 2>&1; tail -n 4 "$out/small_graphs.log"
elif [ "$phase" = direct-table-encoder ]; then
  # issue 19, 2026-12-04 (second session), after host-and-encoder: the direct launch's GPU tests
  # (graph-capture test fixed), the table and the encoder step with the direct launch on, the
  # encoder step also captured whole in a CUDA graph; then a second sample of the host-time pieces
  timeout 90 python -m pytest -q -p no:cacheprovider -o addopts= tests/launch/test_direct_launch.py -rA --tb=short \
    > "$out/direct_launch_gpu_tests.log" 2>&1; tail -n 2 "$out/direct_launch_gpu_tests.log"
  timeout 230 python -m measurements.small_graphs "$out" --sections table tsp_encoder --budget-s 200 \
    > "$out/small_graphs.log" 2>&1; tail -n 12 "$out/small_graphs.log"
  mkdir -p "$out/second"
  timeout 200 python -m measurements.small_host_time "$out/second" > "$out/second/small_host_time.log" 2>&1
  tail -n 6 "$out/second/small_host_time.log"; rm -f "$out/second/small_host_time_trace.json"
elif [ "$phase" = choices-and-thin ]; then
  # issue 19, 2026-12-04 (second session): the small kernels' launch choices, now with the small path
  # on (2026-12-03's run timed the general kernels for every choice); then what an eager call costs
  # below flashlab's layers: the small kernels behind the thinnest autograd.Function
  timeout 200 python -m measurements.small_graphs "$out" --sections choices --budget-s 170 \
    > "$out/small_graphs.log" 2>&1; tail -n 4 "$out/small_graphs.log"
  timeout 150 python -m measurements.small_host_time "$out/thin" --quick --shapes 20x16,50x16,100x16 --calls 300 \
    > "$out/small_host_time_thin.log" 2>&1; tail -n 4 "$out/small_host_time_thin.log"
elif [ "$phase" = defaults-verify ]; then
  # issue 19, 2026-12-04 (second session), after choices-and-thin: the small path's D = 16 backward
  # defaults changed from that run (64-row tiles at 33-128 keys, 16 rows and 2 warps up to 32):
  # its tests, small_graphs' correctness section, the table and the encoder step again
  small_path_suite 80
  timeout 250 python -m measurements.small_graphs "$out" --sections correctness table tsp_encoder --budget-s 200 \
    > "$out/small_graphs.log" 2>&1; tail -n 16 "$out/small_graphs.log"
elif [ "$phase" = eager-host ]; then
  small_path_suite 90
  # the drop-in fixes of 2026-12-04's third session on CUDA tensors (autocast('cuda'), second derivatives, torch.func, ranks)
  timeout 100 python -m pytest -q -p no:cacheprovider -o addopts= tests/api/test_dropin.py tests/api/test_attention.py \
    -k "second_derivative or autocast or torch_func or ranks_that or argument_names or jit_trace" -rf --tb=short \
    > "$out/dropin_fixes_gpu_tests.log" 2>&1; tail -n 3 "$out/dropin_fixes_gpu_tests.log"
  timeout 60 python -m measurements.python_layers "$out" --label h200 > "$out/python_layers.log" 2>&1
  tail -n 8 "$out/python_layers.log"
  # (small_host_time's thin-Function comparison, 2 more minutes, left out on 2026-12-05: refusals left budget
  # for three calls; python_layers gives the per-call Python with the kernels removed)
  timeout 180 python -m measurements.small_graphs "$out" --sections table tsp_encoder --budget-s 150 \
    > "$out/small_graphs.log" 2>&1; tail -n 12 "$out/small_graphs.log"
elif [ "$phase" = mask-tests ]; then
  # 2026-12-06: each row's fix applied inside the backward kernels: every mask test of the drop-in, small-path,
  # transformers and attention files, then the measured comparison against each SDPA backend
  timeout -s INT -k 20 200 python -m pytest -q -p no:cacheprovider -o addopts= -n 8 tests/api/test_dropin.py \
    tests/kernels/test_flash_small.py tests/api/test_transformers.py tests/api/test_attention.py tests/launch/test_direct_launch.py \
    -k "mask or finfo or shifted or padding or transformers or small or direct" -rf --tb=short \
    > "$out/mask_gpu_tests.log" 2>&1; tail -n 12 "$out/mask_gpu_tests.log"
  timeout 100 python -m measurements.masked_rows_grad_check "$out/masked_rows_grad_check.txt" 2>&1 | grep 'flashlab\|^N'
elif [ "$phase" = h200-tiles-or-h100-checks ]; then
  # 2026-12-06 (fifth session): mask-tests passed on an H100 but for a test that gave is_causal beside a mask on
  # CUDA (refused there, as SDPA does; fixed). One call for whichever card comes: on an H200, tiles (then at once
  # defaults-from-tiles); on an H100, the whole GPU suite with the final fix, and its cost: the code before any
  # fix (carry runs/old_flashlab, from `git archive 8607f92 flashlab`) and after it, three interleaved rounds (SKIP_SUITE=1: those alone)
  if grep -q H200 "$out/gpu.txt"; then exec bash "$0" tiles "$out"; fi
  [ "${SKIP_SUITE:-0}" = 1 ] || gpu_suite 300
  mkdir -p "$out/cost"
  for round in 1 2 3; do
    for code in old new; do
      path=.; [ $code = old ] && path=runs/old_flashlab:.
      # -P: python -m would put the working directory ahead of PYTHONPATH, and the "old" runs would import
      # the new flashlab (as both runs of 2026-12-06's fourth session did: their records name one path)
      PYTHONPATH=$path FLASHLAB_AUTOTUNE=0 timeout 100 python -P -m measurements.float_mask_fix_cost \
        "$out/cost/float_mask_fix_cost_${code}_$round.json" > "$out/cost/${code}_$round.log" 2>&1
      grep -o '"N": [0-9]*\|flashlab_float_ms": [0-9.]*\|flashlab_bool_ms": [0-9.]*' "$out/cost/${code}_$round.log" \
        | paste -sd' ' | sed "s/^/$code $round: /"
      grep -o '"flashlab": "[^"]*"' "$out/cost/float_mask_fix_cost_${code}_$round.json"
    done
  done
elif [ "$phase" = small-step-old-new ]; then
  # 2026-12-06 (fifth session): in h200-tiles-or-h100-checks' three rounds the eager N = 50 step took 0.17-0.21 ms
  # before the fix and 0.22-0.52 after it, unmasked too (the fix touches only float masks; the CPU's per-call
  # Python, measurements.python_layers, is the same at both). Eight runs of that shape alone, the order
  # alternating (old new new old ...), to tell a change from the run-to-run spread of launch-bound timings
  mkdir -p "$out/small"
  for code in old new new old old new new old; do
    path=.; [ $code = old ] && path=runs/old_flashlab:.
    i=$(( $(ls "$out/small" | grep -c "^${code}_") + 1 ))
    PYTHONPATH=$path FLASHLAB_AUTOTUNE=0 timeout 60 python -P -m measurements.float_mask_fix_cost \
      "$out/small/${code}_$i.json" small > /dev/null 2>&1
    python -c "import json,sys; r=json.load(open(sys.argv[1])); x=r['rows'][0]; print(sys.argv[2], r['flashlab'][-30:], \
      {k: round(v, 3) for k, v in x.items() if k.endswith('_ms')})" "$out/small/${code}_$i.json" $code
  done
elif [ "$phase" = mask-tests-then-tiles-min ]; then
  # 2026-12-06 (fifth session): the forward kernels now write each row's fix l_fix_offset entries after L, as
  # the backward reads it (no L_FIX pointer): mask-tests on any card, then on an H200 tiles-min (issue 19's
  # encoder target at 100 cities) with the budget that is left (~12 minutes)
  bash "$0" mask-tests "$out"
  if grep -q H200 "$out/gpu.txt"; then bash "$0" tiles-min "$out"; fi
elif [ "$phase" = first-of-session ]; then
  # 2026-12-06 (sixth session): one first call for whichever card comes. An H200 is rare (six sessions gave
  # H100s): there, tiles at once (then defaults-from-tiles on the same warm machine, then mask-tests); on an
  # H100, mask-tests (d7d96b0 and the fixed test), then row-shared in the next call
  if grep -q H200 "$out/gpu.txt"; then exec bash "$0" tiles "$out"; fi
  exec bash "$0" mask-tests "$out"
elif [ "$phase" = tiles-or-suite ]; then
  # 2026-12-06 (sixth session), after the shared-row load became the default: on an H200, tiles (then at once
  # defaults-from-tiles); on an H100, the GPU suite and the small path's tests with that default
  if grep -q H200 "$out/gpu.txt"; then exec bash "$0" tiles "$out"; fi
  gpu_suite 400
  small_path_suite 150
elif [ "$phase" = row-shared ]; then
  # 2026-12-06 (fifth session): the row-shared mask load again (FLASHLAB_MASK_ROW_SHARED=1, off by default). Its
  # first trial's "before" ran the same code as its "after" (python -m and PYTHONPATH), so "no gain" was unfounded;
  # its numbers (0.85 ms against 1.60 forward) were the row-shared code's. The mask tests with it on, then
  # mask_overhead_check with the switch off and on, same tree, four alternating runs (~5 min)
  FLASHLAB_MASK_ROW_SHARED=1 timeout -s INT -k 20 170 python -m pytest -q -p no:cacheprovider -o addopts= -n 8 \
    tests/api/test_dropin.py tests/api/test_attention.py tests/api/test_transformers.py \
    -k "mask or padding or shared_row or finfo or shifted or transformers" -rf --tb=short \
    > "$out/row_shared_gpu_tests.log" 2>&1; tail -n 6 "$out/row_shared_gpu_tests.log"
  for on in 0 1 1 0; do
    i=$(( $(ls "$out" | grep -c "^mask_overhead_row_shared_${on}_.*json") + 1 ))
    FLASHLAB_MASK_ROW_SHARED=$on FLASHLAB_AUTOTUNE=0 timeout 100 python -m measurements.mask_overhead_check \
      "$out/mask_overhead_row_shared_${on}_$i.json" > "$out/mask_overhead_row_shared_${on}_$i.log" 2>&1
    grep '"N": 4096' "$out/mask_overhead_row_shared_${on}_$i.log" | grep -o '"mask": "[^"]*", "impl": "flashlab", "fwd_ms": [0-9.]*, "step_ms": [0-9.]*' \
      | sed "s/^/switch $on: /"
  done
elif [ "$phase" = h200-or-small-row-shared ]; then
  # 2026-12-06 (sixth session): on an H200, h200-in-one-call; on an H100, the small path's kernels with the
  # shared-row mask load (FLASHLAB_MASK_ROW_SHARED=all; the default 1 leaves them on the copies' load): their tests
  # and the mask tests with it, then mask_overhead_check's small shapes (CUDA-graph replay) with 1 and all, same
  # tree, four alternating runs (~4 min). If all is faster, make it the small path's default too
  if grep -q H200 "$out/gpu.txt"; then exec bash "$0" h200-in-one-call "$out"; fi
  FLASHLAB_MASK_ROW_SHARED=all timeout -s INT -k 20 150 python -m pytest -q -p no:cacheprovider -o addopts= -n 8 tests/kernels/test_flash_small.py \
    tests/api/test_dropin.py tests/api/test_transformers.py -k "small or mask or padding or shared_row or finfo or transformers" \
    -rf --tb=short > "$out/small_row_shared_gpu_tests.log" 2>&1; tail -n 4 "$out/small_row_shared_gpu_tests.log"
  for on in 1 all all 1; do
    i=$(( $(ls "$out" | grep -c "^small_mask_row_shared_${on}_.*json") + 1 ))
    FLASHLAB_MASK_ROW_SHARED=$on FLASHLAB_AUTOTUNE=0 timeout 100 python -m measurements.mask_overhead_check \
      "$out/small_mask_row_shared_${on}_$i.json" small > "$out/small_mask_row_shared_${on}_$i.log" 2>&1
    grep '"impl": "flashlab"' "$out/small_mask_row_shared_${on}_$i.log" | grep -o '"N": [0-9]*\|"mask": "[^"]*"\|"fwd_ms": [0-9.]*\|"step_ms": [0-9.]*' \
      | paste -sd' ' | sed "s/^/switch $on: /"
  done
elif [ "$phase" = h200-targets-or-default-check ]; then
  # 2026-12-06 (seventh session), after the small path's kernels took the shared row up to 64-key tiles by default:
  # on an H200 h200-targets; on an H100 the small path's and the mask tests with that default, then
  # the grid once with the default and once with 0 (the copies' load everywhere)
  if grep -q H200 "$out/gpu.txt"; then exec bash "$0" h200-targets "$out"; fi
  timeout -s INT -k 20 150 python -m pytest -q -p no:cacheprovider -o addopts= -n 8 tests/kernels/test_flash_small.py \
    tests/api/test_dropin.py tests/api/test_transformers.py -k "small or mask or padding or shared_row or finfo or transformers" \
    -rf --tb=short > "$out/default_gpu_tests.log" 2>&1; tail -n 4 "$out/default_gpu_tests.log"
  mask_grid "$out/grid_default.json" default
  FLASHLAB_MASK_ROW_SHARED=0 mask_grid "$out/grid_0.json" 0
  (cd "$out" && tar czf logs.tgz ./*.log && rm ./*.log)
elif [ "$phase" = h200-targets-or-suite ]; then
  # 2026-12-06 (eighth session): on an H200 h200-targets; on an H100 the GPU suite and the small path's tests at
  # this session's head (last run whole on 2026-12-06's first H100; since: the shared-row default, its test fix, the
  # graphed module's per-iteration del), ~6 min
  if grep -q H200 "$out/gpu.txt"; then exec bash "$0" h200-targets "$out"; fi
  gpu_suite 260
  small_path_suite 120
elif [ "$phase" = h200-targets-or-rl4co ]; then
  # 2026-12-06 (eighth session, after h200-targets-or-suite ran its suite on an H100): on an H200 h200-targets; on
  # an H100 RL4CO's step with the fp32 tour check and 7 rounds, never run on a GPU yet (carry .whl), ~7 min
  if grep -q H200 "$out/gpu.txt"; then exec bash "$0" h200-targets "$out"; fi
  rl4co_step 420
elif [ "$phase" = h200-targets-or-fixes ]; then
  # 2026-12-07: on an H200 h200-targets; on an H100 the tests the H100 suite of 2026-12-07 failed, after their fixes
  # (DDP's backend follows the run's device; the property test's seeds and P·|V| scale; the minimal kernel's
  # overflow test in fp16; the benchmark's row count; ipywidgets), then the property test at 500 examples (~4 min)
  if grep -q H200 "$out/gpu.txt"; then exec bash "$0" h200-targets "$out"; fi
  timeout -s INT -k 10 200 python -m pytest -q -p no:cacheprovider -o addopts= -n 8 tests/train/test_trainer.py \
    tests/train/test_kill_resume.py tests/api/test_attention.py -k "ddp or torchrun or backend or deterministic" -rfE --tb=short \
    > "$out/fixes_ddp.log" 2>&1
  grep -v DEBUG "$out/fixes_ddp.log" | tail -n 12
  timeout -s INT -k 10 150 python -m pytest -q -p no:cacheprovider -o addopts= -n 8 tests/lessons/test_flash_minimal.py \
    tests/bench/test_benchmarks.py tests/lessons/test_widgets.py -rfE --tb=short > "$out/fixes_other.log" 2>&1
  grep -v DEBUG "$out/fixes_other.log" | tail -n 8
  FLASHLAB_PROPERTY_EXAMPLES=500 timeout -s INT -k 10 200 python -m pytest -q -p no:cacheprovider -o addopts= \
    tests/api/test_attention_properties.py -rfE --tb=short > "$out/fixes_property.log" 2>&1; tail -n 12 "$out/fixes_property.log"
elif [ "$phase" = h200-targets-or-all-tests ]; then
  # 2026-12-06 (eighth session, the budget's last call): on an H200 h200-targets; on an H100 every test in tests/
  # (not only gpu_suite's -k selection), 8 workers, for what the GPU machine's packages allow (~7 min)
  if grep -q H200 "$out/gpu.txt"; then exec bash "$0" h200-targets "$out"; fi
  # 560 s: at 400 the first H100 run of 2026-12-07 was cut near its end and printed no summary (-v names each result)
  timeout -s INT -k 20 560 python -m pytest -q -v -p no:cacheprovider -o addopts= -n 8 tests -rfE --tb=short \
    > "$out/all_tests.log" 2>&1; grep -E "^(FAILED|ERROR)" "$out/all_tests.log" | tail -n 20; tail -n 2 "$out/all_tests.log"
elif [ "$phase" = h200-targets-short ]; then
  # 2026-12-07 (second session), for the budget's last 9 minutes: h200-targets without the launch choices (~5.5 min)
  if ! grep -q H200 "$out/gpu.txt"; then echo "not an H200: nothing run"; exit 0; fi
  roofline_peaks
  timeout 300 python -m measurements.small_graphs "$out" --sections table tsp_encoder encoder_tiles \
    --tsp-nodes 100 50 20 --budget-s 260 > "$out/small_graphs.log" 2>&1; tail -n 20 "$out/small_graphs.log"
elif [ "$phase" = h200-targets ]; then
  # 2026-12-06 (seventh session), for a budget refusals ate into: on an H200 issue 19's targets first, with the
  # launches flashlab ships (roofline peaks; the table of forward+backward against SDPA's backends at N = 20-128, D = 16
  # and 64; the encoder step eager, compiled and captured; the packed form against three views), then the D = 16 and
  # D = 32 launch choices for what time is left. On an H100 (its A/Bs of this session are recorded) nothing
  if ! grep -q H200 "$out/gpu.txt"; then echo "not an H200: nothing run"; exit 0; fi
  roofline_peaks
  timeout 300 python -m measurements.small_graphs "$out" --sections table tsp_encoder encoder_tiles \
    --tsp-nodes 100 50 20 --budget-s 260 > "$out/small_graphs.log" 2>&1; tail -n 20 "$out/small_graphs.log"
  mkdir -p "$out/choices"
  timeout 200 python -m measurements.small_graphs "$out/choices" --sections choices --choice-d 16 32 \
    --choice-n 100 50 20 --budget-s 170 > "$out/choices/small_graphs.log" 2>&1; tail -n 8 "$out/choices/small_graphs.log"
elif [ "$phase" = small-row-shared-grid ]; then
  # 2026-12-06 (seventh session): h200-or-small-row-shared ran on an H100. The shared row made the small path's
  # masked calls 4x faster at 512 x 8 x 50 x 16 and 2x slower at 32 x 12 x 128 x 64; its one failure was the test's
  # (a window aligned at the end of the keys against is_causal at the start, Nq != Nk). The fixed test with the
  # switch's default and with all, then where the shared row pays: N = 20-128 x D = 16, 64, four alternating runs
  for on in 1 all; do
    FLASHLAB_MASK_ROW_SHARED=$on timeout -s INT -k 20 60 python -m pytest -q -p no:cacheprovider -o addopts= \
      tests/api/test_dropin.py -k "shared_row or masked_everywhere_beside" -rf --tb=short > "$out/shared_row_tests_$on.log" 2>&1
    tail -n 1 "$out/shared_row_tests_$on.log" | sed "s/^/switch $on: /"
  done
  for on in 1 all all 1; do
    i=$(( $(ls "$out" | grep -c "^grid_${on}_.*json") + 1 ))
    FLASHLAB_MASK_ROW_SHARED=$on mask_grid "$out/grid_${on}_$i.json" "switch $on"
  done
  (cd "$out" && tar czf logs.tgz ./*.log && rm ./*.log)   # at most 8 files come back
elif [ "$phase" = h200-in-one-call ]; then
  # 2026-12-06 (sixth session): tiles and defaults-from-tiles in one call, for a budget that leaves one. On an
  # H100 (tiles and the launches file are recorded for it) it stops at once. On the H100 these steps took
  # 40 + 87 + 163 s (results/h100/small_graphs_tiles.log, small_graphs_choices_d32_d64.log,
  # defaults_verify_2026-12-06/small_graphs.log); the packed form's and the small path's tests passed there this
  # session (results/h100/gpu_suite_row_shared_default_2026-12-06/), so they are left out here
  if ! grep -q H200 "$out/gpu.txt"; then echo "not an H200: nothing run"; exit 0; fi
  roofline_peaks
  timeout 180 python -m measurements.small_graphs "$out" --sections choices encoder_tiles --choice-d 16 \
    --choice-n 100 50 20 --tsp-nodes 100 50 20 --budget-s 150 > "$out/small_graphs.log" 2>&1; tail -n 8 "$out/small_graphs.log"
  mkdir -p "$out/d32_d64" "$out/defaults"
  timeout 120 python -m measurements.small_graphs "$out/d32_d64" --sections choices --choice-d 32 64 \
    --choice-n 100 50 20 --budget-s 90 > "$out/d32_d64/small_graphs.log" 2>&1; tail -n 8 "$out/d32_d64/small_graphs.log"
  python -m measurements.small_defaults results/h200/small_graphs_choices.json "$out/small_graphs.json" \
    "$out/d32_d64/small_graphs.json" || exit 1
  cp flashlab/tuned/small_path/*.json "$out/defaults/"
  timeout 200 python -m measurements.small_graphs "$out/defaults" --sections correctness table tsp_encoder \
    --budget-s 165 > "$out/defaults/small_graphs.log" 2>&1; tail -n 16 "$out/defaults/small_graphs.log"
  # notebook 09's breakdown of an eager call, from the same machine and code as the table above (2026-12-07: the
  # recorded breakdown and table came from different runs and code)
  timeout 75 python -m measurements.small_host_time "$out/defaults/thin" --quick --shapes 20x16,50x16,100x16 \
    --calls 200 > "$out/defaults/small_host_time_thin.log" 2>&1; tail -n 4 "$out/defaults/small_host_time_thin.log"
  # a call returns at most 8 files: on 2026-12-07 this phase wrote 13 and defaults/ did not come back
  (cd "$out" && tar czf defaults.tgz defaults && rm -rf defaults)
elif [ "$phase" = tiles ]; then
  # 2026-12-05 (fourth session, no GPU): flashlab.attention_qkvpacked, new since, is checked on the GPU first
  # (against float64, bf16 at N = 20-1000, bit for bit against the three views, compiled); the encoder step
  # then times it beside the three views
  roofline_peaks
  qkvpacked_gpu_tests
  d16_choices_and_encoder
  mkdir -p "$out/d32_d64"
  timeout 150 python -m measurements.small_graphs "$out/d32_d64" --sections choices --choice-d 32 64 \
    --choice-n 100 50 20 --budget-s 120 > "$out/d32_d64/small_graphs.log" 2>&1; tail -n 8 "$out/d32_d64/small_graphs.log"
  # kept on the machine (runs/ is git-ignored, so a warm machine keeps it) for defaults-from-tiles, the next call
  rm -rf runs/tiles && mkdir -p runs/tiles && cp "$out/small_graphs.json" runs/tiles/d16.json
  cp "$out/d32_d64/small_graphs.json" runs/tiles/d32_d64.json
elif [ "$phase" = defaults-from-tiles ]; then
  # 2026-12-06: straight after tiles on the same warm machine (the idle release is 30 s, too short to
  # compute the defaults here and send them): the GPU's measured launches from the stop-31 record and
  # tiles' two, written where flashlab reads them, then defaults-verify's checks and timings with them
  python -m measurements.small_defaults results/h200/small_graphs_choices.json runs/tiles/d16.json \
    runs/tiles/d32_d64.json || exit 1
  cp flashlab/tuned/small_path/*.json "$out/"
  small_path_suite 80
  timeout 250 python -m measurements.small_graphs "$out" --sections correctness table tsp_encoder --budget-s 200 \
    > "$out/small_graphs.log" 2>&1; tail -n 16 "$out/small_graphs.log"
elif [ "$phase" = tiles-d16 ]; then
  # 2026-12-05 (fifth session): tiles without the D = 32/64 choices, for a budget that refusals ate into
  roofline_peaks
  qkvpacked_gpu_tests
  d16_choices_and_encoder
elif [ "$phase" = tiles-min ]; then
  # the least that answers the encoder target: the packed form's GPU tests, the encoder step (no choices,
  # so no 'fastest launches' variant)
  roofline_peaks
  qkvpacked_gpu_tests
  timeout 170 python -m measurements.small_graphs "$out" --sections encoder_tiles --tsp-nodes 100 50 20 \
    --budget-s 140 > "$out/small_graphs.log" 2>&1; tail -n 8 "$out/small_graphs.log"
elif [ "$phase" = rl4co ]; then
  rl4co_step 420
elif [ "$phase" = rl4co-100-and-suite ]; then
  # 2026-12-07: rl4co-and-suite ran on the H200 with 20 and 50 cities in its 300 s and the suite cut at 230 s (339
  # passed): RL4CO's step at 100 cities with the fp32 tour check, then the whole GPU suite (~4.5 min)
  rl4co_step 270 --nodes 100
  gpu_suite 270
elif [ "$phase" = rl4co-and-suite ]; then
  # 2026-12-05: budget for at most three calls after refusals: RL4CO's step, then the GPU suite for the rest
  rl4co_step 300
  gpu_suite 230
elif [ "$phase" = suite-and-choices ]; then
  gpu_suite 330
  timeout 200 python -m measurements.small_graphs "$out" --sections choices --choice-d 32 64 --budget-s 170 \
    > "$out/small_graphs.log" 2>&1; tail -n 8 "$out/small_graphs.log"
elif [ "$phase" = tsp100-first ]; then
  # TSP100 from scratch on the small path (the GPU default), step compiled; the trainer stops itself at
  # 8 minutes of training (compilation included) and leaves runs/tsp100/checkpoint_last.pt
  # from scratch: a warm machine keeps ignored paths between calls, and train-tsp now refuses a
  # directory that holds a run (its checkpoint_last.pt and metrics.csv were copied to OUT before)
  rm -rf runs/tsp100
  mkdir -p runs/tsp100 "$out/runs/tsp100"
  tsp100_train 570 8 tsp100_train_first.log
  cp runs/tsp100/checkpoint_last.pt runs/tsp100/metrics.csv "$out/runs/tsp100/"
elif [ "$phase" = tsp100-single ]; then
  # 2026-12-05: when the session's budget leaves one call, not two: TSP100 from scratch, 7 minutes of training
  # (compilation included), exported and evaluated on 10,000 instances in the same call
  rm -rf runs/tsp100 && mkdir -p runs/tsp100
  tsp100_train 470 7 tsp100_train.log
  tsp100_export_and_eval 90
elif [ "$phase" = tsp100-finish ]; then
  # TSP100's last 3 of 16 minutes, from the shipped training state (13.0 min, 12,914 steps)
  # (as verify-and-resume did for TSP50: the state and the metrics so far in the run's directory, so that its
  # metrics.csv continues the first two commands')
  rm -rf runs/tsp100 && mkdir -p runs/tsp100
  cp checkpoints/tsp100_training_state.pt runs/tsp100/checkpoint_last.pt
  gunzip -c results/h200/tsp/tsp100_metrics.csv.gz > runs/tsp100/metrics.csv
  tsp100_train 420 16 tsp100_train_third.log --resume runs/tsp100/checkpoint_last.pt
  tsp100_export_and_eval 90
elif [ "$phase" = tsp100-second ]; then
  # needs runs/tsp100/checkpoint_last.pt and metrics.csv from tsp100-first's OUT in the tree: runs/ is
  # git-ignored, so copy them to runs/tsp100/ here and name it in the call's carry (["runs/tsp100"]);
  # the state is 11.4 MB of model, baseline and Adam's moments plus ~200 bytes a step of history
  # (checkpoints/tsp50_training_state.pt: 23,549 steps, 4.8 MB of history, 15.8 MiB in all), so TSP100's
  # 16 minutes fit the 16 MiB a returned file may have up to about 25,000 steps
  tsp100_train 500 16 tsp100_train_second.log --resume runs/tsp100/checkpoint_last.pt
  tsp100_export_and_eval 120
elif [ "$phase" = compiled-steps ]; then
  timeout 570 python -m measurements.small_graphs "$out" --sections tsp_encoder tsp_train --budget-s 480 \
    > "$out/small_graphs.log" 2>&1; tail -n 16 "$out/small_graphs.log"
elif [ "$phase" = small ]; then
  timeout 570 python -m measurements.small_graphs "$out" --budget-s 500 > "$out/small_graphs.log" 2>&1
  tail -n 14 "$out/small_graphs.log"
elif [ "$phase" = property ]; then
  FLASHLAB_PROPERTY_EXAMPLES=600 timeout 560 python -m pytest -q -p no:cacheprovider -o addopts= \
    tests/api/test_attention_properties.py -rA > "$out/property_gpu.log" 2>&1; tail -n 5 "$out/property_gpu.log"
else
  shift 2
  timeout 575 python -m flashlab bench --seq-lens 512 1024 2048 4096 8192 16384 --warmup-ms 10 --rep-ms 25 \
    --dtypes "$@" --flex-seq-lens 1024 4096 --out "$out/attention.json" > "$out/bench.log" 2>&1
  tail -n 3 "$out/bench.log"
fi
