"""GPU session for routing-model sizes (issue 19): flashlab's small-sequence path
(flashlab/launch/small.py) against the general kernels and PyTorch's SDPA backends, timed
eagerly and as CUDA-graph replays, and in the TSP Attention Model's training step.

    PYTHONPATH=. python -m measurements.small_graphs OUT_DIR          # one H200, ≤ 5 minutes
    PYTHONPATH=. python -m measurements.small_graphs OUT_DIR --smoke  # CPU, tiny sizes, < 1 minute

Writes OUT_DIR/small_graphs.json after every section (a crash keeps what was measured).
Sections, in order of importance; once BUDGET_S seconds have passed, the remaining sections
(and the remaining rows of a running one) are recorded as skipped:
  correctness  the small path (and the general path just above its limit) vs float64:
               out, dQ, dK, dV relative errors, bf16/fp16/fp32, D 16/64, causal and full
  table        B=512, H=8, N 20/50/100/128/1000, D 16/64, bf16: forward and forward+backward,
               ms, eager and CUDA-graph replay (the kernels' time without the CPU), for
               flashlab, flashlab with FLASHLAB_SMALL_PATH=0 (the general kernels: "before"),
               SDPA FLASH_ATTENTION / EFFICIENT_ATTENTION / CUDNN_ATTENTION (refusals recorded);
               per row flashlab / fastest SDPA (target ≤ 1.1)
  tsp_encoder  the Attention Model's encoder (embed 128, 8 heads, 3 layers) training step:
               forward + backward + Adam, batch 512, 20/50/100 nodes, flashlab vs SDPA's
               default dispatch, ms/step (target: flashlab ≥ 1.1× faster), eager, with the
               encoder compiled (reduce-overhead), and (GPU) the whole step captured in one
               CUDA graph and replayed, for both
  tsp_train    the whole REINFORCE step (encoder, sampled decoder rollout with gradients,
               greedy baseline rollout, Adam) at Kool et al.'s batch 512, TSP20 and TSP50:
               steps/s for SDPA and flashlab (small path off and on), eager and compiled
  choices      the small kernels' launch choices (BLOCK_M, heads per program, warps, stages)
               at D = 16 (--choice-d, --choice-n), N 20/50/100, by CUDA-graph replay time:
               which default to ship
  encoder_tiles  tsp_encoder's step captured whole, with the default launches, with O laid
               out as before 2026-12-05, and with the fastest launches `choices` found at that N
               (D = 16), beside SDPA, interleaved over rounds: what each change gives the step
Autotuning is off (FLASHLAB_AUTOTUNE=0: each kernel's default configuration), so the run
fits its budget and every number comes from a known configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

BUDGET_S = 290.0

SIZES = {
    False: dict(correct_bh=(4, 4), correct_n=[1, 2, 17, 20, 50, 64, 100, 128], correct_d=[16, 64],
                table_bh=(512, 8), table_n=[20, 50, 100, 128, 1000], table_d=[16, 64],
                tsp_batch=512, tsp_nodes=[20, 50, 100], train_nodes=[20, 50], train_warmup=3, train_steps=10,
                choice_n=[20, 50, 100], choice_d=[16], tile_rounds=3, warmup_ms=10, rep_ms=40, cpu_runs=5),
    True: dict(correct_bh=(1, 2), correct_n=[1, 17, 20], correct_d=[16],
               table_bh=(2, 2), table_n=[20, 40], table_d=[16],
               tsp_batch=1, tsp_nodes=[4], train_nodes=[3], train_warmup=1, train_steps=1, compile_on_cpu=True,
               choice_n=[4], choice_d=[16], tile_rounds=2, warmup_ms=1, rep_ms=1, cpu_runs=1),
}


class Budget:
    def __init__(self, seconds: float):
        self.start, self.seconds = time.time(), seconds

    def left(self) -> float:
        return self.seconds - (time.time() - self.start)

    def over(self) -> bool:
        return self.left() <= 0


@contextlib.contextmanager
def switch(name: str, on: bool):
    """The environment switch ``name`` ("1" or "0") for the duration: flashlab reads its switches
    (FLASHLAB_SMALL_PATH, FLASHLAB_DIRECT_LAUNCH) on every call."""
    before = os.environ.get(name)
    os.environ[name] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def small_path(on: bool):
    """FLASHLAB_SMALL_PATH for the duration."""
    return switch("FLASHLAB_SMALL_PATH", on)


def log(message: str) -> None:
    print(f"[small_graphs] {message}", flush=True)


# -- timing ------------------------------------------------------------------------------------

def eager_ms(fn, device, size) -> float:
    from flashlab.launch.timing import time_ms
    return time_ms(fn, device, size["warmup_ms"], size["rep_ms"], cpu_runs=size["cpu_runs"])


def graph_ms(fn, device, size):
    """Replay time of ``fn`` captured in a CUDA graph (`flashlab.launch.timing.time_graph_ms`); a string
    saying why not where it cannot be."""
    if device != "cuda":
        return "CUDA graphs need a CUDA GPU"
    from flashlab.launch.timing import time_graph_ms
    return time_graph_ms(fn, size["warmup_ms"], size["rep_ms"])


def _refusal(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"


# -- a. correctness -----------------------------------------------------------------------------

def correctness(device, size, budget) -> dict:
    from flashlab import reference_attention, reference_gradients, rel_error
    from flashlab.api.attention import attention
    from flashlab.launch import small as flash_small
    from flashlab.reference.float64 import TOLERANCE
    dtypes = [torch.bfloat16, torch.float16, torch.float32] if device == "cuda" else [torch.float32]
    B, H = size["correct_bh"]
    rows, skipped = [], 0
    for dtype in dtypes:
        for D in size["correct_d"]:
            limit = flash_small.max_keys(D, dtype)
            # bf16 over the whole list; fp16 and fp32 (no dtype-specific code in the kernels) a subset
            # and the general path just above the limit (bf16): every compile costs a second or two
            ns = [*size["correct_n"], limit + 1] if dtype == torch.bfloat16 or device != "cuda" else [17, 100]
            for N in ns:
                for is_causal in (False, True):
                    if budget.over():
                        skipped += 1
                        continue
                    q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True)
                               for _ in range(3))
                    # the small path switched on whatever the environment says: until 2026-12-04 it was
                    # off by default on a GPU, and this section checked only the general kernels there
                    with small_path(True):
                        out = attention(q, k, v, is_causal=is_causal, exact_fp32=True)
                        grad = torch.randn_like(out)
                        out.backward(grad)
                        took_small = flash_small.applies(N, N, D, dtype, device)
                    ref = reference_attention(q, k, v, None, is_causal)
                    dq, dk, dv = reference_gradients(q, k, v, grad, None, is_causal)
                    errors = {name: rel_error(got, want) for name, got, want in
                              (("out", out, ref), ("dq", q.grad, dq), ("dk", k.grad, dk), ("dv", v.grad, dv))}
                    tol = TOLERANCE[dtype]
                    rows.append({"dtype": str(dtype), "D": D, "N": N, "causal": is_causal,
                                 "path": "small" if took_small else "general",
                                 "errors": errors, "tolerance": tol,
                                 "ok": all(e <= tol for e in errors.values())})
    bad = [r for r in rows if not r["ok"]]
    log(f"correctness: {len(rows) - len(bad)}/{len(rows)} within tolerance"
        + (f", {skipped} skipped" if skipped else ""))
    return {"rows": rows, "all_ok": not bad, "skipped_rows": skipped}


# -- b. the table ---------------------------------------------------------------------------------

def _implementations(device):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashlab.api.attention import attention

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        return run

    return {"flashlab": (attention, True), "flashlab_general": (attention, False),
            "sdpa_flash": (sdpa(SDPBackend.FLASH_ATTENTION), None),
            "sdpa_efficient": (sdpa(SDPBackend.EFFICIENT_ATTENTION), None),
            "sdpa_cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION), None)}


def _steps(fn, q, k, v, grad):
    """The two things timed: a forward without autograd, and a forward+backward (the gradients
    handed over each time, as after optimizer.zero_grad())."""
    def forward():
        with torch.no_grad():
            fn(q, k, v)

    def forward_backward():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(grad)
    return forward, forward_backward


def _time_attention(fn, q, k, v, grad, device, size) -> dict:
    """fwd and fwd+bwd, eager and graph replay, for one implementation and shape."""
    forward, forward_backward = _steps(fn, q, k, v, grad)
    result = {}
    for mode, step in (("fwd", forward), ("fwd+bwd", forward_backward)):
        for how, timer in (("eager", eager_ms), ("graph", graph_ms)):
            try:
                result[f"{mode}_{how}_ms"] = timer(step, device, size)
            except Exception as exc:                 # a backend that refuses the shape, or a failure
                result[f"{mode}_{how}_ms"] = _refusal(exc)
                if device == "cuda":
                    torch.cuda.synchronize()
    return result


def table(device, size, budget) -> dict:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    B, H = size["table_bh"]
    rows, skipped = [], []
    for D in size["table_d"]:
        for N in size["table_n"]:
            if budget.over():
                skipped.append({"N": N, "D": D})
                continue
            q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            grad = torch.randn_like(q)
            row = {"B": B, "H": H, "N": N, "D": D, "dtype": str(dtype)}
            for name, (fn, small) in _implementations(device).items():
                with small_path(small if small is not None else True):
                    row[name] = _time_attention(fn, q, k, v, grad, device, size)
            for mode in ("fwd_eager", "fwd_graph", "fwd+bwd_eager", "fwd+bwd_graph"):
                sdpa = [row[n][f"{mode}_ms"] for n in row if n.startswith("sdpa")
                        if isinstance(row[n][f"{mode}_ms"], float)]
                ours = row["flashlab"][f"{mode}_ms"]
                if sdpa and isinstance(ours, float):
                    row[f"ratio_{mode}"] = ours / min(sdpa)        # flashlab / fastest SDPA; target ≤ 1.1
            rows.append(row)
            log(f"table N={N} D={D}: " + ", ".join(f"{m} {row.get('ratio_' + m, float('nan')):.2f}×"
                                                      for m in ("fwd_graph", "fwd+bwd_graph", "fwd+bwd_eager")))
    return {"rows": rows, "skipped_rows": skipped, "target_ratio": 1.1}


# -- c. TSP -------------------------------------------------------------------------------------

def _autocast(device):
    return torch.autocast(device, dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def _encoder_step(attention_fn, coords, device, mode=None):
    """One encoder training step (forward, squared-output loss, backward, Adam) of a fresh seeded
    model; with ``mode`` the encoder compiled as the trainer compiles it (forward and its
    backward; Adam stays eager)."""
    from flashlab.train.tsp import AttentionModel
    torch.manual_seed(0)
    model = AttentionModel(attention_fn=attention_fn).to(device)
    encode = torch.compile(model.encode, mode=mode) if mode else model.encode
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device):
            out = encode(coords)
        out.float().square().mean().backward()
        optimizer.step()
    return step


def tsp_encoder(device, size, budget) -> dict:
    from flashlab.api.attention import attention
    from flashlab.train.tsp import random_instances
    rows, skipped = [], []
    for n in size["tsp_nodes"]:
        if budget.over():
            skipped.append(n)
            continue
        coords = random_instances(size["tsp_batch"], n, seed=n, device=device)
        row = {"nodes": n, "instances": size["tsp_batch"], "dtype": "bf16 autocast" if device == "cuda" else "fp32"}
        modes = [None] + (["reduce-overhead"] if device == "cuda" or size.get("compile_on_cpu") else [])
        for mode in modes:
            for name, fn in (("flashlab", attention), ("sdpa", F.scaled_dot_product_attention)):
                column = f"{name}{'_compiled' if mode else ''}_ms_per_step"
                if mode and budget.over():
                    row[column] = f"skipped: time budget of {budget.seconds:.0f} s spent"
                    continue
                torch._dynamo.reset()
                step = _encoder_step(fn, coords, device, mode)
                try:
                    for _ in range(3 if mode else 0):
                        step()                         # compilation and CUDA-graph recording, untimed
                    row[column] = eager_ms(step, device, size)
                except Exception as exc:
                    row[column] = _refusal(exc)
        if device == "cuda":
            for name, fn in (("flashlab", attention), ("sdpa", F.scaled_dot_product_attention)):
                column = f"{name}_captured_ms_per_step"
                if budget.over():
                    row[column] = f"skipped: time budget of {budget.seconds:.0f} s spent"
                    continue
                try:
                    row[column] = _captured_encoder_step_ms(fn, coords, size)
                except Exception as exc:
                    row[column] = _refusal(exc)
                    torch.cuda.synchronize()
        for suffix in ("", "_compiled", "_captured"):
            ours, theirs = row.get(f"flashlab{suffix}_ms_per_step"), row.get(f"sdpa{suffix}_ms_per_step")
            if isinstance(ours, float) and isinstance(theirs, float):
                row[f"speedup_vs_sdpa{suffix}"] = theirs / ours            # target ≥ 1.1
        if isinstance(row.get("flashlab_compiled_ms_per_step"), float) and isinstance(row["sdpa_ms_per_step"], float):
            row["compiled_speedup_vs_sdpa_eager"] = row["sdpa_ms_per_step"] / row["flashlab_compiled_ms_per_step"]
        rows.append(row)
        log(f"tsp_encoder n={n}: " + ", ".join(f"{k[:-12]} {v if isinstance(v, str) else f'{v:.3f}'} ms"
                                               for k, v in row.items() if k.endswith("_ms_per_step")))
    return {"rows": rows, "skipped_nodes": skipped, "target_speedup": 1.1,
            "what": "encoder forward + squared-output loss + backward + Adam step; eager, with the encoder "
                    "compiled (torch.compile mode reduce-overhead, as train-tsp --compile does; Adam eager), and "
                    "the whole step captured in one CUDA graph (PyTorch's whole-network capture, Adam "
                    "capturable=True; replayed: the GPU's time, without the host's)"}


def _captured_encoder_step_ms(attention_fn, coords, size) -> float:
    """One encoder training step (forward, loss, backward, Adam) captured whole in a CUDA graph,
    as PyTorch's CUDA-graph documentation captures a whole network: warm-up steps on a side
    stream, then the capture; the replay's time is the GPU's alone. The model and the data are
    the eager and compiled columns' (same seed, same instances)."""
    from flashlab.train.tsp import AttentionModel
    torch.manual_seed(0)
    model = AttentionModel(attention_fn=attention_fn).to("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            out = model.encode(coords)
        out.float().square().mean().backward()
        optimizer.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    return eager_ms(graph.replay, "cuda", size)


TSP_TRAIN_VARIANTS = (                # (name, attention, small path, torch.compile mode or None)
    ("sdpa eager", "sdpa", None, None),
    ("flashlab eager, general path", "flashlab", False, None),
    ("flashlab eager, small path", "flashlab", True, None),
    ("sdpa compiled (reduce-overhead)", "sdpa", None, "reduce-overhead"),
    ("flashlab compiled (reduce-overhead), small path", "flashlab", True, "reduce-overhead"),
    ("flashlab compiled (reduce-overhead), general path", "flashlab", False, "reduce-overhead"),
)


def tsp_train(device, size, budget) -> dict:
    """The trainer's REINFORCE step, eager and compiled (`python -m flashlab train-tsp --compile`):
    warm-up steps first (compilation, CUDA-graph recording), then the timed ones."""
    from flashlab.api.attention import attention
    from flashlab.train.tsp import AttentionModel, random_instances, tour_length
    rows, skipped = [], []
    for n in size["train_nodes"]:
        for name, which, on, mode in TSP_TRAIN_VARIANTS:
            if budget.over() or (mode and device != "cuda" and not size.get("compile_on_cpu")):
                skipped.append({"nodes": n, "variant": name})
                continue
            torch.manual_seed(0)
            torch._dynamo.reset()
            model = AttentionModel(attention_fn=attention if which == "flashlab" else F.scaled_dot_product_attention)
            model = model.to(device)
            baseline = copy.deepcopy(model).eval()
            run_model = torch.compile(model, mode=mode) if mode else model
            run_baseline = torch.compile(baseline, mode=mode) if mode else baseline
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
            coords = random_instances(size["tsp_batch"], n, seed=n, device=device)

            def step():
                with torch.no_grad(), _autocast(device):
                    base_lengths = tour_length(coords, run_baseline(coords, "greedy")[0])     # rollout baseline
                optimizer.zero_grad(set_to_none=True)
                with _autocast(device):
                    tours, log_p = run_model(coords, "sample")
                loss = ((tour_length(coords, tours) - base_lengths) * log_p.float()).mean()   # REINFORCE
                loss.backward()
                optimizer.step()
            try:
                with small_path(bool(on)):
                    start = time.perf_counter()
                    for _ in range(size["train_warmup"]):
                        step()                                # compiles, records graphs, warms the allocator
                    if device == "cuda":
                        torch.cuda.synchronize()
                    warmup_s = time.perf_counter() - start
                    start = time.perf_counter()
                    for _ in range(size["train_steps"]):
                        step()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    seconds = (time.perf_counter() - start) / size["train_steps"]
            except Exception as exc:
                rows.append({"nodes": n, "variant": name, "error": _refusal(exc)})
                log(f"tsp_train n={n} {name}: {_refusal(exc)}")
                continue
            rows.append({"nodes": n, "instances": size["tsp_batch"], "variant": name, "attention": which,
                         "small_path": on, "compile": mode, "warmup_steps": size["train_warmup"],
                         "warmup_s": warmup_s, "timed_steps": size["train_steps"],
                         "steps_per_s": 1 / seconds, "ms_per_step": seconds * 1e3})
            log(f"tsp_train n={n} {name}: {1 / seconds:.2f} steps/s (warm-up {warmup_s:.0f} s)")
    return {"rows": rows, "skipped": skipped,
            "what": "greedy baseline rollout (no grad) + sampled rollout with grad + REINFORCE loss + backward + "
                    "Adam, bf16 autocast; compiled variants: torch.compile(model, mode='reduce-overhead')"}


# -- choices of the small kernels ---------------------------------------------------------------

# (BLOCK_M, heads per program, warps, stages): 2026-12-04's lists, then (2026-12-05) 2-warp tiles
# and 2-stage software pipelining of the backward's loop over query blocks
FORWARD_CHOICES = [(16, 1, 4, 1), (32, 1, 4, 1), (64, 1, 4, 1), (128, 1, 4, 1), (32, 2, 4, 1), (32, 4, 4, 1),
                   (16, 4, 2, 1), (64, 1, 8, 1),
                   (16, 1, 2, 1), (32, 1, 2, 1), (64, 1, 2, 1), (64, 2, 4, 1), (128, 1, 8, 1)]
BACKWARD_CHOICES = [(16, 1, 4, 1), (32, 1, 4, 1), (64, 1, 4, 1), (128, 1, 8, 1), (32, 2, 4, 1), (32, 1, 8, 1),
                    (16, 1, 2, 1), (64, 1, 8, 1),
                    (32, 1, 2, 1), (64, 1, 2, 1), (128, 1, 4, 1),
                    (16, 1, 2, 2), (32, 1, 2, 2), (32, 1, 4, 2), (64, 1, 2, 2), (64, 1, 4, 2), (128, 1, 8, 2)]

# the fastest launch of each kernel at (N, D), as the last `choices` section measured it: what
# `encoder_tiles` times the encoder step with
_best_choices: dict = {}


def choices(device, size, budget) -> dict:
    from flashlab.api.attention import attention
    from flashlab.launch import small as flash_small
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    B, H = size["table_bh"]
    rows, skipped = [], []
    timer = graph_ms if device == "cuda" else eager_ms
    for D, N in ((d, n) for d in size["choice_d"] for n in size["choice_n"]):
        if N > flash_small.max_keys(D, dtype):
            continue                                   # beyond the small path at this head dimension
        q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn_like(q)
        with small_path(True):
            out = attention(q, k, v).detach()
        forward, forward_backward = _steps(attention, q, k, v, grad)
        width = flash_small._pow2(N)
        for kernel, options, fn in (("forward", FORWARD_CHOICES, forward),
                                    ("backward", BACKWARD_CHOICES, forward_backward)):
            default = flash_small.default_config(kernel, N, N, torch.device(device), D, dtype.itemsize)
            for block_m, heads, warps, stages in options:
                if block_m > width:
                    continue
                if budget.over():
                    skipped.append({"N": N, "D": D, "kernel": kernel, "config": [block_m, heads, warps, stages]})
                    continue
                config = flash_small.SmallConfig(block_m, heads, warps, stages)
                try:
                    # the small path switched on: run on 2026-12-03 with the GPU default off, this
                    # section timed the general kernels for every choice (all within 0.5%)
                    with small_path(True), flash_small.force(**{kernel: config}):
                        if kernel == "forward":
                            with torch.no_grad():
                                diff = attention(q, k, v).float() - out.float()
                            error = diff.norm().item() / out.float().norm().item()
                        else:
                            error = None
                        ms = timer(fn, device, size)
                except Exception as exc:
                    ms, error = _refusal(exc), None
                rows.append({"N": N, "D": D, "dtype": str(dtype), "kernel": kernel, "config": str(config),
                             "default": config == default,
                             "ms": ms, "what": "fwd" if kernel == "forward" else "fwd+bwd (default forward)",
                             "forward_rel_diff_vs_default": error})
        best = {}
        for r in rows:
            if r["N"] == N and r["D"] == D and isinstance(r["ms"], float):
                if r["kernel"] not in best or r["ms"] < best[r["kernel"]]["ms"]:
                    best[r["kernel"]] = r
        _best_choices[N, D] = {kern: flash_small.SmallConfig.parse(r["config"]) for kern, r in best.items()}
        log(f"choices N={N} D={D}: " + ", ".join(f"{kern} best {r['config']} {r['ms']:.4f} ms"
                                                 for kern, r in best.items()))
    return {"rows": rows, "skipped": skipped, "timer": "CUDA graph replay" if device == "cuda" else "eager (CPU)",
            "best": {f"N={n} D={d}": {kern: str(c) for kern, c in configs.items()}
                     for (n, d), configs in _best_choices.items()}}


def encoder_tiles(device, size, budget) -> dict:
    """The encoder training step (tsp_encoder's, captured whole on a GPU) with the small kernels'
    default launches; with q, k, v passed as three views instead of packed (`three_views`: autograd
    then gathers their gradients with a copy, which `flashlab.attention_qkvpacked` avoids); with
    that and O allocated contiguous as before 2026-12-05 (`contiguous_output`); and with the
    fastest launches `choices` measured at that N and D = 16 (the model's head dimension), beside
    SDPA; interleaved over rounds, so that a difference is read against the rounds' spread. Needs
    `choices` earlier in the same run for the last variant only (the others are timed without it)."""
    from flashlab.api.attention import attention
    from flashlab.launch import small as flash_small
    from flashlab.train.tsp import random_instances
    rows, skipped = [], []
    for n in size["tsp_nodes"]:
        best = _best_choices.get((n, 16))
        if best is not None and len(best) < 2:
            best = None
        element_size = 2 if device == "cuda" else 4                      # the step's bf16 autocast on a GPU
        defaults = {kern: flash_small.default_config(kern, n, n, torch.device(device), 16, element_size)
                    for kern in ("forward", "backward")}
        coords = random_instances(size["tsp_batch"], n, seed=n, device=device)     # tsp_encoder's instances
        variants = [("sdpa", F.scaled_dot_product_attention, contextlib.nullcontext),
                    ("flashlab default launches", attention, contextlib.nullcontext),
                    ("flashlab, three views (not packed)", three_views, contextlib.nullcontext),
                    ("flashlab, three views, O contiguous (before 2026-12-05)", three_views, contiguous_output)]
        if best is None:              # the other variants need no choices: timed all the same
            skipped.append({"nodes": n, "why": "choices did not time both kernels at this N and D = 16: "
                                               "no 'fastest launches' variant"})
        elif best != defaults:
            variants.append(("flashlab fastest launches", attention, lambda: flash_small.force(**best)))
        times = {name: [] for name, _, _ in variants}
        for _ in range(size["tile_rounds"]):
            for name, fn, context in variants:
                if budget.over():
                    break
                try:
                    with context():
                        times[name].append(_encoder_step_ms(fn, coords, size, device))
                except Exception as exc:
                    times[name].append(_refusal(exc))
        row = {"nodes": n, "instances": size["tsp_batch"], "defaults": {k: str(c) for k, c in defaults.items()},
               "fastest": {k: str(c) for k, c in best.items()} if best else None, "ms_per_step": times}
        medians = {name: statistics.median(t) for name, t in times.items()
                   if t and all(isinstance(x, float) for x in t)}
        row["median_ms_per_step"] = medians
        for name in medians:
            if name != "sdpa" and "sdpa" in medians:
                row[f"speedup_vs_sdpa ({name})"] = medians["sdpa"] / medians[name]     # target ≥ 1.1
        rows.append(row)
        log(f"encoder_tiles n={n}: " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in medians.items()))
    return {"rows": rows, "skipped": skipped, "rounds": size["tile_rounds"],
            "timer": "whole step captured in one CUDA graph, replayed" if device == "cuda" else "eager (CPU)",
            "what": "tsp_encoder's step (encoder forward + squared-output loss + backward + Adam), bf16 autocast"}


