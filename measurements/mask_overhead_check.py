"""What an attention mask costs flashlab's kernels (2026-12-06): bf16 forward and forward+backward with
no mask (the Hopper kernels, then the general ones with FLASHLAB_HOPPER=0 set per call), a key-padding mask as
bool and as float (B, 1, 1, Nk), the same float mask expanded over the queries (B, 1, Nq, Nk, stride 0, as
transformers' encoders pass it) and materialised (B, 1, Nq, Nk), and SDPA's default with none and the float one.
Run: PYTHONPATH=. FLASHLAB_AUTOTUNE=0 python -m measurements.mask_overhead_check OUT.json; the key-padding masks
(stride 0 over the queries) take the shared-row load in the general kernels and in the small path's up to 64-key
tiles, with FLASHLAB_MASK_ROW_SHARED=all in every kernel, with FLASHLAB_MASK_ROW_SHARED=0 the copies' load
everywhere. The record names the flashlab it imported and the switch ("1" unless it is set: the default).
`... OUT.json small`: the small path's shapes instead (a BERT-sized batch at 128 tokens, a routing-sized one at 50
nodes), timed as CUDA-graph replays (eager calls of that size are launch-bound: their time is the host's).
`... OUT.json small-grid`: flashlab alone with the bool and the float key-padding mask at N = 20, 50, 64, 100, 128
and D = 16, 64 (256 × 8 heads), also replayed: where in the small path the shared row pays (its key tile is the
next power of two of N: 32, 64, 64, 128, 128)."""
import json
import os
import sys

import torch
import torch.nn.functional as F

import flashlab
from flashlab.launch.timing import time_graph_ms, time_ms
from measurements.inputs import attention_inputs

SHAPES = [(4, 16, 4096, 64), (8, 16, 1024, 64)]
SMALL_SHAPES = [(32, 12, 128, 64), (512, 8, 50, 16)]       # one key tile: flashlab's small path
SMALL_GRID = [(256, 8, n, d) for d in (16, 64) for n in (20, 50, 64, 100, 128)]


def main(path=None, which="large"):
    rows = []
    small, grid = which in ("small", "small-grid"), which == "small-grid"
    for B, H, N, D in SMALL_GRID if grid else SMALL_SHAPES if small else SHAPES:
        q, k, v, grad = attention_inputs(B, H, N, D)
        keep = torch.ones(B, 1, 1, N, dtype=torch.bool, device="cuda")
        keep[: B // 2, ..., N - N // 8:] = False
        bias = torch.zeros(B, 1, 1, N, device="cuda", dtype=torch.bfloat16).masked_fill(~keep, -float("inf"))
        masks = {"none": None, "bool (B,1,1,N)": keep, "float (B,1,1,N)": bias,
                 "float expanded (B,1,N,N) stride 0": bias.expand(B, 1, N, N),
                 "float materialised (B,1,N,N)": bias.expand(B, 1, N, N).contiguous()}

        def timed(fn, mask, general=False):
            def fwd():
                return fn(q.detach(), k.detach(), v.detach(), attn_mask=mask)

            def step():
                return torch.autograd.grad(fn(q, k, v, attn_mask=mask), (q, k, v), grad)
            if general:
                os.environ["FLASHLAB_HOPPER"] = "0"
            try:
                if small:
                    return time_graph_ms(fwd), time_graph_ms(step)
                return time_ms(fwd), time_ms(step)
            finally:
                os.environ.pop("FLASHLAB_HOPPER", None)

        if grid:
            masks = {name: masks[name] for name in ("bool (B,1,1,N)", "float (B,1,1,N)")}
        for name, mask in masks.items():
            impls = [("flashlab", flashlab.attention, False), ("sdpa", F.scaled_dot_product_attention, False)]
            if not small:
                impls.insert(1, ("flashlab general", flashlab.attention, True))
            if grid:
                impls = impls[:1]
            for impl, fn, general in impls:
                if impl == "flashlab general" and mask is not None or impl == "sdpa" and "float (" not in name \
                        and mask is not None:
                    continue
                fwd_ms, step_ms = timed(fn, mask, general)
                row = dict(B=B, H=H, N=N, D=D, mask=name, impl=impl, fwd_ms=fwd_ms, step_ms=step_ms,
                           timing="CUDA-graph replay" if small else "eager")
                print(json.dumps({k: round(x, 4) if isinstance(x, float) else x for k, x in row.items()}), flush=True)
                rows.append(row)
    if path:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, flashlab=flashlab.__file__,
                       mask_row_shared=os.environ.get("FLASHLAB_MASK_ROW_SHARED", "1"), rows=rows), open(path, "w"),
                  indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
