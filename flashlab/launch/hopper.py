"""Launching the Hopper kernels (`flashlab.kernels.hopper`): when to use them, the ladder of
variants the hopper-ladder suite compares, and the launches.

`flashlab.launch.dispatch` calls `use_hopper` first; it says yes only on a CUDA GPU of compute
capability 9.x with a Triton that has been checked to compile these kernels (≥ 3.6), for the
case they handle: fp16/bf16, D ∈ {64, 128}, no attn_mask, dropout, window or soft-cap, as many
k/v heads as q heads, a positive scale, and tensors a tensor descriptor can address (16-byte
aligned base and strides). Everything else, the CPU interpreter and Ampere included, runs the
dense kernels. ``FLASHLAB_HOPPER=0`` forces the dense kernels, ``FLASHLAB_HOPPER=1`` the Hopper
ones where they apply; unset, `ON_BY_DEFAULT` decides.

The log-sum-exp the Hopper forward saves is the course kernel's (base 2, (B, H, Nq) float32),
so either backward can follow either forward.
"""

from __future__ import annotations

import torch

from flashlab.kernels.dense import flash_backward_preprocess_kernel
from flashlab.kernels.hopper import LADDER, Step, Tiles, hopper_dkdv_kernel, hopper_dq_kernel, hopper_forward_kernel

from . import runtime, switches
from .layouts import output_like
from .runtime import kernel_for
from .spec import AttentionSpec

HOPPER_DTYPES = (torch.float16, torch.bfloat16)
HOPPER_HEAD_DIMS = (64, 128)
MIN_TRITON = (3, 6)          # the oldest Triton these kernels were compiled with (sm_90, ahead of time)


FINAL = LADDER[-1]


# module names the tests replace to pretend to be an sm_90 GPU with Triton 3.6
_triton_version = runtime.triton_version
_capability = runtime.device_capability


# Whether flashlab.attention takes the Hopper kernels when FLASHLAB_HOPPER is unset: on, because the
# hopper-ladder suite's record shows the final step faster than the dense kernels forward and
# backward and every step within tolerance of float64.
ON_BY_DEFAULT = True


def enabled() -> bool:
    """FLASHLAB_HOPPER=1 turns the Hopper path on, =0 off; unset: ON_BY_DEFAULT (read on every call,
    so a test can set it)."""
    return switches.hopper(ON_BY_DEFAULT)


def _addressable(t: torch.Tensor) -> bool:
    """Whether a tensor descriptor can address ``t``: head dimension contiguous, base and the
    other strides multiples of 16 bytes (TMA's rule)."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s > 0 and s * size % 16 == 0 for s in t.stride()[:-1]))


def why_not_hopper(q, k, v, attn_mask, spec: AttentionSpec) -> str | None:
    """None if the Hopper kernels take this call, else the reason they do not (for tests and logs)."""
    if not enabled():
        return "FLASHLAB_HOPPER=0 (or unset while the Hopper path is off by default)"
    from . import autotune
    if autotune.forcing():
        return "autotune.force(...) is active: the forced configurations are the general kernels'"
    if q.device.type != "cuda":
        return f"device {q.device.type}: the Hopper kernels need a CUDA GPU"
    if _capability(q.device)[0] != 9:
        return f"compute capability {_capability(q.device)}: the Hopper kernels are for 9.x"
    if _triton_version() < MIN_TRITON:
        return f"Triton {_triton_version()}: the Hopper kernels need ≥ {MIN_TRITON}"
    if q.dtype not in HOPPER_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype}: the Hopper kernels take fp16/bf16"
    if q.shape[-1] not in HOPPER_HEAD_DIMS or k.shape != v.shape or k.shape[-1] != q.shape[-1]:
        return f"head dimension {q.shape[-1]}: the Hopper kernels take D ∈ {HOPPER_HEAD_DIMS}, same for q, k, v"
    if k.shape[1] != q.shape[1]:
        return "GQA: the Hopper kernels take as many k/v heads as q heads"
    if attn_mask is not None or spec.dropout_p > 0 or spec.window is not None or spec.softcap > 0:
        return "attn_mask, dropout, a window or a soft-cap: not in the Hopper kernels"
    if not all(_addressable(t) for t in (q, k, v)):
        return "a stride or base address that is not a multiple of 16 bytes (tensor descriptors need it)"
    if not spec.scale > 0:
        return f"scale {spec.scale}: the Hopper forward scales the row maximum, which needs scale > 0"
    return None


def use_hopper(q, k, v, attn_mask, spec: AttentionSpec) -> bool:
    return why_not_hopper(q, k, v, attn_mask, spec) is None


def _descriptor(t: torch.Tensor, block_rows: int, on: bool):
    """A rank-4 descriptor over (B, H, N, D) whose tile is BLOCK rows of one head, or None
    (the kernels then use pointers)."""
    if not on:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, block_rows, t.shape[-1]])


def _strides(t):
    return t.stride(0), t.stride(1), t.stride(2)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tiles_for(step: Step, kernel: str, head_dim: int) -> Tiles:
    return step.tiles[kernel][head_dim][0]


def forward(q, k, v, spec: AttentionSpec, step: Step = FINAL, tiles: Tiles | None = None):
    """O and the base-2 log-sum-exp L of (B, H, N, D) q, k, v with ``step``'s kernel."""
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    t = tiles or tiles_for(step, "forward", D)
    out = output_like(q)                          # as the op's fake says (empty_like(q) did not, for dense BNHD q)
    lse = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
    tma = step.use_tma
    kernel_for(hopper_forward_kernel, q.device)[(_cdiv(n_q, t.block_m) * B * H,)](
        q, k, v, out, lse, _descriptor(q, t.block_m, tma), _descriptor(k, t.block_n, tma),
        _descriptor(v, t.block_n, tma), _descriptor(out, t.block_m, tma),
        *_strides(q), *_strides(k), *_strides(v), *_strides(out), H, n_q, n_k, spec.kernel_args(n_q, n_k)[0][0],
        IS_CAUSAL=spec.is_causal, HEAD_DIM=D, BLOCK_M=t.block_m, BLOCK_N=t.block_n, num_warps=t.num_warps,
        num_stages=t.num_stages, **step.flags())
    return out, lse


