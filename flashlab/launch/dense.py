"""Launching the dense (tiled) kernels of `flashlab.kernels.dense`: grids, strides, and the
autotuned tiles per shape. `forward` and `backward` take the call's `AttentionSpec` and flatten
it into kernel arguments here, at the launch; `flashlab.launch.dispatch` decides when these
kernels run rather than the small path's or the Hopper ones."""

from __future__ import annotations

import functools

import torch

from flashlab.kernels.dense import (
    dropout_mask_kernel,
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_backward_preprocess_kernel,
    flash_forward_kernel,
)

from . import autotune
from .layouts import output_like
from .masks import MaskArgs, row_shared
from .runtime import kernel_for
from .spec import AttentionSpec

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
PREPROCESS_BLOCK = {True: 64, False: 32}   # rows per program of D = rowsum(dO ∘ O): GPU, interpreter


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉. Plain Python: triton.cdiv goes through Triton's JIT call machinery (microseconds
    a call), and small attention calls are launch-bound."""
    return -(-a // b)


def head_dim_args(head_dim: int) -> dict:
    """BLOCK_D, the head dimension padded to a power of two ≥ 16 (tl.dot needs ≥ 16; a mask
    hides the padding), and EVEN_D, whether no padding is needed (unmasked loads on the fast path)."""
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    return {"BLOCK_D": block_d, "EVEN_D": head_dim == block_d}


def rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its last (head) dimension contiguous, as the kernels read it (they take no
    stride for it): ``t`` itself unless a view strides through it, then a copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, row) strides of a (B, H, N, D) tensor whose head dimension is contiguous."""
    return t.stride(0), t.stride(1), t.stride(2)


@functools.cache
def _capability(device: torch.device) -> tuple[int, int] | None:
    """The GPU's compute capability, or None under Triton's interpreter (CPU tensors)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def draw_dropout_seed() -> int:
    """The Philox seed of one dropout call, drawn from torch's default CPU generator, so
    ``torch.manual_seed`` makes flashlab's dropout reproducible."""
    return int(torch.randint(0, 2**31 - 1, ()).item())


def dropout_keep_mask(seed: int, batch: int, heads: int, n_q: int, n_k: int, dropout_p: float,
                      device="cpu") -> torch.Tensor:
    """The boolean (batch, heads, Nq, Nk) keep mask Z that the kernels generate for ``seed``:
    True where an attention weight survives. The kernels never store it; this exists so tests
    (and the notebook) can check dropout exactly: O = (P ∘ Z / (1 − p)) V."""
    keep = torch.empty(batch, heads, n_q, n_k, dtype=torch.uint8, device=device)
    block = 64 if torch.device(device).type == "cuda" else 32   # small grids for the interpreter
    grid = (cdiv(n_q, block), cdiv(n_k, block), batch * heads)
    kernel_for(dropout_mask_kernel, keep.device)[grid](keep, seed, n_q, n_k, dropout_p, BLOCK_M=block, BLOCK_N=block)
    return keep.bool()


def new_lse(batch: int, heads: int, n_q: int, additive_mask: bool, device) -> torch.Tensor:
    """The forward's L, for its kernel to fill: (B, H, Nq) float32; with an additive mask (2, B, H, Nq),
    L, then each row's c = 2^(L − m)/l (`flashlab.kernels.tile.l_fix`), which the backward needs where
    such a mask put a row's max m beyond what L = m + log2 l can hold beside it (finfo(float32).min).
    The kernels, forward and backward, take it as `split_lse` gives it."""
    return torch.empty((2, batch, heads, n_q) if additive_mask else (batch, heads, n_q), dtype=torch.float32,
                       device=device)


def split_lse(lse: torch.Tensor, additive_mask: bool) -> tuple[torch.Tensor, int]:
    """(L, l_fix_offset) for the kernels from `new_lse`'s buffer: with an additive mask, L and how
    many entries after it each row's fix c sits (the forward writes c there, the backward multiplies
    its recomputed P by it); without, L and 0 (never read nor written). A (B, H, Nq) L given to the
    backward beside an additive mask (a caller's own) gets c = 1 beside it, never L's entries read as c."""
    if lse.dim() == 3:
        if not additive_mask:
            return lse, 0
        lse = torch.stack((lse, torch.ones_like(lse)))
    assert lse.is_contiguous(), "the forward's (2, B, H, Nq) L and c are one contiguous buffer"
    return lse[0], lse[0].numel()


