"""small-launches: the small kernels' launch choices (query rows per program, heads per program,
warps, stages), each timed by CUDA-graph replay at routing sizes, and what the fastest give the TSP
encoder's training step; the record's choices are what flashlab/launch/tuned/small_path/<gpu>.json
ships (`launches_table`; written by ``python -m flashlab.bench ship-launches RECORD``).

  choices        every launch of FORWARD_CHOICES and BACKWARD_CHOICES that fits the tile, at each
                 head dimension and sequence length; the fastest per kernel
  encoder_tiles  the encoder step captured whole, with the default launches, with q, k, v passed as
                 three views instead of packed, with that and O contiguous (the layout the output had
                 before `flashlab.launch.layouts.output_like`), and with the fastest launches
                 `choices` found at that N (D = 16), beside SDPA, interleaved over rounds"""

from __future__ import annotations

import contextlib
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from flashlab.bench.suite import Context, Suite
from flashlab.bench.suites.small_path import (
    captured_encoder_step_ms,
    eager_ms,
    encoder_step,
    graph_ms,
    refusal,
    run_sections,
    sizes,
    small_path,
    steps,
)

ROOT = Path(__file__).resolve().parents[3]

# (BLOCK_M, heads per program, warps, stages)
FORWARD_CHOICES = [(16, 1, 4, 1), (32, 1, 4, 1), (64, 1, 4, 1), (128, 1, 4, 1), (32, 2, 4, 1), (32, 4, 4, 1),
                   (16, 4, 2, 1), (64, 1, 8, 1),
                   (16, 1, 2, 1), (32, 1, 2, 1), (64, 1, 2, 1), (64, 2, 4, 1), (128, 1, 8, 1)]
BACKWARD_CHOICES = [(16, 1, 4, 1), (32, 1, 4, 1), (64, 1, 4, 1), (128, 1, 8, 1), (32, 2, 4, 1), (32, 1, 8, 1),
                    (16, 1, 2, 1), (64, 1, 8, 1),
                    (32, 1, 2, 1), (64, 1, 2, 1), (128, 1, 4, 1),
                    (16, 1, 2, 2), (32, 1, 2, 2), (32, 1, 4, 2), (64, 1, 2, 2), (64, 1, 4, 2), (128, 1, 8, 2)]


def choices(device, size, ctx) -> dict:
    from flashlab.api.attention import attention
    from flashlab.launch import small as flash_small
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    B, H = size["table_bh"]
    rows, skipped, best_choices = [], [], {}
    timer = graph_ms if device == "cuda" else eager_ms
    for D, N in ((d, n) for d in size["choice_d"] for n in size["choice_n"]):
        if N > flash_small.max_keys(D, dtype):
            continue                                   # beyond the small path at this head dimension
        q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn_like(q)
        with small_path(True):
            out = attention(q, k, v).detach()
        forward, forward_backward = steps(attention, q, k, v, grad)
        width = flash_small._pow2(N)
        for kernel, options, fn in (("forward", FORWARD_CHOICES, forward),
                                    ("backward", BACKWARD_CHOICES, forward_backward)):
            default = flash_small.default_config(kernel, N, N, torch.device(device), D, dtype.itemsize)
            for block_m, heads, warps, stages in options:
                if block_m > width:
                    continue
                if ctx.over():
                    skipped.append({"N": N, "D": D, "kernel": kernel, "config": [block_m, heads, warps, stages]})
                    continue
                config = flash_small.SmallConfig(block_m, heads, warps, stages)
                try:
                    with small_path(True), flash_small.force(**{kernel: config}):
                        if kernel == "forward":
                            with torch.no_grad():
                                diff = attention(q, k, v).float() - out.float()
                            error = diff.norm().item() / out.float().norm().item()
                        else:
                            error = None
                        ms = timer(fn, device, size)
                except Exception as exc:
                    ms, error = refusal(exc), None
                rows.append({"N": N, "D": D, "dtype": str(dtype), "kernel": kernel, "config": str(config),
                             "default": config == default,
                             "ms": ms, "what": "fwd" if kernel == "forward" else "fwd+bwd (default forward)",
                             "forward_rel_diff_vs_default": error})
        best = {}
        for r in rows:
            if r["N"] == N and r["D"] == D and isinstance(r["ms"], float):
                if r["kernel"] not in best or r["ms"] < best[r["kernel"]]["ms"]:
                    best[r["kernel"]] = r
        best_choices[N, D] = {kern: flash_small.SmallConfig.parse(r["config"]) for kern, r in best.items()}
        ctx.log(f"choices N={N} D={D}: " + ", ".join(f"{kern} best {r['config']} {r['ms']:.4f} ms"
                                                     for kern, r in best.items()))
        ctx.save()
    ctx.best_choices = best_choices
    return {"rows": rows, "skipped": skipped, "timer": "CUDA graph replay" if device == "cuda" else "eager (CPU)",
            "best": {f"N={n} D={d}": {kern: str(c) for kern, c in configs.items()}
                     for (n, d), configs in best_choices.items()}}


