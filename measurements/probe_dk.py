"""GPU probe (H200): dK error of the backward for several (BLOCK_M, BLOCK_N, num_stages).

Run on a GPU from the repository root: ``python -m measurements.probe_dk``.
Found on 2026-12-02 (Triton 3.6): BLOCK_M < BLOCK_N with 2 stages gave dK errors of
1-9%; equal blocks or one stage were exact. flashlab's dK/dV candidates (flashlab.launch.autotune)
keep the blocks equal when pipelined.
"""

import torch

import flashlab.api.attention as flash
from flashlab import reference_gradients, rel_error
from flashlab.launch import autotune


def dk_errors(dtype, n_q, n_k, head_dim, config):
    q = torch.randn(1, 2, n_q, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, 2, n_k, head_dim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    out = flash.attention(q, k, v)
    grad_out = torch.randn_like(out)
    with autotune.force(dkdv=config, dq=config):
        out.backward(grad_out)
    return [round(rel_error(a, b), 4) for a, b in zip((q.grad, k.grad, v.grad), reference_gradients(q, k, v, grad_out))]


if __name__ == "__main__":
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        for n_q, n_k in [(40, 257), (64, 256), (1000, 1000)]:
            for bm, bn, stages in [(32, 64, 2), (32, 64, 1), (64, 64, 2), (16, 64, 2)]:
                config = autotune.Config(bm, bn, 4, stages)
                print(dtype, n_q, n_k, (bm, bn, stages), dk_errors(dtype, n_q, n_k, 128, config), flush=True)
