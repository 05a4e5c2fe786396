"""What the float mask's row fix costs (2026-12-06): with a float attn_mask the forward also stores each row's c =
2^(L − m)/l, and the backward kernels load it and multiply their recomputed P by it (dQ once at the end). Times
forward+backward with a float key-padding mask beside the same mask as bool (no fix), no mask, and SDPA's
default with and without the float mask, in one run.
Run: PYTHONPATH=. FLASHLAB_AUTOTUNE=0 python -m measurements.float_mask_fix_cost OUT.json; with PYTHONPATH=OLD:.
(OLD holding flashlab/ from before the fix, e.g. `git archive 8607f92 flashlab`) for the same without it (with
python -P: -m would put the working directory ahead of OLD); a second argument "small" times the routing-sized
shape alone. (The first version of the fix, b918a3e, scaled dO by c instead; its record timed that pass.)"""
import json
import sys

import torch
import torch.nn.functional as F

import flashlab
from flashlab.launch.timing import time_ms
from measurements.inputs import attention_inputs

SHAPES = [(512, 8, 50, 16), (4, 16, 1024, 64), (4, 16, 4096, 64)]     # (B, H, N, D): routing-sized, then long


def main(path=None, shapes="all"):
    rows = []
    for B, H, N, D in SHAPES[:1] if shapes == "small" else SHAPES:
        q, k, v, grad = attention_inputs(B, H, N, D)
        keep = torch.ones(B, 1, 1, N, dtype=torch.bool, device="cuda")
        keep[: B // 2, ..., N - N // 8:] = False                              # half the batch padded by N/8
        bias = torch.zeros(B, 1, 1, N, device="cuda", dtype=torch.bfloat16).masked_fill(~keep, torch.finfo(
            torch.bfloat16).min)

        def step(fn, mask):
            return lambda: torch.autograd.grad(fn(q, k, v, attn_mask=mask), (q, k, v), grad)

        row = dict(B=B, H=H, N=N, D=D,
                   flashlab_float_ms=time_ms(step(flashlab.attention, bias)),
                   flashlab_bool_ms=time_ms(step(flashlab.attention, keep)),
                   flashlab_no_mask_ms=time_ms(step(flashlab.attention, None)),
                   sdpa_no_mask_ms=time_ms(step(F.scaled_dot_product_attention, None)),
                   sdpa_float_ms=time_ms(step(F.scaled_dot_product_attention, bias)))
        row["float_over_bool"] = row["flashlab_float_ms"] / row["flashlab_bool_ms"]
        print(json.dumps({k: round(x, 4) if isinstance(x, float) else x for k, x in row.items()}))
        rows.append(row)
    if path:
        record = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, flashlab=flashlab.__file__,
                      rows=rows)
        json.dump(record, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])      # OUT.json [small: the routing-sized shape alone]
