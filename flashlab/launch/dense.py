"""Launching flashlab's Triton kernels: grids, strides, masks as the kernels read them, and the
autotuned configuration per shape. `flash_forward` and `flash_backward` are the two entry
points; `flashlab.api.attention` builds the public API on them."""

from __future__ import annotations

import functools

import torch

from flashlab.kernels.dense import (
    LOG2E,
    dropout_mask_kernel,
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_backward_preprocess_kernel,
    flash_forward_kernel,
    mask_row_shared,
)
from flashlab.reference.naive import window_band

from . import autotune
from . import hopper as flash_hopper_launch
from . import small as flash_small
from .layouts import output_like
from .runtime import kernel_for

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def _cdiv(a: int, b: int) -> int:
    """⌈a / b⌉. Plain Python: triton.cdiv goes through Triton's JIT call machinery (about 7 µs
    a call on this course's CPU), and small attention calls are launch-bound."""
    return -(-a // b)


def _head_dim_args(head_dim: int) -> dict:
    """BLOCK_D, the head dimension padded to a power of two ≥ 16 (tl.dot needs ≥ 16; a mask
    hides the padding), and EVEN_D, whether no padding is needed (unmasked loads on the fast path)."""
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    return {"BLOCK_D": block_d, "EVEN_D": head_dim == block_d}


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its last (head) dimension contiguous, as the kernels read it (they take no
    stride for it): ``t`` itself unless a view strides through it, then a copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, row) strides of a (B, H, N, D) tensor whose head dimension is contiguous."""
    return t.stride(0), t.stride(1), t.stride(2)


@functools.cache
def _capability(device: torch.device) -> tuple[int, int] | None:
    """The GPU's compute capability, or None under Triton's interpreter (CPU tensors)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


PREPROCESS_BLOCK = {True: 64, False: 32}   # rows per program of D = rowsum(dO ∘ O): GPU, interpreter


def _mask_args(attn_mask, q, k):
    """The mask as the kernels read it: expanded (stride 0, no copy) to (B, H, Nq, Nk)."""
    B, H, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if attn_mask is None:
        return q, (0, 0, 0, 0), False, False  # any pointer: HAS_MASK=False never reads it
    mask = attn_mask.expand(B, H, n_q, n_k)
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)  # same bytes; Triton reads uint8 more portably than i1
    return mask, mask.stride(), True, attn_mask.dtype == torch.bool


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
    grid = (_cdiv(n_q, block), _cdiv(n_k, block), batch * heads)
    kernel_for(dropout_mask_kernel, keep.device)[grid](keep, seed, n_q, n_k, dropout_p, BLOCK_M=block, BLOCK_N=block)
    return keep.bool()


def _band_args(window, is_causal, n_q, n_k) -> tuple[bool, dict, tuple[int, int]]:
    """(IS_CAUSAL, {HAS_WINDOW}, (band_lo, band_hi)) as the kernels take them. With a window the
    causal mask is folded into the band (`flashlab.reference.naive.window_band`), so the kernels have one
    rule for which keys a query sees, and their loops visit only the band's tiles."""
    band = window_band(window, is_causal, n_q, n_k)
    if band is None:
        return is_causal, {"HAS_WINDOW": False}, (0, 0)
    return False, {"HAS_WINDOW": True}, band


def _tuned_launch(kernel, q, k, is_causal, has_mask, dropout, launch, input_precision="tf32", window=False):
    """Runs ``launch(config)`` with the configuration the autotuner picks for this shape
    (on the first call of a shape it tries every candidate, then remembers the fastest).
    Exact fp32 products ("ieee") on a GPU are not tuned: tl.dot then runs without tensor cores,
    and a tensor-core-sized candidate took about 100 s to compile on an H200 (D = 96, measured);
    they take `autotune.EXACT_FP32`, small tiles that compile in seconds (see its comment)."""
    capability = _capability(q.device)
    exact_fp32 = q.dtype == torch.float32 and input_precision == "ieee"
    configs = autotune.candidates(kernel, q.shape[-1], capability)
    if exact_fp32 and capability is not None:
        configs = [autotune.EXACT_FP32] + configs        # the rest only if it failed to compile
    key = autotune.shape_key(kernel, q, k, is_causal, has_mask, dropout, window=window)
    tune = not exact_fp32
    launch(autotune.tuner.choose(key, configs, launch, tune=tune))