def encoder_tiles(device, size, ctx) -> dict:
    """The encoder training step (captured whole on a GPU) with the small kernels' default launches;
    with q, k, v passed as three views instead of packed (`three_views`: autograd then gathers their
    gradients with a copy, which `flashlab.attention_qkvpacked` avoids); with that and O allocated
    contiguous (`contiguous_output`); and with the fastest launches `choices` measured at that N and
    D = 16 (the model's head dimension), beside SDPA; interleaved over rounds, so that a difference
    is read against the rounds' spread. Without `choices` earlier in the run the last variant is left out."""
    from flashlab.api.attention import attention
    from flashlab.launch import small as flash_small
    from flashlab.train.tsp import random_instances
    rows, skipped = [], []
    for n in size["tile_nodes"]:
        best = getattr(ctx, "best_choices", {}).get((n, 16))
        if best is not None and len(best) < 2:
            best = None
        element_size = 2 if device == "cuda" else 4                      # the step's bf16 autocast on a GPU
        defaults = {kern: flash_small.default_config(kern, n, n, torch.device(device), 16, element_size)
                    for kern in ("forward", "backward")}
        coords = random_instances(size["tsp_batch"], n, seed=n, device=device)
        variants = [("sdpa", F.scaled_dot_product_attention, contextlib.nullcontext),
                    ("flashlab default launches", attention, contextlib.nullcontext),
                    ("flashlab, three views (not packed)", three_views, contextlib.nullcontext),
                    ("flashlab, three views, O contiguous", three_views, contiguous_output)]
        if best is None:
            skipped.append({"nodes": n, "why": "choices did not time both kernels at this N and D = 16: "
                                               "no 'fastest launches' variant"})
        elif best != defaults:
            variants.append(("flashlab fastest launches", attention, lambda best=best: flash_small.force(**best)))
        times = {name: [] for name, _, _ in variants}
        for _ in range(size["tile_rounds"]):
            for name, fn, context in variants:
                if ctx.over():
                    break
                try:
                    with context():
                        times[name].append(encoder_step_ms(fn, coords, size, device))
                except Exception as exc:
                    times[name].append(refusal(exc))
        row = {"nodes": n, "instances": size["tsp_batch"], "defaults": {k: str(c) for k, c in defaults.items()},
               "fastest": {k: str(c) for k, c in best.items()} if best else None, "ms_per_step": times}
        medians = {name: statistics.median(t) for name, t in times.items()
                   if t and all(isinstance(x, float) for x in t)}
        row["median_ms_per_step"] = medians
        for name in medians:
            if name != "sdpa" and "sdpa" in medians:
                row[f"speedup_vs_sdpa ({name})"] = medians["sdpa"] / medians[name]     # target ≥ 1.1
        rows.append(row)
        ctx.log(f"encoder_tiles n={n}: " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in medians.items()))
        ctx.save()
    return {"rows": rows, "skipped": skipped, "rounds": size["tile_rounds"],
            "timer": "whole step captured in one CUDA graph, replayed" if device == "cuda" else "eager (CPU)",
            "what": "the encoder step (encoder forward + squared-output loss + backward + Adam), bf16 autocast"}


def three_views(q, k, v, **kwargs):
    """`flashlab.attention` behind a wrapper: the encoder layer hands the packed form only to
    `flashlab.attention` itself, so it passes q, k, v as three views of its projection, as to SDPA."""
    from flashlab.api.attention import attention
    return attention(q, k, v, **kwargs)


