"""The capstone's checkpoints under each inference mode: greedy, ×8 augmentation, multi-start
greedy and both combined (and, with --samples K, the best of K sampled tours), on the test
instances of eval-tsp's seed. One row per checkpoint and mode: mean tour length, gap to the
published optimum, wall-clock time per instance, and the paired gain over greedy on the same
instances (the subset's own mean moves by chance; the gain much less):

    python -m measurements.tsp_inference results/cpu/tsp_inference.json --instances 20=1000 50=1000 100=100
    python -m measurements.tsp_inference results/h100/tsp_inference.json --instances 20=10000 50=10000 100=10000

The record carries `flashlab.bench.records.environment()` and is rewritten after every row.
"""

import argparse
import json
from pathlib import Path

import torch

from flashlab.bench.records import environment
from flashlab.cli import EVAL_MAX_ROLLOUTS
from flashlab.train.model import ATTENTION
from flashlab.train.trainer import default_attention
from flashlab.train.tsp import describe_inference, gap_percent, load_model, random_instances, timed_best_tours

TEST_SEED = 1_234_567_891            # eval-tsp's default --seed
MODES = {"greedy": {}, "augment x8": {"augment": 8}, "multi-start": {"starts": "n"},
         "multi-start + augment x8": {"starts": "n", "augment": 8}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the JSON record to write")
    parser.add_argument("--instances", nargs="+", default=["20=1000", "50=1000", "100=100"],
                        help="N=instances for each checkpoints/am_tspN.pt to evaluate")
    parser.add_argument("--samples", type=int, default=0, help="also the best of this many sampled tours")
    parser.add_argument("--max-rollouts", type=int, default=None, help="tours decoded at once (default: eval-tsp's)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    max_rollouts = args.max_rollouts or EVAL_MAX_ROLLOUTS[device]
    backend = default_attention(device)
    modes = dict(MODES, **({f"{args.samples} samples": {"samples": args.samples}} if args.samples else {}))
    record = {"environment": {**environment(), "threads": torch.get_num_threads()}, "attention": backend,
              "device": device, "test_seed": TEST_SEED, "max_rollouts": max_rollouts, "rows": []}
    for item in args.instances:
        n, instances = map(int, item.split("="))
        path = Path("checkpoints") / f"am_tsp{n}.pt"
        model, metadata = load_model(path, device, attention_fn=ATTENTION[backend])
        coords = random_instances(instances, n, TEST_SEED, device)
        greedy = None
        for mode, options in modes.items():
            options = {k: n if v == "n" else v for k, v in options.items()}
            tours, lengths, seconds = timed_best_tours(model, coords, max_rollouts=max_rollouts, **options)
            greedy = lengths if greedy is None else greedy
            mean = lengths.mean().item()
            row = {"checkpoint": str(path), "checkpoint_metadata": metadata, "n_nodes": n, "instances": instances,
                   "mode": mode, "inference": describe_inference(**options), "mean_length": round(mean, 5),
                   "length_std": round(lengths.std().item(), 5),
                   "gap_percent": round(gap_percent(mean, n), 3),
                   "gain_over_greedy_percent": round(100 * (1 - mean / greedy.mean().item()), 3),
                   "instances_better_than_greedy": int((lengths < greedy - 1e-6).sum()),
                   "ms_per_instance": round(1e3 * seconds / instances, 3)}
            record["rows"].append(row)
            print(f"TSP{n} {mode:>26}: {mean:.4f}, gap {row['gap_percent']:.2f}%, "
                  f"{row['ms_per_instance']:.2f} ms per instance", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