def _takes_small_path(q, k, window) -> bool:
    """Whether a call goes to `flash_small`: checked before the Hopper kernels, since one key tile
    beats their 128-row tiles at short N. Not with a window, and not while a test forces the
    general kernels' configurations (`autotune.force`)."""
    return window is None and not autotune.forcing() and \
        flash_small.applies(q.shape[2], k.shape[2], q.shape[3], q.dtype, q.device.type)


def flash_forward(q, k, v, attn_mask, dropout_p, seed, is_causal, scale, input_precision, window=None):
    """The forward kernel alone: returns O and the base-2 log-sum-exp L (what the backward needs;
    with a float mask, L stacked with each row's fix: `flash_small.new_lse`).
    ``window``: None or ``(left, right)`` as `flashlab.attention` takes it. On a Hopper GPU the
    common case goes to `flash_hopper_launch` (same L); sequences that fit one key tile go to
    `flash_small` on every device, before the Hopper check (neither takes a window)."""
    if window is not None and tuple(window) == (-1, -1):
        window = None
    small = _takes_small_path(q, k, window)
    if not small and window is None and q.device.type == "cuda" and \
            flash_hopper_launch.use_hopper(q, k, v, attn_mask, dropout_p, scale):
        return flash_hopper_launch.hopper_forward(q, k, v, is_causal, scale)
    q, k, v = _rows_contiguous(q), _rows_contiguous(k), _rows_contiguous(v)
    B, H, n_q, head_dim = q.shape
    n_k, group = k.shape[2], H // k.shape[1]
    mask, mask_strides, has_mask, mask_is_bool = _mask_args(attn_mask, q, k)
    if small:                                                                             # one key tile
        return flash_small.small_forward(q, k, v, mask, mask_strides, has_mask, mask_is_bool, dropout_p, seed,
                                         is_causal, scale, input_precision)
    out = output_like(q)                          # O's layout follows q's (see output_like)
    float_mask = has_mask and not mask_is_bool
    lse = flash_small.new_lse(B, H, n_q, float_mask, q.device)
    l_rows, l_fix_offset = flash_small.split_lse(lse, float_mask)                     # c's place: _l_fix
    is_causal, has_window, band = _band_args(window, is_causal, n_q, n_k)
    row_shared = mask_row_shared(mask_strides, has_mask)                 # once, not per tuning candidate

    def launch(config):
        grid = (_cdiv(n_q, config.block_m) * B * H,)         # 1-D: see the kernel
        kernel_for(flash_forward_kernel, q.device)[grid](
            q, k, v, mask, out, l_rows, *_strides(q), *_strides(k), *_strides(v), *mask_strides, *_strides(out),
            H, n_q, n_k, head_dim, group, scale * LOG2E, seed, dropout_p, *band, l_fix_offset,
            IS_CAUSAL=is_causal, HAS_MASK=has_mask, MASK_IS_BOOL=mask_is_bool, DROPOUT=dropout_p > 0,
            MASK_ROW_SHARED=row_shared, INPUT_PRECISION=input_precision, **has_window, **_head_dim_args(head_dim),
            **config.kwargs())
        return out, lse

    _tuned_launch("forward", q, k, is_causal, has_mask, dropout_p > 0, launch, input_precision,
                  has_window["HAS_WINDOW"])
    return out, lse


