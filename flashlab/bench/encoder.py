"""The capstone's encoder benchmark: the TSP Attention Model's encoder (notebooks 07b and 09b) timed
with each attention implementation, forward and forward+backward, and its extra memory."""

from __future__ import annotations

import contextlib

import torch

from flashlab.launch.timing import extra_memory, time_ms
from flashlab.train.model import ATTENTION
from flashlab.train.tsp import AttentionModel, random_instances


def benchmark_encoder(node_counts, batch: int = 64, attention_names=("naive", "sdpa", "flashlab"),
                      dtype=torch.bfloat16, device=None, warmup_ms: int = 25, rep_ms: int = 100,
                      tokens: int | None = None) -> list[dict]:
    """Time the Attention Model's encoder (3 layers, 8 heads, width 128) for each attention
    implementation and number of nodes: forward and forward+backward under autocast to
    ``dtype`` (fp32 on CPU), with the extra memory of a forward+backward on CUDA. The
    number of instances shrinks with N so that batch·N stays at ``tokens`` (default
    ``batch``·max(10, N_min))."""
    from tqdm.auto import tqdm

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    autocast_dtype = dtype if device == "cuda" else None
    rows = []
    tokens = tokens or batch * max(10, min(node_counts))
    for n in tqdm(list(node_counts), desc="encoder benchmark"):
        instances = max(1, tokens // n)
        coords = random_instances(instances, n, seed=n, device=device)
        for name in attention_names:
            torch.manual_seed(0)
            model = AttentionModel(attention_fn=ATTENTION[name]).to(device)
            ctx = (lambda: torch.autocast(device, dtype=autocast_dtype)) if autocast_dtype else None

            def forward(model=model, ctx=ctx, coords=coords):
                with torch.no_grad(), (ctx() if ctx else contextlib.nullcontext()):
                    model.encode(coords)

            def forward_backward(model=model, ctx=ctx, coords=coords):
                with ctx() if ctx else contextlib.nullcontext():
                    out = model.encode(coords)
                out.float().square().mean().backward()

            row = {"attention": name, "nodes": n, "instances": instances, "dtype": str(autocast_dtype or "fp32")}
            try:
                row["fwd_ms"] = time_ms(forward, device, warmup_ms, rep_ms)
                row["fwd+bwd_ms"] = time_ms(forward_backward, device, warmup_ms, rep_ms)
                row["extra_bytes"] = extra_memory(forward_backward, device)
            except (RuntimeError, torch.OutOfMemoryError) as exc:
                row["error"] = str(exc).splitlines()[0][:200]
            rows.append(row)
            del model
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows
