"""GPU A/B of two versions of flashlab's kernels in one run (issue 15: "no speed or register
cost"): the same shapes, timed alternately on the two source trees (A B A B …, so clock and
thermal drift fall on both), with the compiled kernels' registers and spills and each tree's
error against SDPA's math in float64.

    python -m measurements.kernel_ab OUT_DIR OLD_TREE [NEW_TREE] [--rounds 3]

OLD_TREE and NEW_TREE are checkouts of the repository (NEW_TREE defaults to this one), e.g.
``git worktree add /tmp/old 17d7e78``. Each measurement runs in a fresh process that imports
that tree's flashlab; autotuning is off (FLASHLAB_AUTOTUNE=0), so both trees run each kernel's
default configuration and only the kernels differ. Writes OUT_DIR/kernel_ab.json and prints
the new/old time ratio per shape (< 1: the new tree is faster). Without a GPU it runs one tiny
shape in Triton's interpreter: a check of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

GPU_SHAPES = [(n, d, causal) for n in (1024, 4096, 16384) for d in (64, 128) for causal in (False, True)]
GPU_TOKENS, HEADS = 16384, 16
MODES = ("fwd", "bwd", "fwd+bwd")


def worker(tree: str, out_path: str) -> None:
    """Times flashlab from ``tree`` (already first on sys.path) and writes its rows to ``out_path``."""
    # flashlab first: without a GPU it turns on Triton's interpreter before triton is imported
    import flashlab  # noqa: I001
    import flashlab.kernels.dense as kernels
    import time
    import torch
    import triton.testing

    assert Path(flashlab.__file__).resolve().is_relative_to(Path(tree).resolve()), flashlab.__file__
    compiled = {}
    for name in ("flash_forward_kernel", "flash_backward_dkdv_kernel", "flash_backward_dq_kernel"):
        jit = getattr(kernels, name)

        def run(*args, _launch=jit.run, _name=name, **kwargs):
            kernel = _launch(*args, **kwargs)
            compiled[_name] = {"registers": getattr(kernel, "n_regs", None),
                               "spills": getattr(kernel, "n_spills", None),
                               "config": {k: kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages",
                                                                 "FAST_PATH") if k in kwargs}}
            return kernel
        jit.run = run

    device = "cuda" if torch.cuda.is_available() else "cpu"
    seq_lens = [int(n) for n in os.environ.get("KERNEL_AB_SEQ_LENS", "").split(",") if n]   # --seq-lens
    gpu_shapes = [shape for shape in GPU_SHAPES if not seq_lens or shape[0] in seq_lens]
    shapes, tokens, dtype = ((gpu_shapes, GPU_TOKENS, torch.bfloat16) if device == "cuda"
                             else ([(40, 16, True)], 40, torch.float32))

    def median_ms(fn):
        if device == "cuda":
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    rows = []
    for n, d, causal in shapes:
        torch.manual_seed(0)
        q, k, v = (torch.randn(tokens // n, HEADS, n, d, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        grad_out = torch.randn_like(q)
        compiled.clear()
        out = flashlab.attention(q, k, v, is_causal=causal)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        # error against float64 on the first instance's first head (the rest run the same code)
        q64, k64, v64 = (t[:1, :1].detach().double().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
        ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out[:1, :1].double())
        errors = {name: float((a[:1, :1].detach().double() - b.detach()).norm() / b.detach().norm())
                  for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads))}

        def forward(q=q, k=k, v=v, causal=causal):
            with torch.no_grad():
                flashlab.attention(q, k, v, is_causal=causal)

        def forward_backward(q=q, k=k, v=v, causal=causal, grad_out=grad_out):
            torch.autograd.grad(flashlab.attention(q, k, v, is_causal=causal), (q, k, v), grad_out)

        graph = flashlab.attention(q, k, v, is_causal=causal)      # the forward that "bwd" differentiates

        def backward(graph=graph, q=q, k=k, v=v, grad_out=grad_out):
            torch.autograd.grad(graph, (q, k, v), grad_out, retain_graph=True)

        for mode, fn in zip(MODES, (forward, backward, forward_backward)):
            ms = median_ms(fn)
            rows.append({"N": n, "D": d, "causal": causal, "mode": mode, "ms": ms, "errors": errors,
                         "kernels": dict(compiled)})
        del out, graph, q, k, v, grads
        if device == "cuda":
            torch.cuda.empty_cache()
    Path(out_path).write_text(json.dumps({"flashlab": flashlab.__file__, "rows": rows}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("old_tree")
    parser.add_argument("new_tree", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-lens", type=int, nargs="+", help="only these N (default 1024 4096 16384)")
    parser.add_argument("--worker", nargs=2, metavar=("TREE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {"old": [], "new": []}
    for r in range(args.rounds):
        for label, tree in (("old", args.old_tree), ("new", args.new_tree)):
            part = out_dir / f"{label}_{r}.json"
            env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), FLASHLAB_AUTOTUNE="0",
                       FLASHLAB_AUTOTUNE_CACHE="", KERNEL_AB_SEQ_LENS=",".join(map(str, args.seq_lens or [])))
            subprocess.run([sys.executable, __file__, str(out_dir), args.old_tree, "--worker",
                            str(Path(tree).resolve()), str(part)], env=env, check=True, cwd=str(out_dir))
            runs[label].append(json.loads(part.read_text()))
            print(f"round {r}: {label} done", flush=True)

    def median_ms(label, i):
        return statistics.median(run["rows"][i]["ms"] for run in runs[label])

    table = []
    for i, row in enumerate(runs["new"][0]["rows"]):
        old_row = runs["old"][0]["rows"][i]
        table.append({key: row[key] for key in ("N", "D", "causal", "mode")} |
                     {"old_ms": median_ms("old", i), "new_ms": median_ms("new", i),
                      "new/old": median_ms("new", i) / median_ms("old", i),
                      "old_errors": old_row["errors"], "new_errors": row["errors"],
                      "old_kernels": old_row["kernels"], "new_kernels": row["kernels"]})
        t = table[-1]
        print(f"N={t['N']:>5} D={t['D']:>3} {'causal' if t['causal'] else 'full  '} {t['mode']:7} "
              f"old {t['old_ms']:8.3f} ms  new {t['new_ms']:8.3f} ms  new/old {t['new/old']:.3f}  "
              f"max err old {max(t['old_errors'].values()):.1e} new {max(t['new_errors'].values()):.1e}")
    for name in table[-1]["new_kernels"]:
        for t in table:
            if t["mode"] == "fwd+bwd":
                o, n = t["old_kernels"].get(name, {}), t["new_kernels"].get(name, {})
                print(f"{name:28} D={t['D']:>3} {'causal' if t['causal'] else 'full  '} N={t['N']:>5} "
                      f"registers {o.get('registers')} -> {n.get('registers')}, "
                      f"spills {o.get('spills')} -> {n.get('spills')}")
    ratios = [t["new/old"] for t in table]
    summary = {"geomean new/old": statistics.geometric_mean(ratios), "worst new/old": max(ratios)}
    print(summary)
    (out_dir / "kernel_ab.json").write_text(json.dumps({"summary": summary, "rows": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