def backward(q, k, v, out, lse, grad_out, spec: AttentionSpec, step: Step = FINAL,
                    dkdv_tiles: Tiles | None = None, dq_tiles: Tiles | None = None):
    """(dq, dk, dv) with ``step``'s kernels: D = rowsum(dO ∘ O) by the course's preprocess
    kernel, then the dK/dV pass and the dQ pass."""
    grad_out = grad_out if _addressable(grad_out) else grad_out.contiguous()
    lse = lse.contiguous()
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    delta = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
    rows = 64
    kernel_for(flash_backward_preprocess_kernel, q.device)[(_cdiv(n_q, rows) * B * H,)](
        out, grad_out, delta, *_strides(out), *_strides(grad_out), H, n_q, D, BLOCK_M=rows, BLOCK_D=D)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tma = step.use_tma
    common = dict(IS_CAUSAL=spec.is_causal, HEAD_DIM=D, **step.flags())
    qk_scale = spec.kernel_args(n_q, n_k)[0][0]

    t = dkdv_tiles or tiles_for(step, "dkdv", D)
    kernel_for(hopper_dkdv_kernel, q.device)[(_cdiv(n_k, t.block_n) * B * H,)](
        q, k, v, grad_out, lse, delta, dk, dv,
        _descriptor(q, t.block_m, tma), _descriptor(k, t.block_n, tma), _descriptor(v, t.block_n, tma),
        _descriptor(grad_out, t.block_m, tma), _descriptor(dk, t.block_n, tma), _descriptor(dv, t.block_n, tma),
        *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out), *_strides(dk), *_strides(dv),
        H, n_q, n_k, qk_scale, spec.scale, BLOCK_M=t.block_m, BLOCK_N=t.block_n, num_warps=t.num_warps,
        num_stages=t.num_stages, **common)

    t = dq_tiles or tiles_for(step, "dq", D)
    kernel_for(hopper_dq_kernel, q.device)[(_cdiv(n_q, t.block_m) * B * H,)](
        q, k, v, grad_out, lse, delta, dq,
        _descriptor(q, t.block_m, tma), _descriptor(k, t.block_n, tma), _descriptor(v, t.block_n, tma),
        _descriptor(grad_out, t.block_m, tma), _descriptor(dq, t.block_m, tma),
        *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out), *_strides(dq),
        H, n_q, n_k, qk_scale, spec.scale, BLOCK_M=t.block_m, BLOCK_N=t.block_n, num_warps=t.num_warps,
        num_stages=t.num_stages, **common)
    return dq, dk, dv
