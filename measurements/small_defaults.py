"""The small path's measured launches (flashlab/tuned/small_path/<gpu>.json) from recorded runs of
``measurements/small_graphs.py --sections choices``: for each kernel, padded head dimension and
padded key count and element size, the launch with the shortest CUDA-graph replay time.

    python -m measurements.small_defaults results/h200/small_graphs_choices.json [MORE.json ...]
    python -m measurements.small_defaults ... --check      # exit 1 if the shipped table differs
    (--out: another file than the GPU model's own)

A later record overrides an earlier one where both timed the same (kernel, D, keys); within one
record, of two sequence lengths that pad to the same tile the longer one decides (it fills more
of the tile). Every record must come from the same GPU model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from flashlab.launch import small as flash_small

ROOT = Path(__file__).resolve().parents[1]


def fastest(record: dict) -> dict[str, dict]:
    """{decision key: {"config", "ms", "N"}} for one small_graphs record's choices section."""
    rows = record["sections"]["choices"]["rows"]
    best: dict[str, dict] = {}
    for row in rows:
        if not isinstance(row["ms"], float):
            continue                                   # a launch the compiler refused
        # choices timed bf16 on a GPU; rows say their dtype since 2026-12-05
        element_size = getattr(torch, row.get("dtype", "torch.bfloat16").removeprefix("torch.")).itemsize
        key = flash_small.decision_key(row["kernel"], row["D"], row["N"], element_size)
        mine = best.get(key)
        if mine is None or row["N"] > mine["N"] or (row["N"] == mine["N"] and row["ms"] < mine["ms"]):
            best[key] = {"config": row["config"], "ms": row["ms"], "N": row["N"]}
    return best


def table(paths: list[Path]) -> dict:
    decisions, sources, gpu = {}, [], None
    for path in paths:
        record = json.loads(path.read_text())
        name = record["environment"].get("gpu")
        if gpu is not None and name != gpu:
            raise SystemExit(f"small_defaults: {path} was measured on {name}, the others on {gpu}; "
                             f"give records of one GPU model")
        gpu = name
        for key, best in fastest(record).items():
            decisions[key] = best
        shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        sources.append(f"{shown} ({record['environment'].get('date', 'undated')})")
    return {"format": 1, "gpu": gpu, "source": sources,
            "how": "each (kernel | padded D | padded keys | bytes per element): the fastest launch of "
                   "measurements/small_graphs.py --sections choices, CUDA-graph replay, B·H = 4096",
            "decisions": {key: best["config"] for key, best in sorted(decisions.items())},
            "replay_ms": {key: round(best["ms"], 5) for key, best in sorted(decisions.items())}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path, help="small_graphs.json files with a choices section")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the table (default: flashlab/tuned/small_path/<gpu>.json)")
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)
    for path in args.records:
        if not path.exists():
            parser.error(f"{path}: no such file")
    built = table(args.records)
    args.out = args.out or flash_small.measured_path(built["gpu"])
    text = json.dumps(built, indent=1) + "\n"
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'as the records give' if same else 'DIFFERS from the records'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}: {len(built['decisions'])} launches measured on {built['gpu']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
