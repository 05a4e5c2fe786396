"""Export the policy of a TSP training-state checkpoint in the format `eval-tsp` loads.

`train-tsp` exports `am_tspN.pt` only when a run ends; a run stopped from outside (the GPU
machine's 10-minute limit per command, 2026-12-03) leaves only its checkpoints. This writes
the policy of one of them, with the metadata train-tsp would have written:

    python -m measurements.export_tsp_policy runs/tsp50/checkpoint_last.pt runs/tsp50/am_tsp50.pt

(`python -m flashlab export-tsp` does the same: `flashlab.train.tsp_train.export_policy`.)
"""

import argparse

from flashlab.train.tsp_train import export_policy


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state", help="a tsp-training-state checkpoint (checkpoint_last.pt)")
    parser.add_argument("out", help="where to write the tsp-model checkpoint (am_tspN.pt)")
    args = parser.parse_args(argv)
    trainer = export_policy(args.state, args.out)
    print(f"{args.out}: TSP{trainer.task_config.n_nodes} policy at step {trainer.step}, "
          f"{trainer.train_seconds / 60:.2f} min of training")


if __name__ == "__main__":
    main()