def flash_backward(q, k, v, out, lse, grad_out, attn_mask, dropout_p, seed, is_causal, scale, input_precision,
                   window=None, grads=None):
    """The three backward kernels: D = rowsum(dO ∘ O), then the dK/dV pass and the dQ pass.
    Returns (dq, dk, dv). ``lse`` is what the forward returned.
    On a Hopper GPU the common case goes to `flash_hopper_launch`; short sequences go to
    `flash_small` on every device, before the Hopper check (neither takes a window).
    ``grads``: (dq, dk, dv), tensors shaped as q, k, v with contiguous rows, for the kernels to
    write into (views of the one buffer of `flashlab.attention_qkvpacked`'s gradient, so no copy
    gathers them); q, k, v must then have contiguous rows too. The Hopper kernels (TMA
    descriptors of their own tensors) write theirs, copied in."""
    if window is not None and tuple(window) == (-1, -1):
        window = None
    small = _takes_small_path(q, k, window)
    if not small and window is None and q.device.type == "cuda" and \
            flash_hopper_launch.use_hopper(q, k, v, attn_mask, dropout_p, scale):
        result = flash_hopper_launch.hopper_backward(q, k, v, out, lse, grad_out, is_causal, scale)
        return result if grads is None else tuple(g.copy_(r) for g, r in zip(grads, result))
    q, k, v, out, grad_out = (_rows_contiguous(t) for t in (q, k, v, out, grad_out))
    mask, mask_strides, has_mask, mask_is_bool = _mask_args(attn_mask, q, k)
    if small:                                                                            # one launch
        return flash_small.small_backward(q, k, v, out, lse, grad_out, mask, mask_strides, has_mask, mask_is_bool,
                                          dropout_p, seed, is_causal, scale, input_precision, grads)
    # a float mask's row fix c sits l_fix_offset entries after L; the kernels index L as (B·H, Nq) rows
    lse, l_fix_offset = flash_small.split_lse(lse, has_mask and not mask_is_bool)
    lse = lse.contiguous()
    B, H, n_q, head_dim = q.shape
    H_kv, n_k = k.shape[1], k.shape[2]
    group = H // H_kv
    head_dim_args = _head_dim_args(head_dim)
    delta = torch.empty(B, H, n_q, dtype=torch.float32, device=q.device)
    rows = PREPROCESS_BLOCK[q.device.type == "cuda"]
    kernel_for(flash_backward_preprocess_kernel, q.device)[(_cdiv(n_q, rows) * B * H,)](
        out, grad_out, delta, *_strides(out), *_strides(grad_out), H, n_q, head_dim,
        BLOCK_M=rows, BLOCK_D=head_dim_args["BLOCK_D"])
    dq, dk, dv = grads or (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    is_causal, has_window, band = _band_args(window, is_causal, n_q, n_k)
    common = dict(IS_CAUSAL=is_causal, HAS_MASK=has_mask, MASK_IS_BOOL=mask_is_bool,
                  MASK_ROW_SHARED=mask_row_shared(mask_strides, has_mask),
                  DROPOUT=dropout_p > 0, INPUT_PRECISION=input_precision, **has_window, **head_dim_args)
    inputs = (*_strides(q), *_strides(k), *_strides(v), *mask_strides, *_strides(grad_out))
    sizes = (H, n_q, n_k, head_dim, group, scale * LOG2E, scale, seed, dropout_p, *band, l_fix_offset)

    def launch_dkdv(config):
        kernel_for(flash_backward_dkdv_kernel, q.device)[(_cdiv(n_k, config.block_n) * B * H_kv,)](
            q, k, v, mask, grad_out, lse, delta, dk, dv, *inputs, *_strides(dk), *_strides(dv), *sizes,
            FAST_PATH=config.fast_path, **common, **config.kwargs())
        return dk, dv

    def launch_dq(config):
        kernel_for(flash_backward_dq_kernel, q.device)[(_cdiv(n_q, config.block_m) * B * H,)](
            q, k, v, mask, grad_out, lse, delta, dq, *inputs, *_strides(dq), *sizes,
            **common, **config.kwargs())
        return (dq,)

    dropout = dropout_p > 0
    windowed = has_window["HAS_WINDOW"]
    _tuned_launch("dkdv", q, k, is_causal, has_mask, dropout, launch_dkdv, input_precision, windowed)
    _tuned_launch("dq", q, k, is_causal, has_mask, dropout, launch_dq, input_precision, windowed)
    return dq, dk, dv
