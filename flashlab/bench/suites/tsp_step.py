"""tsp-step: the TSP trainer's whole REINFORCE step (encoder, sampled decoder rollout with
gradients, greedy baseline rollout, Adam) at Kool et al.'s batch, steps per second with SDPA and
with flashlab (small path on and off), eager and compiled as ``python -m flashlab train-tsp
--compile reduce-overhead`` compiles it (notebooks 07 and 09)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from flashlab.bench.suite import Context, Suite
from flashlab.bench.suites.small_path import autocast, refusal, run_sections, sizes, small_path

VARIANTS = (                # (name, attention, small path, torch.compile mode or None)
    ("sdpa eager", "sdpa", None, None),
    ("flashlab eager, general path", "flashlab", False, None),
    ("flashlab eager, small path", "flashlab", True, None),
    ("sdpa compiled (reduce-overhead)", "sdpa", None, "reduce-overhead"),
    ("flashlab compiled (reduce-overhead), small path", "flashlab", True, "reduce-overhead"),
    ("flashlab compiled (reduce-overhead), general path", "flashlab", False, "reduce-overhead"),
)


def tsp_train(device, size, ctx) -> dict:
    """The trainer's REINFORCE step, eager and compiled: warm-up steps first (compilation,
    CUDA-graph recording), then the timed ones, back to back (`flashlab.launch.timing.wall_ms`)."""
    from flashlab.api.attention import attention
    from flashlab.launch.timing import wall_ms
    from flashlab.train.tsp import AttentionModel, random_instances, tour_length
    rows, skipped = [], []
    for n in size["train_nodes"]:
        for name, which, on, mode in VARIANTS:
            if ctx.over() or (mode and device != "cuda" and not size.get("compile_on_cpu")):
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
                with torch.no_grad(), autocast(device):
                    base_lengths = tour_length(coords, run_baseline(coords, "greedy")[0])     # rollout baseline
                optimizer.zero_grad(set_to_none=True)
                with autocast(device):
                    tours, log_p = run_model(coords, "sample")
                loss = ((tour_length(coords, tours) - base_lengths) * log_p.float()).mean()   # REINFORCE
                loss.backward()
                optimizer.step()
            try:
                with small_path(bool(on)):
                    # the warm-up compiles, records graphs and warms the allocator: its length is what
                    # compiling costs a training run
                    warmup_s = wall_ms(step, size["train_warmup"], device) * size["train_warmup"] / 1e3
                    ms = wall_ms(step, size["train_steps"], device)
            except Exception as exc:
                rows.append({"nodes": n, "variant": name, "error": refusal(exc)})
                ctx.log(f"tsp_train n={n} {name}: {refusal(exc)}")
                continue
            rows.append({"nodes": n, "instances": size["tsp_batch"], "variant": name, "attention": which,
                         "small_path": on, "compile": mode, "warmup_steps": size["train_warmup"],
                         "warmup_s": warmup_s, "timed_steps": size["train_steps"],
                         "steps_per_s": 1e3 / ms, "ms_per_step": ms})
            ctx.log(f"tsp_train n={n} {name}: {1e3 / ms:.2f} steps/s (warm-up {warmup_s:.0f} s)")
            ctx.save()
    return {"rows": rows, "skipped": skipped,
            "what": "greedy baseline rollout (no grad) + sampled rollout with grad + REINFORCE loss + backward + "
                    "Adam, bf16 autocast; compiled variants: torch.compile(model, mode='reduce-overhead')"}


def run(ctx: Context) -> None:
    run_sections(ctx, (("tsp_train", tsp_train),), sizes(ctx.quick))


SUITE = Suite(
    name="tsp-step",
    summary="the TSP trainer's REINFORCE step, flashlab vs SDPA, eager and compiled",
    measures="steps per second of the whole REINFORCE step (greedy baseline rollout, sampled rollout with "
             "gradients, backward, Adam) with SDPA, flashlab on its general kernels and flashlab on the small "
             "path, eager and torch.compile(mode='reduce-overhead'); the warm-up's length (compilation)",
    shapes="TSP20 and TSP50, batch 512 (Kool et al.), embed 128, 8 heads, 3 layers, bf16 autocast; 3 warm-up "
           "steps, 10 timed. --quick: 3 cities, batch 1, one step",
    budget_s=420, min_s=60, run=run, needs="gpu, or quick")