def three_views(q, k, v, **kwargs):
    """`flashlab.attention` behind a wrapper: the encoder layer hands the packed form only to
    `flashlab.attention` itself, so it passes q, k, v as three views of its projection, as to SDPA."""
    from flashlab.api.attention import attention
    return attention(q, k, v, **kwargs)


@contextlib.contextmanager
def contiguous_output():
    """The small path with O allocated contiguous (B, H, N, D), as before 2026-12-05: the encoder
    layer's transpose(1, 2).reshape then copies O (flashlab.launch.layouts.output_like says why not)."""
    from flashlab.launch import small as flash_small
    saved = flash_small.output_layout

    def contiguous(q, value_dim=None):
        return saved(torch.empty(q.shape, device="meta"), value_dim)      # the rule's layout for a contiguous q
    flash_small.output_layout = contiguous
    flash_small._plans.clear()                  # plans hold O's strides
    try:
        yield
    finally:
        flash_small.output_layout = saved
        flash_small._plans.clear()


def _encoder_step_ms(attention_fn, coords, size, device) -> float:
    """The encoder step captured whole on a GPU; eager on a CPU (the smoke run proves the code runs)."""
    if device == "cuda":
        return _captured_encoder_step_ms(attention_fn, coords, size)
    return eager_ms(_encoder_step(attention_fn, coords, device), device, size)