def _tuned_launch(kernel, q, k, spec: AttentionSpec, mask: MaskArgs, launch):
    """Runs ``launch(config)`` with the tiles the autotuner picks for this shape (on the first
    call of a shape it tries every candidate, then remembers the fastest). Exact fp32 products
    ("ieee") on a GPU are not tuned: tl.dot then runs without tensor cores, and a tensor-core-sized
    candidate takes minutes to compile; they take `autotune.EXACT_FP32`, small tiles that compile
    in seconds."""
    capability = _capability(q.device)
    exact_fp32 = q.dtype == torch.float32 and spec.precision == "ieee"
    configs = autotune.candidates(kernel, q.shape[-1], capability)
    if exact_fp32 and capability is not None:
        configs = [autotune.EXACT_FP32] + configs        # the rest only if it failed to compile
    windowed = spec.band(q.shape[2], k.shape[2]) is not None
    key = autotune.shape_key(kernel, q, k, spec.is_causal and not windowed, mask.present, spec.dropout_p > 0,
                             window=windowed)
    launch(autotune.tuner.choose(key, configs, launch, tune=not exact_fp32))


def forward(q, k, v, mask: MaskArgs, spec: AttentionSpec, seed: int = 0):
    """O and the base-2 log-sum-exp L (with an additive mask, L stacked with each row's fix:
    `new_lse`) of (B, H, N, D) q, k, v with contiguous rows."""
    B, H, n_q, head_dim = q.shape
    n_k, group = k.shape[2], H // k.shape[1]
    out = output_like(q)                          # O's layout follows q's (see output_like)
    lse = new_lse(B, H, n_q, mask.additive, q.device)
    l_rows, l_fix_offset = split_lse(lse, mask.additive)                             # c's place: tile.l_fix
    scalars, flags = spec.kernel_args(n_q, n_k)
    shared = row_shared(mask)                                        # once, not per tuning candidate

    def launch(config):
        grid = (cdiv(n_q, config.block_m) * B * H,)                  # 1-D: see the kernel
        kernel_for(flash_forward_kernel, q.device)[grid](
            q, k, v, mask.tensor, out, l_rows,
            *strides(q), *strides(k), *strides(v), *mask.strides, *strides(out),
            H, n_q, n_k, head_dim, group,
            *scalars, seed, spec.dropout_p, l_fix_offset,
            HAS_MASK=mask.present, MASK_IS_BOOL=mask.is_bool, MASK_ROW_SHARED=shared, **flags,
            **head_dim_args(head_dim), **config.kwargs())
        return out, lse

    _tuned_launch("forward", q, k, spec, mask, launch)
    return out, lse


def backward(q, k, v, out, lse, grad_out, mask: MaskArgs, spec: AttentionSpec, seed: int = 0, grads=None):
    """The three backward kernels: D = rowsum(dO ∘ O), then the dK/dV pass and the dQ pass.
    Returns (dq, dk, dv); ``lse`` is what the forward returned; every tensor has contiguous rows.
    ``grads``: (dq, dk, dv), tensors shaped as q, k, v with contiguous rows, to write into (views of
    the one buffer of `flashlab.attention_qkvpacked`'s gradient, so no copy gathers them)."""
    lse, l_fix_offset = split_lse(lse, mask.additive)    # the kernels index L as (B·H, Nq) rows
    lse = lse.contiguous()
    B, H, n_q, head_dim = q.shape
    H_kv, n_k = k.shape[1], k.shape[2]
    group = H // H_kv
    dims = head_dim_args(head_dim)
    delta = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
    rows = PREPROCESS_BLOCK[q.device.type == "cuda"]
    kernel_for(flash_backward_preprocess_kernel, q.device)[(cdiv(n_q, rows) * B * H,)](
        out, grad_out, delta, *strides(out), *strides(grad_out), H, n_q, head_dim,
        BLOCK_M=rows, BLOCK_D=dims["BLOCK_D"])
    dq, dk, dv = grads or (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    scalars, flags = spec.kernel_args(n_q, n_k)
    qk_scale, softcap, band_lo, band_hi = scalars
    constants = dict(HAS_MASK=mask.present, MASK_IS_BOOL=mask.is_bool, MASK_ROW_SHARED=row_shared(mask), **flags,
                     **dims)
    inputs = (*strides(q), *strides(k), *strides(v), *mask.strides, *strides(grad_out))
    sizes = (H, n_q, n_k, head_dim, group,
             qk_scale, spec.scale, softcap, band_lo, band_hi, seed, spec.dropout_p, l_fix_offset)

    def launch_dkdv(config):
        kernel_for(flash_backward_dkdv_kernel, q.device)[(cdiv(n_k, config.block_n) * B * H_kv,)](
            q, k, v, mask.tensor, grad_out, lse, delta, dk, dv, *inputs, *strides(dk), *strides(dv), *sizes,
            FAST_PATH=config.fast_path, **constants, **config.kwargs())
        return dk, dv

    def launch_dq(config):
        kernel_for(flash_backward_dq_kernel, q.device)[(cdiv(n_q, config.block_m) * B * H,)](
            q, k, v, mask.tensor, grad_out, lse, delta, dq, *inputs, *strides(dq), *sizes,
            **constants, **config.kwargs())
        return (dq,)

    _tuned_launch("dkdv", q, k, spec, mask, launch_dkdv)
    _tuned_launch("dq", q, k, spec, mask, launch_dq)
    return dq, dk, dv
