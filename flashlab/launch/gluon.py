"""Launching the Gluon forward (`flashlab.kernels.gluon_hopper`): when it runs, and how.

`flashlab.launch.dispatch` asks `use_gluon` before the Triton Hopper kernels. It says yes on an
sm_90 GPU with Triton ≥ 3.6 (whose Gluon the kernel is written for), for what the kernel takes:
fp16/bf16, D ∈ {64, 128}, Nq = Nk a multiple of 128, no mask, dropout, window or soft-cap, k/v
heads dividing q heads, 16-byte aligned contiguous rows; and only while ``FLASHLAB_GLUON`` is on
(`ON_BY_DEFAULT` when unset: on once the hopper-ladder suite's record shows it faster than the
Triton Hopper forward on the GPUs the course measures). The backward of such a call is the Hopper
or dense kernels', which read the same log-sum-exp.
"""

from __future__ import annotations

import torch

from . import runtime, switches
from .spec import AttentionSpec

ON_BY_DEFAULT = False
DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128)
BLOCK = 128
MIN_TRITON = (3, 6)


# module names the tests replace to pretend to be an sm_90 GPU with Triton 3.6
_triton_version = runtime.triton_version
_capability = runtime.device_capability


def enabled() -> bool:
    return switches.gluon(ON_BY_DEFAULT)


def why_not_gluon(q, k, v, attn_mask, spec: AttentionSpec) -> str | None:
    """None if the Gluon forward takes this call, else why not."""
    if not enabled():
        return "FLASHLAB_GLUON=0 (or unset while the Gluon forward is off by default)"
    if q.device.type != "cuda" or _capability(q.device)[0] != 9:
        return "the Gluon forward is for sm_90 GPUs"
    if _triton_version() < MIN_TRITON:
        return f"Triton {_triton_version()}: the Gluon forward needs ≥ {MIN_TRITON}"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype}: the Gluon forward takes fp16/bf16"
    if q.shape[-1] not in HEAD_DIMS or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return f"head dimension {q.shape[-1]}: the Gluon forward takes D ∈ {HEAD_DIMS}"
    if q.shape[2] != k.shape[2] or q.shape[2] % BLOCK:
        return f"lengths {q.shape[2]}, {k.shape[2]}: the Gluon forward takes Nq = Nk, a multiple of {BLOCK}"
    if q.shape[1] % k.shape[1]:
        return "k/v heads must divide q heads"
    if attn_mask is not None or spec.dropout_p > 0 or spec.window is not None or spec.softcap > 0:
        return "attn_mask, dropout, a window or a soft-cap: not in the Gluon forward"
    if not spec.scale > 0:
        return "the Gluon forward folds a positive scale into the exponent"
    if not all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (q, k, v)):
        return "the Gluon forward reads contiguous (B, H, N, D) tensors through TMA descriptors"
    return None


def use_gluon(q, k, v, attn_mask, spec: AttentionSpec) -> bool:
    return why_not_gluon(q, k, v, attn_mask, spec) is None


def forward(q, k, v, spec: AttentionSpec, stages: int | None = None, overlap: bool = True, pingpong: bool = True,
            block_n: int = 128):
    """O and the base-2 log-sum-exp L of contiguous (B, H, N, D) q, k, v (`why_not_gluon` holds).
    ``stages``: K/V buffers in the ring (default: as many as fit beside Q); ``overlap``, ``pingpong``:
    the kernel's OVERLAP and PINGPONG; ``block_n``: keys per block (dividing N)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from flashlab.kernels.gluon_hopper import BLOCK_M, gluon_forward_kernel, shared_layout

    B, H, n, D = q.shape
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    if stages is None:                                 # the K/V ring that fits beside Q in shared memory
        stages = max(1, (200 * 1024 - BLOCK_M * D * 2) // (2 * block_n * D * 2))
    out = torch.empty_like(q)
    lse = torch.empty(B, H, n, dtype=torch.float32, device=q.device)

    def desc(t, rows):
        flat = t.view(-1, D)                           # (B·H·N, D): a tile never crosses a head (N % 128 = 0)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, D], shared_layout([rows, D],
                                                                                                      dtype))

    qk_scale = spec.kernel_args(n, n)[0][0]
    grid = (n // BLOCK_M, B * H)
    o_rows = BLOCK_M // 2 if pingpong else BLOCK_M     # each consumer stores its own rows
    gluon_forward_kernel[grid](desc(q, BLOCK_M), desc(k, block_n), desc(v, block_n), desc(out, o_rows), lse,
                               H, H // k.shape[1], n, qk_scale,
                               IS_CAUSAL=spec.is_causal, STAGES=stages, OVERLAP=overlap, PINGPONG=pingpong,
                               num_warps=4 if pingpong else 8, maxnreg=168)
    return out, lse
