#!/usr/bin/env bash
# GPU run of the capstone's TSP training (issue 7, notebook 09) on one H200, bf16-mixed,
# Kool et al.'s setup (TSPConfig defaults), flashlab attention.
#
#   bash measurements/tsp_train_h200.sh first  OUT   # TSP20 (8 min) and TSP50 (first 8 min), side by side
#   bash measurements/tsp_train_h200.sh second OUT   # TSP50 resumed from runs/tsp50 to 16 min in all
#
# TSP_TRAIN_OPTS adds train-tsp options to every training, e.g. the compiled step of issue 19:
#   TSP_TRAIN_OPTS="--compile reduce-overhead" bash measurements/tsp_train_h200.sh first OUT
# (compilation counts against --time-limit-min, as it would for anyone training this way). If a
# training with those options fails (exits non-zero) it is started again without them, and
# train_PHASE.log says so: a compile failure costs its minutes, not the call. Minutes:
# TSP20_MIN (8), TSP50_FIRST_MIN (8), TSP50_TOTAL_MIN (16). A
# fresh machine has no runs/: carry runs/tsp50/checkpoint_last.pt (from the first call's OUT)
# back into the tree for "second".
#
# The two trainings of "first" share the GPU (their work is small kernels and Python; each
# leaves the GPU mostly idle), so each one's wall-clock time is, if anything, longer than it
# would be alone. --time-limit-min counts training time across resumes. Each finished model
# is evaluated greedily on 10,000 fresh instances (eval-tsp's test seed, disjoint from
# training) with the tours saved; everything lands in OUT as one archive per problem size.
set -u
phase=$1 out=$2
export PYTHONUNBUFFERED=1   # run from the repository root: python -m finds flashlab and measurements there
train() {   # n, minutes, extra options
  local n=$1 minutes=$2; shift 2
  local log="runs/tsp$n/train_$phase.log"
  train_tsp() {
    python -m flashlab train-tsp --n-nodes "$n" --precision bf16-mixed --attention flashlab --steps 10000000 \
      --time-limit-min "$minutes" --checkpoint-every 1000 --no-progress --out-dir "runs/tsp$n" "$@"
  }
  train_tsp ${TSP_TRAIN_OPTS:-} "$@" > "$log" 2>&1 && return
  if [ -n "${TSP_TRAIN_OPTS:-}" ]; then
    echo "== the training with '$TSP_TRAIN_OPTS' failed (above); again without those options" >> "$log"
    mv "runs/tsp$n/metrics.csv" "runs/tsp$n/metrics_failed_$phase.csv" 2>/dev/null
    train_tsp "$@" >> "$log" 2>&1
  fi
}
evaluate() {
  local n=$1
  python -m flashlab eval-tsp --checkpoint "runs/tsp$n/am_tsp$n.pt" --nodes "$n" --instances 10000 \
    --save-tours "runs/tsp$n/tours_test.npz" > "runs/tsp$n/eval.log" 2>&1
  cat "runs/tsp$n/eval.log"
  tar -czf "$out/tsp$n.tar.gz" -C runs "tsp$n/am_tsp$n.pt" "tsp$n/metrics.csv" "tsp$n/eval.log" \
    "tsp$n/tours_test.npz" $(cd runs && ls tsp$n/train_*.log)
}
mkdir -p runs/tsp20 runs/tsp50
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -m pytest -q -o addopts="" -p no:cacheprovider tests/api/test_attention.py -k 65535 2>&1 | tail -n 3
if [ "$phase" = first ]; then
  train 20 "${TSP20_MIN:-8}" & p20=$!
  train 50 "${TSP50_FIRST_MIN:-8}" & p50=$!
  wait $p20; tail -n 2 runs/tsp20/train_first.log; evaluate 20
  wait $p50; tail -n 2 runs/tsp50/train_first.log; evaluate 50
else
  train 50 "${TSP50_TOTAL_MIN:-16}" --resume runs/tsp50/checkpoint_last.pt
  tail -n 2 runs/tsp50/train_second.log; evaluate 50
fi
cp runs/tsp50/checkpoint_last.pt "$out/tsp50_checkpoint_last.pt"
