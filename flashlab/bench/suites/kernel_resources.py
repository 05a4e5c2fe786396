"""kernel-resources: registers per thread, register spills and shared memory of every compiled
flashlab kernel, for every autotuning candidate, forward and backward, and which candidate the
autotuner chose (docs/results.md, "what limits the misses": spills, or a shared-memory footprint that
caps occupancy at one block per SM, are the first suspects when a kernel trails cuDNN)."""

from __future__ import annotations

import torch

from flashlab.bench.suite import Context, Suite

NAMES = ["flash_forward_kernel", "flash_backward_preprocess_kernel", "flash_backward_dkdv_kernel",
         "flash_backward_dq_kernel"]
SHAPE = (4, 16, 4096)        # B, H, N: B·N = 16384


def capture():
    """Wraps each dense kernel's launcher so the compiled kernel it returns is recorded (the one place
    this suite reaches into flashlab's kernels)."""
    import flashlab.kernels.dense as kernels
    seen = []
    for name in NAMES:
        jit = getattr(kernels, name)
        launch = jit.run

        def run(*args, _launch=launch, _name=name, **kwargs):
            compiled = _launch(*args, **kwargs)
            seen.append((_name, kwargs, compiled))
            return compiled
        jit.run = run
    return seen


def run(ctx: Context) -> None:
    import os

    from flashlab.api.attention import attention
    from flashlab.launch import autotune
    os.environ["FLASHLAB_HOPPER"] = "0"          # the course's dense kernels, which the tuner tunes
    autotune.tuner.cache_path = ""               # tune (compile every candidate) even where choices were stored
    seen = capture()
    ctx.record.update(rows=[], skipped=[])
    B, H, N = (1, 2, 64) if ctx.quick else SHAPE
    for d in ((16,) if ctx.quick else (64, 128)):
        for causal in (False, True):
            if ctx.over():
                ctx.record["skipped"].append({"D": d, "causal": causal, "why": ctx.skipped()})
                continue
            q, k, v = (torch.randn(B, H, N, d, device=ctx.device, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            seen.clear()
            attention(q, k, v, is_causal=causal).sum().backward()
            done = set()
            for name, kwargs, compiled in seen:
                meta = {key: kwargs[key] for key in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages") if key in kwargs}
                if (name, tuple(meta.items())) in done:
                    continue
                done.add((name, tuple(meta.items())))
                ctx.record["rows"].append({"kernel": name, "D": d, "causal": causal, **meta,
                                           "registers": getattr(compiled, "n_regs", None),
                                           "spills": getattr(compiled, "n_spills", None),
                                           "shared_bytes": getattr(getattr(compiled, "metadata", None), "shared",
                                                                   None)})
                ctx.log(str(ctx.record["rows"][-1]))
            ctx.record["autotune"] = autotune.tuner.report()
            ctx.save()


SUITE = Suite(
    name="kernel-resources",
    summary="registers, spills and shared memory of every compiled kernel candidate",
    measures="registers per thread, spilled registers and shared memory of each compiled dense kernel "
             "(forward, backward preprocess, dK/dV, dQ) for every autotuning candidate, and the tuner's choices",
    shapes="B = 4, H = 16, N = 4096, D = 64 and 128, causal and full, bf16, forward and backward",
    budget_s=120, min_s=30, run=run, needs="gpu")
