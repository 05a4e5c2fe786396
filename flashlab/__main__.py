"""Command line: ``python -m flashlab <command>``.

  bench-softmax     time the fused softmax against torch.softmax and the unfused ops
  bench             time flashlab.attention, naive attention, every SDPA backend and
                    FlexAttention: forward, backward, forward+backward, TFLOP/s, extra memory
  train             train the causal transformer on associative recall (flashlab.train);
                    every TrainConfig field is an option, e.g. --precision bf16-mixed
  train-tsp         train the TSP Attention Model with REINFORCE (flashlab.tsp_train);
                    every TSPConfig field is an option; exports am_tspN.pt to --out-dir
  tune              tune the attention kernels for a list of shapes ahead of training
                    (flashlab.pretune; python -m flashlab tune --help)
  eval-tsp          evaluate a TSP Attention Model checkpoint: mean greedy tour length, gap
                    to the published optimum, heuristics; --save-tours writes instances and tours
The benchmarks print a table and, with --out, write JSON (GPU name, versions, date, every row).
Data-parallel training: torchrun --nproc_per_node 2 -m flashlab train …
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def _bench_softmax(args) -> None:
    from .benchmarks.softmax import benchmark_softmax
    from .recorded import environment

    dtype = getattr(torch, args.dtype)
    rows = benchmark_softmax(args.rows, args.cols, dtype)
    record = {"environment": environment(), "rows": rows}
    text = json.dumps(record, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    for r in rows:
        print(f"{r['cols']:>6} {r['impl']:>24} {r['ms']:9.4f} ms {r['GB/s']:8.1f} GB/s")


def _bench_attention(args) -> None:
    from . import autotune
    from .benchmarks.attention import benchmark_attention
    from .recorded import environment

    env = environment()

    def save(rows):
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"environment": env, "rows": rows,
                                                  "autotune": autotune.tuner.report()}, indent=1))

    rows = benchmark_attention(args.seq_lens, args.head_dims, tuple(c == "causal" for c in args.masks),
                               tuple(getattr(torch, d) for d in args.dtypes), tokens=args.tokens, heads=args.heads,
                               flex_seq_lens=args.flex_seq_lens, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                               on_progress=save)
    for r in rows:
        speed = f"{r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s" if "ms" in r else f"error: {r['error'][:60]}"
        if r.get("extra_bytes") is not None:
            speed += f" {r['extra_bytes'] / 2**20:9.1f} MiB extra"
        print(f"{r['impl']:>15} N={r['N']:>6} D={r['D']:>3} causal={r['causal']!s:5} {r['dtype']:>14} "
              f"{r['mode']:>7} {speed}")


def _add_train_options(parser, config_class=None) -> None:
    """One option per field of the config dataclass, typed and defaulted from it."""
    import dataclasses

    from .train import TrainConfig

    for field in dataclasses.fields(config_class or TrainConfig):
        name = "--" + field.name.replace("_", "-")
        if field.type in ("bool", bool):
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            kind = {"int": int, "float": float}.get(str(field.type), str)
            parser.add_argument(name, type=kind, default=field.default, help=f"default: {field.default}")


def _train(args) -> None:
    import dataclasses

    from .train import TrainConfig, Trainer

    config = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    trainer = Trainer(config)
    history = trainer.fit()
    if trainer.rank == 0:
        last = history[-1] if history else {}
        print(f"steps {trainer.step}, skipped {trainer.skipped_steps}, last loss {last.get('loss', float('nan')):.4f}, "
              f"recall accuracy (held-out) {trainer.evaluate():.3f}")


def _train_tsp(args) -> None:
    import dataclasses

    from .tsp_train import TSPConfig, TSPTrainer

    config = TSPConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TSPConfig)})
    trainer = TSPTrainer(config)
    trainer.fit()
    if trainer.rank == 0:
        minutes = trainer.train_seconds / 60                       # all runs of a resumed job together
        print(f"steps {trainer.step}, {minutes:.1f} min, baseline updates {trainer.baseline_updates}, "
              f"greedy tour length on the evaluation set {trainer.evaluate():.4f}")
        if config.out_dir:
            trainer.export(f"{config.out_dir}/am_tsp{config.n_nodes}.pt", train_minutes=round(minutes, 2),
                           precision=config.precision)


def _eval_tsp(args) -> None:
    import numpy as np

    from .model import ATTENTION
    from .tsp import PUBLISHED, evaluate, load_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # The same model either way; on a CPU flashlab's kernels would run in Triton's
    # interpreter (hours for 10,000 instances), so "auto" takes SDPA there.
    backend = args.attention if args.attention != "auto" else ("flashlab" if device == "cuda" else "sdpa")
    model, metadata = load_model(args.checkpoint, device, attention_fn=ATTENTION[backend])
    print(f"attention: {backend} on {device}")
    result = evaluate(model, args.nodes, args.instances, args.seed, device)
    mean = result["lengths"].mean().item()
    line = f"TSP{args.nodes}, {args.instances} instances (seed {args.seed}): greedy mean tour length {mean:.4f}"
    if args.nodes in PUBLISHED:
        optimal = PUBLISHED[args.nodes]["optimal"]
        line += f", gap to the published optimum {optimal}: {100 * (mean / optimal - 1):.2f}%"
        line += f" (Kool et al. AM greedy: {PUBLISHED[args.nodes]['am_greedy']})"
    print(line)
    for name in ("nearest_neighbour", "farthest_insertion"):
        print(f"  {name.replace('_', ' ')}: {result[name].mean().item():.4f}")
    if metadata:
        print("  checkpoint:", ", ".join(f"{k}={v}" for k, v in metadata.items()))
    if args.save_tours:
        np.savez_compressed(args.save_tours, coords=result["coords"].cpu().numpy(),
                            tours=result["tours"].cpu().numpy(), lengths=result["lengths"].cpu().numpy())
        print(f"  instances, tours and lengths written to {args.save_tours}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["tune"]:          # pre-tune the kernels for a list of shapes: its own options
        from .pretune import tune_main
        return tune_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m flashlab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    softmax = commands.add_parser("bench-softmax", help="benchmark the fused softmax")
    softmax.add_argument("--rows", type=int, default=4096)
    softmax.add_argument("--cols", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384])
    softmax.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    softmax.add_argument("--out", help="write the results as JSON to this file")
    attn = commands.add_parser("bench", aliases=["bench-attention"],
                               help="benchmark attention: flashlab, naive, every SDPA backend, FlexAttention")
    attn.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    attn.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    attn.add_argument("--masks", nargs="+", choices=["full", "causal"], default=["full", "causal"])
    attn.add_argument("--dtypes", nargs="+", choices=["float16", "bfloat16"], default=["bfloat16", "float16"])
    attn.add_argument("--tokens", type=int, default=16384, help="B·N, kept constant across N")
    attn.add_argument("--heads", type=int, default=16)
    attn.add_argument("--flex-seq-lens", type=int, nargs="*", default=None,
                      help="run FlexAttention (compiled per shape) only at these N (default: all)")
    attn.add_argument("--warmup-ms", type=int, default=25)
    attn.add_argument("--rep-ms", type=int, default=100)
    attn.add_argument("--out", help="write the results as JSON to this file")
    _add_train_options(commands.add_parser("train", help="train the causal transformer (flashlab.train)"))
    from .tsp_train import TSPConfig
    _add_train_options(commands.add_parser("train-tsp", help="train the TSP Attention Model (REINFORCE)"), TSPConfig)
    tsp = commands.add_parser("eval-tsp", help="evaluate a TSP Attention Model checkpoint")
    tsp.add_argument("--checkpoint", required=True)
    tsp.add_argument("--nodes", type=int, default=20)
    tsp.add_argument("--instances", type=int, default=10000)
    # Training draws step s's instances from seed·1,000,003 + s: this default is far from those.
    tsp.add_argument("--seed", type=int, default=1_234_567_891, help="test-set seed (default 1234567891)")
    tsp.add_argument("--save-tours", help="write coords, tours and lengths to this .npz file")
    tsp.add_argument("--attention", choices=["auto", "flashlab", "sdpa", "naive"], default="auto",
                     help="auto: flashlab on a GPU, SDPA on a CPU")
    args = parser.parse_args(argv)
    {"bench-softmax": _bench_softmax, "bench": _bench_attention, "bench-attention": _bench_attention,
     "train": _train, "train-tsp": _train_tsp, "eval-tsp": _eval_tsp}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
