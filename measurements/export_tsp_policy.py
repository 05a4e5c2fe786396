"""Export the policy of a TSP training-state checkpoint in the format `eval-tsp` loads.

`train-tsp` exports `am_tspN.pt` only when a run ends; a run stopped from outside (the GPU
machine's 10-minute limit per command, 2026-12-03) leaves only its checkpoints. This writes
the policy of one of them, with the metadata train-tsp would have written:

    python -m measurements.export_tsp_policy runs/tsp50/checkpoint_last.pt runs/tsp50/am_tsp50.pt
"""

import argparse

from flashlab import checkpoint
from flashlab.train import RunConfig
from flashlab.tsp_train import TSPConfig, TSPTrainer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state", help="a tsp-training-state checkpoint (checkpoint_last.pt)")
    parser.add_argument("out", help="where to write the tsp-model checkpoint (am_tspN.pt)")
    args = parser.parse_args(argv)
    saved = checkpoint.load(args.state, kind="tsp-training-state", map_location="cpu")
    # the trainer resumed on the CPU (attention through SDPA: nothing runs), then its own export
    task = TSPConfig(**{**saved.config["task"], "attention": "sdpa"})
    trainer = TSPTrainer(task, RunConfig(**{**saved.config["run"], "device": "cpu", "resume": args.state,
                                            "out_dir": None, "progress": False}))
    minutes = trainer.train_seconds / 60
    trainer.export(args.out, train_minutes=round(minutes, 2), precision=trainer.run.precision,
                   compile=trainer.run.compile)
    print(f"{args.out}: TSP{task.n_nodes} policy at step {trainer.step}, {minutes:.2f} min of training")


if __name__ == "__main__":
    main()
