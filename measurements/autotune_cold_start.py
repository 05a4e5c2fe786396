"""GPU script (issue 17, items 5-6): fp32 at large head dims, the course's shapes pre-tuned into
the decisions the package ships, and the first call's cost before → after. Run from the
repository root; every phase writes JSON under OUT and stops starting new work after
--budget-s seconds (so one call fits the device's 10-minute limit):

  python -m measurements.autotune_cold_start fp32 OUT             # D = 96/128/256, tuning off and on
  python -m measurements.autotune_cold_start pretune OUT --set bench            # bf16+fp16 benchmark shapes
  python -m measurements.autotune_cold_start pretune OUT --set sweep --dtype fp32   # D 16-256, trainer, TSP
  python -m measurements.autotune_cold_start ship OUT1 [OUT2 …]   # (no GPU) → flashlab/tuned/nvidia-h200.json
  python -m measurements.autotune_cold_start coldstart OUT        # first fwd+bwd: off / tuning / shipped

`coldstart` runs each case in a fresh process with an empty autotune cache and an empty Triton
cache (so compilation is counted every time); "shipped" uses flashlab/tuned/ as it is in the
working tree, so run `ship` (and copy the file into the tree) before it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The course's shapes: (B, H, N, D) or (B, H, N, D, H_kv).
BENCH = [(16384 // n, 16, n, d) for d in (64, 128) for n in (512, 1024, 2048, 4096, 8192, 16384)]
SWEEP = ([(4, 8, 1024, d) for d in (16, 32, 64, 96, 128, 256)]
         + [(32, 4, 64, 16), (8, 8, 4096, 64), (8, 8, 4096, 64, 2)]       # trainer: CPU default, MQAR sizes, GQA
         + [(512, 8, n, 16) for n in (20, 50, 100)])                      # TSP encoder (embed 128, 8 heads)
SETS = {"bench": (BENCH, ("bf16", "fp16"), (False, True)), "sweep": (SWEEP, ("bf16", "fp16", "fp32"), (False, True))}


def environment() -> dict:
    import torch
    import triton
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d")}


def capture_shared_memory(log: list):
    """Record every compiled kernel's shared memory (Triton's metadata.shared) beside the
    configuration it was compiled for, and the estimate `flashlab.launch.autotune` makes for it."""
    from triton.runtime.jit import JITFunction

    from flashlab.launch import autotune
    names = {"flash_forward_kernel": "forward", "flash_backward_dkdv_kernel": "dkdv", "flash_backward_dq_kernel": "dq"}
    original = JITFunction.run

    def run(self, *args, **kwargs):
        compiled = original(self, *args, **kwargs)
        kernel = names.get(getattr(getattr(self, "fn", None), "__name__", ""))
        if kernel and "BLOCK_M" in kwargs:
            config = autotune.Config(kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs.get("num_warps", 4),
                                     kwargs.get("num_stages", 1))
            row = {"kernel": kernel, "config": str(config), "BLOCK_D": kwargs.get("BLOCK_D"),
                   "shared_bytes": getattr(getattr(compiled, "metadata", None), "shared", None)}
            if row not in log:
                log.append(row)
        return compiled
    JITFunction.run = run


def phase_fp32(out: Path, budget_s: float) -> None:
    os.environ["FLASHLAB_AUTOTUNE_SHIPPED"] = "0"
    import torch

    from flashlab import attention
    from flashlab.launch import autotune
    compiled: list = []
    capture_shared_memory(compiled)
    autotune.tuner.cache_path = ""
    rows, start = [], time.perf_counter()
    for tune in ("0", "1"):              # tuning off first: the default configurations must fit
        os.environ["FLASHLAB_AUTOTUNE"] = tune
        for d in (96, 128, 256):
            for causal in (False, True):
                if time.perf_counter() - start > budget_s:
                    break
                torch.manual_seed(0)
                q, k, v = (torch.randn(2, 4, 1000, d, device="cuda", requires_grad=True) for _ in range(3))
                row = {"D": d, "causal": causal, "autotune": tune == "1"}
                began = time.perf_counter()
                try:
                    o = attention(q, k, v, is_causal=causal)
                    grads = torch.autograd.grad(o.square().sum(), (q, k, v))
                    torch.cuda.synchronize()
                    row["first_call_s"] = time.perf_counter() - began
                    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
                    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
                    ref_grads = torch.autograd.grad(ref.square().sum(), (q64, k64, v64))
                    for name, got, want in zip(("out", "dq", "dk", "dv"), (o, *grads), (ref, *ref_grads)):
                        row[f"err_{name}"] = float((got.double() - want).norm() / want.norm())
                except Exception as exc:                  # the finding to record, not a crash of the script
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(row, flush=True)
                rows.append(row)
    for row in compiled:
        m, n = (int(x) for x in row["config"].split()[0].split("x"))
        w, s = int(row["config"].split()[1][1:]), int(row["config"].split()[2][1:])
        row["estimate"] = autotune.shared_memory_bytes(row["kernel"], autotune.Config(m, n, w, s), row["BLOCK_D"], 4)
    limit = autotune.shared_memory_limit(torch.device("cuda"))
    json.dump({"environment": environment(), "shared_memory_limit": limit, "rows": rows,
               "compiled": compiled, "autotune": autotune.tuner.report()}, open(out / "fp32.json", "w"), indent=1)
    print(f"{sum('error' not in r for r in rows)}/{len(rows)} fp32 calls ran; estimate == compiled for "
          f"{sum(r['estimate'] == r['shared_bytes'] for r in compiled)}/{len(compiled)} kernels")


def phase_pretune(out: Path, budget_s: float, which: str, dtypes: list[str] | None) -> None:
    os.environ["FLASHLAB_AUTOTUNE_SHIPPED"] = "0"                    # measure, do not reuse
    os.environ["FLASHLAB_AUTOTUNE_CACHE"] = str(out / f"cache_{which}.json")
    from flashlab.api.pretune import DTYPES, pretune
    shapes, default_dtypes, causal = SETS[which]
    timings = []

    def say(shape, dtype, is_causal, seconds):
        timings.append({"shape": shape, "dtype": str(dtype), "causal": is_causal, "s": seconds})
        print(timings[-1], flush=True)

    entries = pretune(shapes, [DTYPES[d] for d in (dtypes or default_dtypes)], causal, deadline_s=budget_s,
                      on_shape=say)
    env = environment()
    json.dump({"environment": env, "set": which, "timings": timings, "autotune": entries},
              open(out / f"decisions_{which}.json", "w"), indent=1)
    print(f"{len(entries)} decisions; {len(timings)} shape×dtype×causal done")


def phase_ship(outs: list[Path]) -> None:
    from flashlab.api.pretune import ship
    from flashlab.launch import autotune_cache
    entries, env, gpu = [], {}, None
    for out in outs:
        for path in sorted(out.glob("decisions_*.json")):
            record = json.loads(path.read_text())
            entries += record["autotune"]
            env, gpu = record["environment"], record["environment"]["gpu"]
    if gpu is None:
        raise SystemExit("ship: no decisions_*.json in the folders given")
    target = autotune_cache.shipped_path(gpu)
    old = json.loads(target.read_text())["decisions"] if target.exists() else {}
    new = ship(entries, gpu, env, source="measurements/autotune_cold_start.py pretune (bench and sweep sets)")
    new["decisions"] = dict(sorted({**old, **new["decisions"]}.items()))
    target.write_text(json.dumps(new, indent=1) + "\n")
    print(f"{target}: {len(new['decisions'])} decisions ({len(new['decisions']) - len(old)} new)")


FIRST_CALL = """
import json, sys, time, torch
from flashlab import attention
B, H, N, D, dtype = {shape!r} + (getattr(torch, {dtype!r}),)
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
torch.cuda.synchronize()
began = time.perf_counter()
attention(q, k, v, is_causal=True).sum().backward()
torch.cuda.synchronize()
print(json.dumps({{"first_call_s": time.perf_counter() - began}}))
"""


def phase_coldstart(out: Path, budget_s: float) -> None:
    cases = [((4, 16, 4096, 64), "bfloat16"), ((4, 16, 4096, 128), "bfloat16"), ((4, 8, 1024, 128), "float32")]
    rows, start = [], time.perf_counter()
    for shape, dtype in cases:
        for mode, env in (("tuning off", {"FLASHLAB_AUTOTUNE": "0"}),
                          ("tuning, empty cache (before)", {"FLASHLAB_AUTOTUNE_SHIPPED": "0"}),
                          ("shipped decisions, empty cache (after)", {})):
            if time.perf_counter() - start > budget_s:
                break
            with tempfile.TemporaryDirectory() as tmp:
                full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_CACHE_DIR": f"{tmp}/triton",
                            "FLASHLAB_AUTOTUNE_CACHE": f"{tmp}/autotune.json", **env}
                began = time.perf_counter()
                done = subprocess.run([sys.executable, "-c", FIRST_CALL.format(shape=shape, dtype=dtype)],
                                      env=full_env, capture_output=True, text=True, cwd=ROOT)
                row = {"shape": shape, "dtype": dtype, "mode": mode, "process_s": time.perf_counter() - began}
                if done.returncode == 0:
                    row.update(json.loads(done.stdout.strip().splitlines()[-1]))
                else:
                    row["error"] = done.stderr[-500:]
                row["warned_tuning"] = "tuning the attention kernels" in done.stderr
            print(row, flush=True)
            rows.append(row)
    json.dump({"environment": environment(), "rows": rows}, open(out / "coldstart.json", "w"), indent=1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["fp32", "pretune", "ship", "coldstart"])
    parser.add_argument("out", nargs="+", type=Path, help="output folder (ship: the folders pretune wrote)")
    parser.add_argument("--set", choices=sorted(SETS), default="bench")
    parser.add_argument("--dtype", action="append", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--budget-s", type=float, default=480, help="start no new work after this many seconds")
    args = parser.parse_args(argv)
    if args.phase == "ship":
        return phase_ship(args.out)
    out = args.out[0]
    out.mkdir(parents=True, exist_ok=True)
    if args.phase == "fp32":
        phase_fp32(out, args.budget_s)
    elif args.phase == "pretune":
        phase_pretune(out, args.budget_s, args.set, args.dtype)
    else:
        phase_coldstart(out, args.budget_s)


if __name__ == "__main__":
    main()
