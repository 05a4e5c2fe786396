"""hopper-ladder: the Hopper kernels' ladder (notebooks 07b and 11), measured in one run. Each step of
`flashlab.launch.hopper.LADDER` adds one change to the previous one (step 0 is the course kernel,
`flashlab.kernels.dense`); for each step the record holds correctness against float64, TFLOP/s
forward and backward beside SDPA's FlashAttention-2 and cuDNN backends measured in the same run, the
compiled kernels' registers and spills, and which targets the final step meets. Sections run most
important first; one the budget leaves out is recorded as skipped. FLOPs as FlashAttention's papers
count them (`flashlab.launch.timing.attention_flops`).

--quick on a CPU proves the suite runs: float32 inputs (the interpreter's bf16 arithmetic is not the
GPU's), N = 40 and 64, every step with small tiles, SDPA where the CPU has the backend; its timings
mean nothing."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager

import torch

from flashlab.api.attention import attention
from flashlab.bench.suite import Context, Suite
from flashlab.kernels import dense as flash_triton
from flashlab.kernels import hopper as kernels
from flashlab.launch import gluon
from flashlab.launch.hopper import LADDER, Tiles
from flashlab.launch.hopper import backward as hopper_backward_spec
from flashlab.launch.hopper import forward as hopper_forward_spec
from flashlab.launch.spec import AttentionSpec
from flashlab.launch.timing import Stopwatch, attention_flops, time_ms
from flashlab.reference.float64 import TOLERANCE, reference_attention, reference_gradients, rel_error

TARGETS = {"forward_vs_cudnn": 0.90, "forward_vs_flash": 1.4, "fwd_bwd_vs_cudnn": 0.80}
SMOKE_TILES = {"forward": Tiles(32, 16, 4, 1), "dkdv": Tiles(16, 32, 4, 1), "dq": Tiles(32, 16, 4, 1)}
FINAL = LADDER[-1]
RUN = None     # the run in progress (forward_backward tags the kernels it compiles with its step)
# The Gluon steps (flashlab.kernels.gluon_hopper): the forward each, the final step's backward after it
GLUON_STEPS = (("5 gluon: warp-specialised", dict(overlap=False, pingpong=False)),
               ("6 gluon: + intra-warpgroup overlap", dict(overlap=True, pingpong=False)),
               ("7 gluon: + ping-pong", dict(overlap=True, pingpong=True)))


def hopper_forward(q, k, v, causal, scale, step, tiles=None):
    return hopper_forward_spec(q, k, v, AttentionSpec(scale, causal), step, tiles=tiles)


def hopper_backward(q, k, v, out, lse, grad_out, causal, scale, step, dkdv_tiles=None, dq_tiles=None):
    return hopper_backward_spec(q, k, v, out, lse, grad_out, AttentionSpec(scale, causal), step,
                                dkdv_tiles=dkdv_tiles, dq_tiles=dq_tiles)


@contextmanager
def course_kernels_only():
    """Step 0: FLASHLAB_HOPPER=0 sends flashlab.attention to the course kernels, and
    FLASHLAB_AUTOTUNE=0 runs their default tiles (tuning nine dK/dV candidates per new shape
    would take minutes of the budget; the defaults are the tiles steps 1-3 use)."""
    saved = {name: os.environ.get(name) for name in ("FLASHLAB_HOPPER", "FLASHLAB_AUTOTUNE")}
    os.environ.update(FLASHLAB_HOPPER="0", FLASHLAB_AUTOTUNE="0")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Run:
    """The record being built (the suite's), its time budget, and which step's kernels are launching."""

    def __init__(self, ctx: Context):
        self.ctx, self.smoke = ctx, ctx.device != "cuda"
        self.device = ctx.device
        self.current_step = None        # which step's kernels are launching (for the resources)
        self.record = ctx.record
        self.record.update({"mode": "smoke (CPU interpreter)" if self.smoke else "gpu",
                            "budget_s": round(ctx.budget_s, 1), "targets": TARGETS,
                            "ladder": [{"step": "0 today", "change": "the course kernel (flashlab.kernels.dense) "
                                        "at its default tiles (autotuning off)"}]
                            + [{"step": s.name, "change": s.change, "flags": s.flags()} for s in LADDER],
                            "sections": {}, "correctness": [], "performance": [], "sdpa": [], "resources": [],
                            "target_rows": [], "ladder_table": []})

    def elapsed(self) -> float:
        return self.ctx.watch.seconds()

    def over_budget(self) -> bool:
        return self.ctx.over()

    def write(self):
        self.ctx.save()

    def section(self, name, fn):
        """Runs ``fn`` unless the budget is spent; records its status and time; saves the record."""
        if self.over_budget():
            self.record["sections"][name] = {"status": "skipped: time budget spent", "seconds": 0}
            self.ctx.log(f"{name}: skipped (budget)")
            self.write()
            return
        self.ctx.log(f"{name} ...")
        watch = Stopwatch()
        status = "done"
        try:
            if fn() is False:
                status = "stopped at the time budget"
        except Exception as exc:      # one broken section must not lose the others' results
            status = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        self.record["sections"][name] = {"status": status, "seconds": round(watch.seconds(), 1)}
        self.ctx.log(f"{name}: {status}")
        self.write()


# -- running one step ------------------------------------------------------------------------------

def tiles_of(run: Run, step, kernel: str, head_dim: int) -> list[Tiles]:
    return [SMOKE_TILES[kernel]] if run.smoke else step.tiles[kernel][head_dim]


def forward_backward(step, q, k, v, grad_out, causal, fwd: Tiles | None, dkdv: Tiles | None, dq: Tiles | None):
    """(out, dq, dk, dv) of one step (None: step 0, the course kernel through flashlab.attention)."""
    scale = q.shape[-1] ** -0.5
    RUN.current_step = "0 today" if step is None else step.name
    if step is None:
        with course_kernels_only():
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            out = attention(qg, kg, vg, is_causal=causal)
            out.backward(grad_out)
            return out.detach(), qg.grad, kg.grad, vg.grad
    out, lse = hopper_forward(q, k, v, causal, scale, step, tiles=fwd)
    return (out, *hopper_backward(q, k, v, out, lse, grad_out, causal, scale, step, dkdv_tiles=dkdv, dq_tiles=dq))


def check(run: Run, step, name, dtype, causal, n, d, fwd=None, dkdv=None, dq=None):
    """One correctness row: relative errors of O, dQ, dK, dV against float64."""
    torch.manual_seed(0)
    b, h = (1, 2) if run.smoke else (2, 2)
    q, k, v, grad_out = (torch.randn(b, h, n, d, device=run.device, dtype=dtype) for _ in range(4))
    results = forward_backward(step, q, k, v, grad_out, causal, fwd, dkdv, dq)
    refs = (reference_attention(q, k, v, is_causal=causal), *reference_gradients(q, k, v, grad_out, is_causal=causal))
    errors = {what: rel_error(r, ref) for what, r, ref in zip(("out", "dq", "dk", "dv"), results, refs)}
    tol = TOLERANCE[dtype]
    row = {"step": name, "dtype": str(dtype).replace("torch.", ""), "causal": causal, "N": n, "D": d,
           "tiles": {"forward": str(fwd), "dkdv": str(dkdv), "dq": str(dq)} if step is not None else "defaults",
           "errors": errors, "tolerance": tol, "ok": all(e <= tol for e in errors.values())}
    run.record["correctness"].append(row)
    print(f"    {name:22} {row['dtype']:8} {'causal' if causal else 'full':6} N={n:<5} D={d:<3} "
          f"{row['tiles'] if step is None else str(fwd) + ' | ' + str(dkdv) + ' | ' + str(dq)}: "
          + " ".join(f"{w} {e:.1e}" for w, e in errors.items()) + ("  ok" if row["ok"] else "  FAILED"), flush=True)


PROBE_TIMEOUT_S = 120


def probe_gluon_steps(run: Run):
    """Runs each Gluon step once in a child process with a time limit and returns the steps that
    finished. A kernel whose mbarrier protocol deadlocks never returns; in this process it would hang
    the whole suite, while a child is killed and its step recorded as hung."""
    import subprocess
    import sys
    script = ("import torch, sys\n"
              "from flashlab.launch import gluon\n"
              "from flashlab.launch.spec import AttentionSpec\n"
              "from flashlab.bench.suites.hopper_ladder import GLUON_STEPS\n"
              "for name, options in GLUON_STEPS:\n"
              "    for d in (64, 128):\n"
              "        q, k, v = (torch.randn(1, 2, 512, d, device='cuda', dtype=torch.bfloat16) for _ in range(3))\n"
              "        for causal in (False, True):\n"
              "            gluon.forward(q, k, v, AttentionSpec(d ** -0.5, causal), **options)\n"
              "            torch.cuda.synchronize()\n"
              "    print('finished', name, flush=True)\n")
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
        stdout, failure = done.stdout, None if done.returncode == 0 else done.stderr.strip()[-600:]
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        failure = f"no answer in {PROBE_TIMEOUT_S} s: the kernel hangs"
    finished = {line[len("finished "):] for line in stdout.splitlines() if line.startswith("finished ")}
    for name, _ in GLUON_STEPS:
        status = "ran" if name in finished else failure or "did not run"
        run.record.setdefault("gluon_probe", {})[name] = status
        print(f"    probe {name:36} {status}", flush=True)
    return [(name, options) for name, options in GLUON_STEPS if name in finished]


def check_gluon(run: Run):
    """The Gluon forward of each step against float64: output and log-sum-exp (its backward is the
    final step's, checked above), GQA included, N a multiple of 128 as the kernel takes."""
    run.gluon_steps = probe_gluon_steps(run)
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            for causal in (False, True):
                for name, options in run.gluon_steps:
                    if run.over_budget():
                        return False
                    torch.manual_seed(0)
                    q = torch.randn(2, 4, 1024, d, device=run.device, dtype=dtype)
                    k, v = (torch.randn(2, 2, 1024, d, device=run.device, dtype=dtype) for _ in range(2))
                    out, lse = gluon.forward(q, k, v, AttentionSpec(d ** -0.5, causal), **options)
                    k2, v2 = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
                    ref = reference_attention(q, k2, v2, is_causal=causal)
                    scores = q.double() @ k2.double().transpose(-1, -2) * d ** -0.5
                    if causal:
                        scores = scores.masked_fill(torch.ones(1024, 1024, dtype=torch.bool, device=run.device
                                                               ).triu(1), float("-inf"))
                    lse_err = float((lse.double() - torch.logsumexp(scores, -1) / math.log(2)).abs().max())
                    errors = {"out": rel_error(out, ref), "lse_max_abs": lse_err}
                    tol = TOLERANCE[dtype]
                    row = {"step": name, "dtype": str(dtype).replace("torch.", ""), "causal": causal, "N": 1024,
                           "D": d, "tiles": "128x128, heads 4 over 2 k/v heads", "errors": errors, "tolerance": tol,
                           "ok": errors["out"] <= tol and lse_err < 1e-3}
                    run.record["correctness"].append(row)
                    print(f"    {name:36} {row['dtype']:8} {'causal' if causal else 'full':6} D={d:<3} "
                          f"out {errors['out']:.1e} lse {lse_err:.1e}" + ("  ok" if row["ok"] else "  FAILED"),
                          flush=True)


def measure_gluon(run: Run, dtype):
    """Forward TFLOP/s of each Gluon step; forward+backward with the final step's backward."""
    bench = timer(run)
    for b, h, n, d in perf_shapes(run):
        for causal in (False, True):
            q, k, v, grad_out = (torch.randn(b, h, n, d, device=run.device, dtype=dtype) for _ in range(4))
            spec = AttentionSpec(d ** -0.5, causal)
            steps = getattr(run, "gluon_steps", GLUON_STEPS)
            if not steps:
                return True
            out, lse = gluon.forward(q, k, v, spec, **steps[-1][1])
            bwd_ms = bench(lambda: hopper_backward_spec(q, k, v, out, lse, grad_out, spec))
            for name, options in steps:
                if run.over_budget():
                    return False
                run.current_step = name
                fwd_ms = bench(lambda options=options: gluon.forward(q, k, v, spec, **options))
                row = {"step": name, "dtype": str(dtype).replace("torch.", ""), "B": b, "H": h, "N": n, "D": d,
                       "causal": causal, "fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_ms + bwd_ms, "bwd_ms": bwd_ms,
                       "fwd_tflops": tflops(b, h, n, d, causal, "fwd", fwd_ms),
                       "bwd_tflops": tflops(b, h, n, d, causal, "bwd", bwd_ms),
                       "fwd_bwd_tflops": tflops(b, h, n, d, causal, "fwd+bwd", fwd_ms + bwd_ms),
                       "tiles": {"forward": "128x128 (Gluon)", "backward": "the final step's"}, "tuning_s": 0.0}
                run.record["performance"].append(row)
                print(f"    {name:36} {row['dtype']:8} N={n:<5} D={d:<3} {'causal' if causal else 'full':6} "
                      f"fwd {row['fwd_tflops']:.3g} TFLOP/s, fwd+bwd {row['fwd_bwd_tflops']:.3g}", flush=True)


def correctness_cases(run: Run):
    dtypes = [torch.float32] if run.smoke else [torch.bfloat16, torch.float16]
    sizes = (40, 64) if run.smoke else (1000, 2048)
    for dtype in dtypes:
        for d in (64, 128):
            for causal in (False, True):
                for n in sizes:
                    yield dtype, causal, n, d


def correctness_final(run: Run):
    """The dispatched configuration of the final step (each kernel's first tiles), every case."""
    for dtype, causal, n, d in correctness_cases(run):
        if run.over_budget():
            return False
        check(run, FINAL, FINAL.name, dtype, causal, n, d, *(tiles_of(run, FINAL, kern, d)[0]
                                                              for kern in ("forward", "dkdv", "dq")))


def correctness_ladder(run: Run):
    """Every other candidate of every step (the final step's non-default tiles, steps 0-3)."""
    for dtype, causal, n, d in correctness_cases(run):
        for step in (None, *LADDER):
            if run.over_budget():
                return False
            if step is None:
                check(run, None, "0 today", dtype, causal, n, d)
                continue
            candidates = {kern: tiles_of(run, step, kern, d) for kern in ("forward", "dkdv", "dq")}
            for i in range(max(len(c) for c in candidates.values())):
                if step is FINAL and i == 0:
                    continue                  # checked in the first section
                check(run, step, step.name, dtype, causal, n, d,
                      *(c[min(i, len(c) - 1)] for c in candidates.values()))


# -- speed -----------------------------------------------------------------------------------------

def perf_shapes(run: Run):
    if run.smoke:
        yield 1, 2, 64, 64
        return
    for d in (64, 128):
        for n in (2048, 16384):
            yield 16384 // n, 2048 // d, n, d


def timer(run: Run):
    if run.smoke:
        return lambda fn: time_ms(fn, "cpu", cpu_runs=1)
    return lambda fn: time_ms(fn, "cuda", warmup_ms=5, rep_ms=30)


def tflops(b, h, n, d, causal, mode, ms):
    return attention_flops(b, h, n, d, causal, mode) / (ms * 1e-3) / 1e12 if ms and ms > 0 else None


def measure_step(run: Run, step, name, dtype):
    """TFLOP/s of one step for every shape at its dispatched tiles (each kernel's first candidate,
    what flashlab.attention launches), and every candidate timed beside them (forward alone; dK/dV,
    then dQ with the fastest dK/dV, inside the whole backward)."""
    bench = timer(run)
    for b, h, n, d in perf_shapes(run):
        for causal in (False, True):
            if run.over_budget():
                return False
            torch.manual_seed(0)
            q, k, v, grad_out = (torch.randn(b, h, n, d, device=run.device, dtype=dtype) for _ in range(4))
            scale = d ** -0.5
            watch = Stopwatch()
            run.current_step = name
            if step is None:
                with course_kernels_only():
                    fwd_ms = bench(lambda: attention(q, k, v, is_causal=causal))
                    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                    both_ms = bench(lambda: attention(qg, kg, vg, is_causal=causal).backward(grad_out))
                chosen = "defaults"
            else:
                # the row's times are the dispatched tiles' (each list's first: what flashlab.attention
                # launches); the fastest candidates' go beside them
                first = {kern: tiles_of(run, step, kern, d)[0] for kern in ("forward", "dkdv", "dq")}
                fwd_times = {t: bench(lambda t=t: hopper_forward(q, k, v, causal, scale, step, tiles=t))
                             for t in tiles_of(run, step, "forward", d)}
                best_fwd = min(fwd_times, key=fwd_times.get)
                out, lse = hopper_forward(q, k, v, causal, scale, step, tiles=best_fwd)

                def backward(dkdv, dq):
                    return bench(lambda: hopper_backward(q, k, v, out, lse, grad_out, causal, scale, step,
                                                         dkdv_tiles=dkdv, dq_tiles=dq))
                dkdv_times = {t: backward(t, first["dq"]) for t in tiles_of(run, step, "dkdv", d)}
                best_dkdv = min(dkdv_times, key=dkdv_times.get)
                dq_times = {t: backward(best_dkdv, t) for t in tiles_of(run, step, "dq", d)}
                best_dq = min(dq_times, key=dq_times.get)
                fwd_ms = fwd_times[first["forward"]]
                both_ms = fwd_ms + dkdv_times[first["dkdv"]]         # dkdv_times used the first dQ tiles
                chosen = {"dispatched": {kern: str(t) for kern, t in first.items()},
                          "forward": str(best_fwd), "dkdv": str(best_dkdv), "dq": str(best_dq),
                          "best_fwd_ms": fwd_times[best_fwd],
                          "best_fwd_bwd_ms": fwd_times[best_fwd] + dq_times[best_dq],
                          "ms": {"forward": {str(t): v for t, v in fwd_times.items()},
                                 "dkdv": {str(t): v for t, v in dkdv_times.items()},
                                 "dq": {str(t): v for t, v in dq_times.items()}}}
            row = {"step": name, "dtype": str(dtype).replace("torch.", ""), "B": b, "H": h, "N": n, "D": d,
                   "causal": causal, "fwd_ms": fwd_ms, "fwd_bwd_ms": both_ms, "bwd_ms": both_ms - fwd_ms,
                   "fwd_tflops": tflops(b, h, n, d, causal, "fwd", fwd_ms),
                   "bwd_tflops": tflops(b, h, n, d, causal, "bwd", both_ms - fwd_ms),
                   "fwd_bwd_tflops": tflops(b, h, n, d, causal, "fwd+bwd", both_ms),
                   "tiles": chosen, "tuning_s": round(watch.seconds(), 2)}
            run.record["performance"].append(row)
            print(f"    {name:22} {row['dtype']:8} N={n:<5} D={d:<3} {'causal' if causal else 'full':6} "
                  f"fwd {row['fwd_tflops']:.3g} TFLOP/s, bwd {row['bwd_tflops'] or 0:.3g}, "
                  f"fwd+bwd {row['fwd_bwd_tflops']:.3g} ({row['tuning_s']} s)", flush=True)


def measure_sdpa(run: Run, dtype):
    """SDPA's FLASH_ATTENTION and CUDNN_ATTENTION backends for the same shapes, same run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    bench = timer(run)
    for b, h, n, d in perf_shapes(run):
        for causal in (False, True):
            if run.over_budget():
                return False
            q, k, v, grad_out = (torch.randn(b, h, n, d, device=run.device, dtype=dtype) for _ in range(4))
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                row = {"backend": backend.name, "dtype": str(dtype).replace("torch.", ""), "B": b, "H": h, "N": n,
                       "D": d, "causal": causal}
                try:
                    with sdpa_kernel(backend):
                        sdpa = torch.nn.functional.scaled_dot_product_attention
                        fwd_ms = bench(lambda: sdpa(q, k, v, is_causal=causal))
                        both_ms = bench(lambda: sdpa(qg, kg, vg, is_causal=causal).backward(grad_out))
                    row.update(fwd_ms=fwd_ms, fwd_bwd_ms=both_ms, fwd_tflops=tflops(b, h, n, d, causal, "fwd", fwd_ms),
                               fwd_bwd_tflops=tflops(b, h, n, d, causal, "fwd+bwd", both_ms))
                except Exception as exc:       # e.g. no cuDNN backend on this machine
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                run.record["sdpa"].append(row)
                print(f"    SDPA {backend.name:16} {row['dtype']:8} N={n:<5} D={d:<3} "
                      f"{'causal' if causal else 'full':6} "
                      + (f"fwd {row['fwd_tflops']:.0f} TFLOP/s, fwd+bwd {row['fwd_bwd_tflops']:.0f}"
                         if "error" not in row else row["error"]), flush=True)


# -- registers and spills --------------------------------------------------------------------------

def capture_resources(run: Run):
    """Wraps each kernel's launcher so every compiled variant's registers, spills and shared memory
    are recorded once (the compiled kernel object has them after its first launch)."""
    seen = set()
    targets = {"hopper_forward_kernel": kernels, "hopper_dkdv_kernel": kernels, "hopper_dq_kernel": kernels,
               "flash_forward_kernel": flash_triton, "flash_backward_dkdv_kernel": flash_triton,
               "flash_backward_dq_kernel": flash_triton}
    if not run.smoke:
        from flashlab.kernels import gluon_hopper  # Gluon: sm_90 only
        targets["gluon_forward_kernel"] = gluon_hopper
    names = ("IS_CAUSAL", "HEAD_DIM", "BLOCK_D", "BLOCK_M", "BLOCK_N", "FOLD_SCALE", "USE_TMA", "FAST_PATH",
             "STAGES", "OVERLAP", "PINGPONG", "num_warps", "num_stages")
    for name, module in targets.items():
        jit = getattr(module, name)
        launch = jit.run

        def wrapped(*args, _launch=launch, _name=name, **kwargs):
            compiled = _launch(*args, **kwargs)
            meta = {key: kwargs[key] for key in names if key in kwargs}
            key = (run.current_step, _name, tuple(sorted(meta.items())),
                   str(args[0].dtype) if hasattr(args[0], "dtype") else "")
            if key not in seen and compiled is not None and hasattr(compiled, "n_regs"):
                seen.add(key)
                run.record["resources"].append({
                    "step": run.current_step, "kernel": _name, "dtype": key[3].replace("torch.", ""), **meta,
                    "registers": getattr(compiled, "n_regs", None), "spills": getattr(compiled, "n_spills", None),
                    "shared_bytes": getattr(getattr(compiled, "metadata", None), "shared", None)})
            return compiled
        jit.run = wrapped


# -- summaries ------------------------------------------------------------------------------------

def _sdpa_row(run, backend, row):
    return next((s for s in run.record["sdpa"] if s["backend"] == backend and all(
        s[k] == row[k] for k in ("dtype", "N", "D", "causal")) and "error" not in s), None)


def summarise(run: Run):
    """Ratios to SDPA per shape for every step, the targets for the final step, and per step the
    geometric mean TFLOP/s over the bf16 shapes and whether it was kept (it beat the last kept step)."""
    targets = []
    for row in run.record["performance"]:
        flash, cudnn = _sdpa_row(run, "FLASH_ATTENTION", row), _sdpa_row(run, "CUDNN_ATTENTION", row)
        row["fwd_vs_flash"] = flash and flash["fwd_ms"] / row["fwd_ms"]
        row["fwd_vs_cudnn"] = cudnn and cudnn["fwd_ms"] / row["fwd_ms"]
        row["fwd_bwd_vs_flash"] = flash and flash["fwd_bwd_ms"] / row["fwd_bwd_ms"]
        row["fwd_bwd_vs_cudnn"] = cudnn and cudnn["fwd_bwd_ms"] / row["fwd_bwd_ms"]
        if row["step"] == FINAL.name:
            spills = [r["spills"] for r in run.record["resources"] if r["kernel"].startswith("hopper")
                      and r.get("HEAD_DIM") == row["D"] and r.get("IS_CAUSAL") == row["causal"]
                      and isinstance(row["tiles"], dict) and r.get("USE_TMA") == FINAL.use_tma
                      and f"{r.get('BLOCK_M')}x{r.get('BLOCK_N')} w{r.get('num_warps')} s{r.get('num_stages')}"
                      in row["tiles"]["dispatched"].values()]                 # the default kernels
            targets.append({k: row[k] for k in ("dtype", "N", "D", "causal")} | {
                "fwd_vs_cudnn": row["fwd_vs_cudnn"], "fwd_vs_flash": row["fwd_vs_flash"],
                "fwd_bwd_vs_cudnn": row["fwd_bwd_vs_cudnn"],
                "met_forward_vs_cudnn": _at_least(row["fwd_vs_cudnn"], TARGETS["forward_vs_cudnn"]),
                "met_forward_vs_flash": _at_least(row["fwd_vs_flash"], TARGETS["forward_vs_flash"]),
                "met_fwd_bwd_vs_cudnn": _at_least(row["fwd_bwd_vs_cudnn"], TARGETS["fwd_bwd_vs_cudnn"]),
                "no_spills": (not any(spills)) if spills else None})
    run.record["target_rows"] = targets
    table, kept_mean, anchor_shapes = [], None, 0
    for name in ["0 today"] + [s.name for s in LADDER] + [name for name, _ in GLUON_STEPS]:
        rows = [r for r in run.record["performance"] if r["step"] == name
                and r["dtype"] == ("float32" if run.smoke else "bfloat16")]
        regs = [r for r in run.record["resources"] if r["step"] == name]
        mean = _geomean([r["fwd_bwd_tflops"] for r in rows])
        # kept: beat the last kept step over the same shapes; undecided (None) when step 0, the
        # anchor, was not measured or a run cut short measured this step on fewer shapes
        if name == "0 today":
            anchor_shapes = len(rows)
        comparable = mean is not None and anchor_shapes and len(rows) == anchor_shapes
        kept = None if not comparable else (kept_mean is None or mean >= kept_mean)
        if kept:
            kept_mean = mean
        table.append({"step": name, "shapes": len(rows),
                      "fwd_tflops_geomean": _geomean([r["fwd_tflops"] for r in rows]),
                      "bwd_tflops_geomean": _geomean([r["bwd_tflops"] for r in rows]),
                      "fwd_bwd_tflops_geomean": mean,
                      "max_registers": max((r["registers"] for r in regs if r["registers"] is not None), default=None),
                      "max_spills": max((r["spills"] for r in regs if r["spills"] is not None), default=None),
                      "kept": kept})
    run.record["ladder_table"] = table


def _at_least(value, target):
    return None if value is None else bool(value >= target)


def _geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def run(ctx: Context) -> None:
    global RUN
    run = RUN = Run(ctx)
    if run.smoke:
        run.record["smoke_notes"] = ("float32 inputs, tiles " + ", ".join(f"{k} {v}" for k, v in SMOKE_TILES.items())
                                     + " for every step (steps differ in their switches only); every step runs in "
                                     "the interpreter (tensor descriptors included); timings are meaningless")
    capture_resources(run)
    final_dtypes = [torch.float32] if run.smoke else [torch.bfloat16, torch.float16]
    gluon_here = not run.smoke and torch.cuda.get_device_capability()[0] == 9   # the Gluon kernel is sm_90's
    for i, dtype in enumerate(final_dtypes):
        tag = str(dtype).replace("torch.", "")
        run.section(f"SDPA flash and cuDNN, {tag}", lambda dtype=dtype: measure_sdpa(run, dtype))
        if gluon_here and i == 0:
            run.section("correctness: the Gluon forward", lambda: check_gluon(run))
        if gluon_here:
            run.section(f"speed: the Gluon forward, {tag}", lambda dtype=dtype: measure_gluon(run, dtype))
        run.section(f"speed: step {FINAL.name}, {tag}", lambda dtype=dtype: measure_step(run, FINAL, FINAL.name, dtype))
        if i == 0:
            run.section("correctness: final step, dispatched tiles", lambda: correctness_final(run))
        summarise(run)
    for step, name in [(None, "0 today")] + [(s, s.name) for s in LADDER[:-1]]:
        run.section(f"speed: step {name}, {'float32' if run.smoke else 'bfloat16'}",
                    lambda step=step, name=name: measure_step(run, step, name, final_dtypes[0]))
    summarise(run)
    run.section("correctness: every step and candidate", lambda: correctness_ladder(run))
    summarise(run)
    failed = [r for r in run.record["correctness"] if not r["ok"]]
    ctx.log(f"{len(run.record['correctness'])} correctness rows ({len(failed)} failed), "
            f"{len(run.record['performance'])} speed rows, {len(run.record['resources'])} compiled kernels")
    for row in run.record["ladder_table"]:
        ctx.log(f"{row['step']:22} fwd+bwd geomean {row['fwd_bwd_tflops_geomean'] or 0:8.3f} TFLOP/s, "
                f"max registers {row['max_registers']}, max spills {row['max_spills']}, kept {row['kept']}")
    if failed:
        run.record["error"] = f"{len(failed)} correctness rows outside their tolerance"


SUITE = Suite(
    name="hopper-ladder",
    summary="notebooks 07b and 11: the Hopper ladder, each step's correctness, TFLOP/s, registers",
    measures="for each step of the Hopper ladder: errors against float64 (every candidate tile), forward, "
             "backward and forward+backward TFLOP/s at its dispatched and its fastest tiles beside SDPA's flash "
             "and cuDNN backends, registers and spills of every compiled kernel, the final step's targets",
    shapes="B·N = 16384, H·D = 2048, N = 2048 and 16384, D = 64 and 128, causal and full, bf16 (the final step "
           "fp16 too); correctness at N = 1000 and 2048. --quick: N = 40 and 64, fp32, small tiles",
    budget_s=450, min_s=60, run=run, needs="gpu, or quick")
