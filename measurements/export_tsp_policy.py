"""Export the policy of a TSP training-state checkpoint in the format `eval-tsp` loads.

`train-tsp` exports `am_tspN.pt` only when a run ends; a run stopped from outside (the GPU
machine's 10-minute limit per command, 2026-12-03) leaves only its checkpoints. This writes
the policy of one of them, with the metadata train-tsp would have written:

    python -m measurements.export_tsp_policy runs/tsp50/checkpoint_last.pt runs/tsp50/am_tsp50.pt
"""

import argparse

from flashlab import checkpoint
from flashlab.tsp import AttentionModel, save_model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state", help="a tsp-training-state checkpoint (checkpoint_last.pt)")
    parser.add_argument("out", help="where to write the tsp-model checkpoint (am_tspN.pt)")
    args = parser.parse_args(argv)
    saved = checkpoint.load(args.state, kind="tsp-training-state", map_location="cpu")
    task, run = saved.config["task"], saved.config["run"]
    model = AttentionModel(task["d_model"], task["n_heads"], task["n_layers"], task["ff_dim"], task["tanh_clip"])
    model.load_state_dict(saved.state["model"])
    minutes = saved.state["train_seconds"] / 60
    save_model(model, args.out, n_nodes=task["n_nodes"], steps=saved.state["step"], train_minutes=round(minutes, 2),
               precision=run["precision"], compile=run["compile"])
    print(f"{args.out}: TSP{task['n_nodes']} policy at step {saved.state['step']}, {minutes:.2f} min of training")


if __name__ == "__main__":
    main()
