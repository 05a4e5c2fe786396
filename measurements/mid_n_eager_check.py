"""Why an eager bf16 forward+backward at 4 x 16 heads x N = 1024 x D = 64 took about 1 ms in flashlab against
SDPA's 0.18-0.32 ms (float_mask_fix_cost.py's run, autotuning off, 2026-12-06): eager beside graph-replayed (the
GPU's time alone), SDPA beside it, and the top host-side ops of a profile of eager calls.
Run: PYTHONPATH=. python -m measurements.mid_n_eager_check OUT.json  (FLASHLAB_AUTOTUNE as you want it)"""
import json
import os
import sys

import torch
import torch.nn.functional as F

import flashlab
from flashlab.launch.timing import time_graph_ms, time_ms
from measurements.inputs import attention_inputs

SHAPES = [(4, 16, 1024, 64), (16, 16, 1024, 64), (4, 16, 4096, 64)]


def main(path=None):
    rows = []
    for B, H, N, D in SHAPES:
        q, k, v, grad = attention_inputs(B, H, N, D)

        def step(fn):
            return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), grad)

        def fwd(fn):
            return lambda: fn(q.detach(), k.detach(), v.detach())

        row = dict(B=B, H=H, N=N, D=D, autotune=os.environ.get("FLASHLAB_AUTOTUNE", "default"))
        for name, fn in (("flashlab", flashlab.attention), ("sdpa", F.scaled_dot_product_attention)):
            row[f"{name}_fwd_eager_ms"] = time_ms(fwd(fn))
            row[f"{name}_fwd_graph_ms"] = time_graph_ms(fwd(fn))
            row[f"{name}_step_eager_ms"] = time_ms(step(fn))
            row[f"{name}_step_graph_ms"] = time_graph_ms(step(fn))
        print(json.dumps({k: round(x, 4) if isinstance(x, float) else x for k, x in row.items()}), flush=True)
        rows.append(row)
    B, H, N, D = SHAPES[0]
    q, k, v, grad = attention_inputs(B, H, N, D)
    for _ in range(3):
        torch.autograd.grad(flashlab.attention(q, k, v), (q, k, v), grad)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            torch.autograd.grad(flashlab.attention(q, k, v), (q, k, v), grad)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
    print(table)
    if path:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows, profile=table),
                  open(path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
