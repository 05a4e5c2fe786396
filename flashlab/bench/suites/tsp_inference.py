"""tsp-inference: the capstone's checkpoints under each inference mode of `flashlab.train.tsp`:
greedy, ×8 augmentation, multi-start greedy and both combined (and the best of K sampled tours), on
the test instances of eval-tsp's seed. One row per checkpoint and mode: mean tour length, gap to the
published optimum, wall-clock time per instance, and the paired gain over greedy on the same
instances (a subset's own mean moves by chance; the paired gain much less). The record is saved
after every row."""

from __future__ import annotations

from pathlib import Path

import torch

from flashlab.bench.suite import Context, Suite
from flashlab.train.model import ATTENTION
from flashlab.train.trainer import default_attention
from flashlab.train.tsp import (
    EVAL_MAX_ROLLOUTS,
    describe_inference,
    gap_percent,
    load_model,
    random_instances,
    timed_best_tours,
)

TEST_SEED = 1_234_567_891            # eval-tsp's default --seed
CHECKPOINTS = Path(__file__).resolve().parents[3] / "checkpoints"
MODES = {"greedy": {}, "augment x8": {"augment": 8}, "multi-start": {"starts": "n"},
         "multi-start + augment x8": {"starts": "n", "augment": 8}, "128 samples": {"samples": 128}}
INSTANCES = {20: 10_000, 50: 10_000, 100: 10_000}        # the published test sets' size
QUICK = {20: 16}


def run(ctx: Context) -> None:
    device = ctx.device
    backend = default_attention(device)
    max_rollouts = EVAL_MAX_ROLLOUTS[device]
    ctx.record.update({"attention": backend, "device": device, "test_seed": TEST_SEED, "max_rollouts": max_rollouts,
                       "rows": []})
    for n, instances in (QUICK if ctx.quick else INSTANCES).items():
        path = CHECKPOINTS / f"am_tsp{n}.pt"
        model, metadata = load_model(path, device, attention_fn=ATTENTION[backend])
        coords = random_instances(instances, n, TEST_SEED, device)
        greedy = None
        for mode, options in MODES.items():
            if ctx.over():
                ctx.record.setdefault("skipped", []).append(f"TSP{n} {mode}: {ctx.skipped()}")
                continue
            options = {k: n if v == "n" else v for k, v in options.items()}
            _, lengths, seconds = timed_best_tours(model, coords, max_rollouts=max_rollouts, **options)
            greedy = lengths if greedy is None else greedy
            mean = lengths.mean().item()
            row = {"checkpoint": path.name, "checkpoint_metadata": metadata, "n_nodes": n, "instances": instances,
                   "mode": mode, "inference": describe_inference(**options), "mean_length": round(mean, 5),
                   "length_std": round(lengths.std().item(), 5), "gap_percent": round(gap_percent(mean, n), 3),
                   "gain_over_greedy_percent": round(100 * (1 - mean / greedy.mean().item()), 3),
                   "instances_better_than_greedy": int((lengths < greedy - 1e-6).sum()),
                   "ms_per_instance": round(1e3 * seconds / instances, 3)}
            ctx.record["rows"].append(row)
            ctx.log(f"TSP{n} {mode:>26}: {mean:.4f}, gap {row['gap_percent']:.2f}%, "
                    f"{row['ms_per_instance']:.2f} ms per instance")
            ctx.save()
    ctx.record["threads"] = torch.get_num_threads()


SUITE = Suite(
    name="tsp-inference",
    summary="the capstone's checkpoints: greedy, x8 augmentation, multi-start, sampling",
    measures="mean tour length, gap to the published optimum and time per instance of each inference mode, and "
             "its paired gain over greedy on the same instances",
    shapes="checkpoints/am_tsp{20,50,100}.pt on 10,000 test instances each (eval-tsp's seed); --quick: TSP20, "
           "16 instances",
    budget_s=420, min_s=60, run=run, needs="gpu, or quick")