@contextlib.contextmanager
def contiguous_output():
    """The small path with O allocated contiguous (B, H, N, D): the encoder layer's
    transpose(1, 2).reshape then copies O (flashlab.launch.layouts.output_like says why not)."""
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


def encoder_step_ms(attention_fn, coords, size, device) -> float:
    """The encoder step captured whole on a GPU; eager on a CPU (--quick proves the code runs)."""
    if device == "cuda":
        return captured_encoder_step_ms(attention_fn, coords, size)
    return eager_ms(encoder_step(attention_fn, coords, device), device, size)


def run(ctx: Context) -> None:
    run_sections(ctx, (("choices", choices), ("encoder_tiles", encoder_tiles)), sizes(ctx.quick))
    if "rows" in ctx.record["sections"].get("choices", {}):
        ctx.record["launches"] = launches_table([ctx.record])


# -- the launches file ------------------------------------------------------------------------------

def fastest(record: dict) -> dict[str, dict]:
    """{decision key: {"config", "ms", "N"}} of one record's choices: for each kernel, padded head
    dimension, padded key count and element size, the launch with the shortest time; of two sequence
    lengths that pad to the same tile the longer one decides (it fills more of the tile)."""
    from flashlab.launch import small as flash_small
    best: dict[str, dict] = {}
    for row in record["sections"]["choices"]["rows"]:
        if not isinstance(row["ms"], float):
            continue                                   # a launch the compiler refused
        element_size = getattr(torch, row.get("dtype", "torch.bfloat16").removeprefix("torch.")).itemsize
        key = flash_small.decision_key(row["kernel"], row["D"], row["N"], element_size)
        mine = best.get(key)
        if mine is None or row["N"] > mine["N"] or (row["N"] == mine["N"] and row["ms"] < mine["ms"]):
            best[key] = {"config": row["config"], "ms": row["ms"], "N": row["N"]}
    return best


def launches_table(records: list[dict], sources: list[str] | None = None) -> dict:
    """The small path's measured launches from small-launches records of one GPU model (a later
    record overrides an earlier one where both timed the same kernel, D and keys)."""
    decisions, gpu = {}, None
    for record in records:
        name = record["environment"].get("gpu")
        if gpu is not None and name != gpu:
            raise ValueError(f"small-launches records of two GPU models ({gpu}, {name}): give records of one")
        gpu = name
        decisions.update(fastest(record))
    return {"format": 1, "gpu": gpu, "source": sources or [],
            "how": "each (kernel | padded D | padded keys | bytes per element): the fastest launch of the "
                   "small-launches suite's choices, CUDA-graph replay, B·H = 4096",
            "decisions": {key: best["config"] for key, best in sorted(decisions.items())},
            "replay_ms": {key: round(best["ms"], 5) for key, best in sorted(decisions.items())}}


def write_launches_file(paths: list[Path], check: bool = False) -> int:
    """flashlab/launch/tuned/small_path/<gpu>.json from small-launches records of one GPU model
    (``python -m flashlab.bench ship-launches RECORD...``); with ``check``, compare instead of writing:
    0 if the shipped file is what the records give, 1 if not."""
    from flashlab.launch import small as flash_small
    shown = [str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p) for p in paths]
    table = launches_table([json.loads(p.read_text()) for p in paths], shown)
    out = flash_small.measured_path(table["gpu"])
    text = json.dumps(table, indent=1) + "\n"
    if check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'as the records give' if same else 'DIFFERS from the records'}")
        return 0 if same else 1
    out.write_text(text)
    print(f"wrote {out}: {len(table['decisions'])} launches measured on {table['gpu']}")
    return 0


SUITE = Suite(
    name="small-launches",
    summary="the small kernels' launch choices, and the encoder step with the fastest",
    measures="every candidate launch of the small forward and backward kernels by CUDA-graph replay time (the "
             "fastest per kernel, head dimension and key count is what flashlab ships for the GPU); the TSP "
             "encoder's training step captured whole with the default launches, with q, k, v as three views, "
             "with O contiguous and with the fastest launches, beside SDPA, interleaved over 3 rounds",
    shapes="B = 512, H = 8, N = 100, 50, 20, D = 16, 32 and 64, bf16; the encoder step at 100, 50 and 20 cities, "
           "batch 512. --quick: B = H = 2, N = 4, D = 16",
    budget_s=300, min_s=60, run=run, needs="gpu, or quick")
