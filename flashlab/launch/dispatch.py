"""Which kernels a call runs: the small path's, the Hopper ones, or the dense (tiled) ones.

    short sequences (every key in one tile, no window)      → `flashlab.launch.small`
    sm_90, the Gluon forward's case (FLASHLAB_GLUON)          → `flashlab.launch.gluon` (forward only)
    sm_90, fp16/bf16, D = 64/128, no mask/dropout/window/cap → `flashlab.launch.hopper`
    everything else                                          → `flashlab.launch.dense`

The small path is checked first: at short N one key tile beats the Hopper kernels' 128-row
tiles. Either forward's log-sum-exp is the others' (base 2, same layout), so any backward can
follow any forward; `forward` and `backward` decide the same way for the same call.
"""

from __future__ import annotations

from . import autotune, dense, gluon, hopper, small
from .masks import mask_args
from .spec import AttentionSpec


def takes_small_path(q, k, spec: AttentionSpec) -> bool:
    """Whether a call goes to the small path: not with a window, and not while a test forces the
    dense kernels' configurations (`autotune.force`)."""
    return spec.window is None and not autotune.forcing() and \
        small.applies(q.shape[2], k.shape[2], q.shape[3], q.dtype)


def _takes_hopper(q, k, v, attn_mask, spec: AttentionSpec) -> bool:
    return q.device.type == "cuda" and hopper.use_hopper(q, k, v, attn_mask, spec)


def forward(q, k, v, attn_mask, spec: AttentionSpec, seed: int = 0):
    """O and the base-2 log-sum-exp L of (B, H, N, D) q, k, v (with an additive mask, L stacked
    with each row's fix: `dense.new_lse`)."""
    is_small = takes_small_path(q, k, spec)
    if not is_small and q.device.type == "cuda" and gluon.use_gluon(q, k, v, attn_mask, spec):
        return gluon.forward(q, k, v, spec)
    if not is_small and _takes_hopper(q, k, v, attn_mask, spec):
        return hopper.forward(q, k, v, spec)
    q, k, v = dense.rows_contiguous(q), dense.rows_contiguous(k), dense.rows_contiguous(v)
    mask = mask_args(attn_mask, q, k)
    if is_small:
        return small.forward(q, k, v, mask, spec, seed)
    return dense.forward(q, k, v, mask, spec, seed)


def backward(q, k, v, out, lse, grad_out, attn_mask, spec: AttentionSpec, seed: int = 0, grads=None):
    """(dq, dk, dv), by the family `forward` took for this call. ``grads``: (dq, dk, dv) to write
    into, shaped as q, k, v with contiguous rows (q, k, v must then have contiguous rows too); the
    Hopper kernels write their own and these are copied in."""
    is_small = takes_small_path(q, k, spec)
    if not is_small and _takes_hopper(q, k, v, attn_mask, spec):
        result = hopper.backward(q, k, v, out, lse, grad_out, spec)
        return result if grads is None else tuple(g.copy_(r) for g, r in zip(grads, result))
    q, k, v, out, grad_out = (dense.rows_contiguous(t) for t in (q, k, v, out, grad_out))
    mask = mask_args(attn_mask, q, k)
    family = small if is_small else dense
    return family.backward(q, k, v, out, lse, grad_out, mask, spec, seed, grads)