# -- the run ------------------------------------------------------------------------------------

SECTIONS = [("correctness", correctness), ("table", table), ("tsp_encoder", tsp_encoder),
            ("tsp_train", tsp_train), ("choices", choices), ("encoder_tiles", encoder_tiles)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder for small_graphs.json")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: proves the script runs (< 2 minutes)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"sections not started by then are skipped (default {BUDGET_S:.0f}; smoke 50)")
    parser.add_argument("--sections", nargs="+", choices=[name for name, _ in SECTIONS], default=None,
                        help="run only these sections (default: all, in order)")
    parser.add_argument("--train-nodes", type=int, nargs="+", default=None,
                        help="tsp_train's problem sizes (default 20 50)")
    parser.add_argument("--choice-d", type=int, nargs="+", default=None,
                        help="choices' head dimensions (default 16)")
    parser.add_argument("--choice-n", type=int, nargs="+", default=None,
                        help="choices' sequence lengths, in the order timed (default 20 50 100)")
    parser.add_argument("--tsp-nodes", type=int, nargs="+", default=None,
                        help="tsp_encoder's and encoder_tiles' problem sizes (default 20 50 100)")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA GPU: run with --smoke on a CPU")
    os.environ["FLASHLAB_AUTOTUNE"] = "0"
    _best_choices.clear()                   # one run's choices only (main may run twice in a process)
    device = "cpu" if args.smoke else "cuda"
    if device == "cpu":
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    size = dict(SIZES[args.smoke])
    if args.train_nodes:
        size["train_nodes"] = args.train_nodes
    if args.choice_d:
        size["choice_d"] = args.choice_d
    if args.choice_n:
        size["choice_n"] = args.choice_n
    if args.tsp_nodes:
        size["tsp_nodes"] = args.tsp_nodes
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "small_graphs.json"
    from flashlab.bench.records import environment
    budget = Budget(args.budget_s or (BUDGET_S if not args.smoke else 50.0))
    result = {"environment": environment(), "smoke": args.smoke, "budget_s": budget.seconds,
              "autotune": "off (FLASHLAB_AUTOTUNE=0)", "sizes": size, "sections": {}}

    def save():
        result["elapsed_s"] = round(time.time() - budget.start, 1)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str))
        tmp.replace(path)

    for name, section in SECTIONS:
        if args.sections and name not in args.sections:
            continue
        if budget.over():
            result["sections"][name] = {"skipped": f"time budget of {budget.seconds:.0f} s spent"}
            log(f"{name}: skipped (budget)")
            save()
            continue
        log(f"{name} (t = {time.time() - budget.start:.0f} s)")
        torch.manual_seed(0)
        try:
            result["sections"][name] = section(device, size, budget)
        except Exception as exc:
            result["sections"][name] = {"error": _refusal(exc), "traceback": traceback.format_exc()[-2000:]}
            log(f"{name}: FAILED {_refusal(exc)}")
        save()
    log(f"wrote {path} in {time.time() - budget.start:.0f} s")
    failed = [n for n, s in result["sections"].items() if "error" in s]
    wrong = not result["sections"].get("correctness", {}).get("all_ok", True)
    return 1 if failed or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
