"""Command line: ``python -m flashlab <command>``.

  bench-softmax   time the fused softmax against torch.softmax and the unfused ops,
                  write JSON (GPU name, versions, date, every row)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def _bench_softmax(args) -> None:
    from .bench import benchmark_softmax
    from .results import environment

    dtype = getattr(torch, args.dtype)
    rows = benchmark_softmax(args.rows, args.cols, dtype)
    record = {"environment": environment(), "rows": rows}
    text = json.dumps(record, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    for r in rows:
        print(f"{r['cols']:>6} {r['impl']:>24} {r['ms']:9.4f} ms {r['GB/s']:8.1f} GB/s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashlab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    softmax = commands.add_parser("bench-softmax", help="benchmark the fused softmax")
    softmax.add_argument("--rows", type=int, default=4096)
    softmax.add_argument("--cols", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384])
    softmax.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    softmax.add_argument("--out", help="write the results as JSON to this file")
    args = parser.parse_args(argv)
    {"bench-softmax": _bench_softmax}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
