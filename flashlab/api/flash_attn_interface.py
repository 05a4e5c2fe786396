"""FlashAttention 2's Python interface (``flash_attn.flash_attn_interface``) on flashlab's kernels:
the same function names, argument names and order, defaults, layouts and return values, so porting
code is changing its import:

    from flashlab.flash_attn_interface import flash_attn_func, flash_attn_with_kvcache

- `flash_attn_func`, `flash_attn_qkvpacked_func`, `flash_attn_kvpacked_func`: ``(batch, seqlen, nheads,
  headdim)`` tensors, through `flashlab.attention` (`flashlab.attention_qkvpacked` for the packed form).
- `flash_attn_varlen_func` (and its ``qkvpacked``/``kvpacked`` forms): packed sequences with
  ``cu_seqlens``, through `flashlab.varlen_attention`.
- `flash_attn_with_kvcache`: decoding against a KV cache (contiguous or paged), appending the new
  ``k``/``v`` into the cache first, through `flashlab.decode_attention`.

FlashAttention's conventions, which differ from SDPA's and are kept here: ``causal`` is aligned
to the bottom right of the score matrix (query i of Nq sees keys j ≤ i + Nk − Nq), ``window_size``
``(left, right)`` is aligned the same way (−1 unbounded), ``softcap=0.0`` means none, and a row
with no key gives zeros. An argument flashlab does not implement (ALiBi slopes, rotary embedding,
``cache_leftpad``, dropout in the varlen path…) raises ``NotImplementedError`` naming it,
never a silently different result.

The log-sum-exp that ``return_attn_probs=True`` returns is computed in PyTorch beside the kernels
(an Nq × Nk score matrix per head, in fp32): FlashAttention documents the option as "for testing
only", and so is it here. ``flash_attn_with_kvcache(return_softmax_lse=True)`` returns the kernels' own.
"""

from __future__ import annotations

import torch

from flashlab.reference.checks import default_scale
from flashlab.reference.naive import soft_cap, window_keep_mask

from .attention import attention, attention_qkvpacked

UNBOUNDED = (-1, -1)


def _unsupported(argument: str, value, why: str) -> None:
    raise NotImplementedError(f"{argument}={value!r}: {why} Leave it at FlashAttention's default to use flashlab.")


def _check_not_given(**arguments) -> None:
    """FlashAttention arguments flashlab has no implementation of: None (their default) or raise."""
    for name, value in arguments.items():
        if value is not None:
            _unsupported(name, "<tensor>" if isinstance(value, torch.Tensor) else value,
                         f"flashlab does not implement {name}.")


def _window(causal: bool, window_size) -> tuple[int, int] | None:
    """FlashAttention's causal flag and window as one bottom-right-aligned band for `flashlab.attention`'s
    ``window`` (query i sees keys i + Nk − Nq − left … i + Nk − Nq + right): causal is right = 0,
    as FlashAttention sets it. None: every key."""
    left, right = (int(w) for w in window_size)
    if causal:
        right = 0
    return None if (left, right) == UNBOUNDED else (left, right)


def _softcap(softcap) -> float | None:
    return None if softcap is None or softcap == 0.0 else softcap


def _lse_in_pytorch(q, k, scale, window, softcap) -> torch.Tensor:
    """The natural-log log-sum-exp of each row of cap(Q Kᵀ·scale), hidden keys left out:
    (B, H, Nq) fp32 from FlashAttention-layout (B, N, H, D) q and k (GQA: kv heads repeated);
    −inf for a row with no key. For ``return_attn_probs`` (testing only)."""
    with torch.no_grad():
        qf, kf = q.float().transpose(1, 2), k.float().transpose(1, 2)
        kf = kf.repeat_interleave(qf.shape[1] // kf.shape[1], dim=1)
        scores = qf @ kf.transpose(-1, -2) * default_scale(q.shape[-1], scale)
        scores = soft_cap(scores, softcap)
        keep = window_keep_mask(q.shape[1], k.shape[1], False, window, q.device)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        return torch.logsumexp(scores, dim=-1)


def _with_probs(out, lse, return_attn_probs: bool, dropout_p: float):
    """FlashAttention's return: out, or (out, softmax_lse, S_dmask). S_dmask is None: FlashAttention
    too returns the probabilities only with dropout, and flashlab never materialises them."""
    if not return_attn_probs:
        return out
    if dropout_p > 0:
        _unsupported("return_attn_probs", True, "with dropout_p > 0 FlashAttention returns the dropout pattern, "
                     "which flashlab's kernels regenerate and never store.")
    return out, lse(), None


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """FlashAttention's ``flash_attn_func``: q ``(batch, seqlen_q, nheads, headdim)``, k and v
    ``(batch, seqlen_k, nheads_k, headdim)`` with nheads_k dividing nheads (MQA/GQA); causal and the
    window aligned to the bottom right. Returns ``(batch, seqlen_q, nheads, headdim)``, or with
    ``return_attn_probs`` (out, softmax_lse ``(batch, nheads, seqlen_q)``, None). Differentiable.
    ``deterministic`` is accepted either way: flashlab's backward has no atomics, it always is."""
    _check_not_given(alibi_slopes=alibi_slopes)
    window, cap = _window(causal, window_size), _softcap(softcap)
    out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p,
                    scale=softmax_scale, enable_gqa=True, window=window, softcap=cap).transpose(1, 2)
    return _with_probs(out, lambda: _lse_in_pytorch(q, k, softmax_scale, window, cap), return_attn_probs, dropout_p)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """FlashAttention's ``flash_attn_qkvpacked_func``: qkv ``(batch, seqlen, 3, nheads, headdim)``, its
    gradient written in that layout (`flashlab.attention_qkvpacked`). Returns
    ``(batch, seqlen, nheads, headdim)`` (and the log-sum-exp, None with ``return_attn_probs``)."""
    _check_not_given(alibi_slopes=alibi_slopes)
    window, cap = _window(causal, window_size), _softcap(softcap)
    if (window is not None and not (causal and window == (-1, 0))) or cap:   # the packed op has neither: three views
        return flash_attn_func(*qkv.unbind(2), dropout_p, softmax_scale, causal, window_size, softcap,
                               return_attn_probs=return_attn_probs)
    out = attention_qkvpacked(qkv, dropout_p=dropout_p, is_causal=causal, scale=softmax_scale)
    return _with_probs(out, lambda: _lse_in_pytorch(qkv[:, :, 0], qkv[:, :, 1], softmax_scale, window, None),
                       return_attn_probs, dropout_p)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                             alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """FlashAttention's ``flash_attn_kvpacked_func``: kv ``(batch, seqlen_k, 2, nheads_k, headdim)``, k and v
    stacked; otherwise `flash_attn_func` (on the two views of kv)."""
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """FlashAttention's ``flash_attn_varlen_func``: q ``(total_q, nheads, headdim)``, k and v
    ``(total_k, nheads_k, headdim)``, int32 ``cu_seqlens`` (`flashlab.varlen_attention`). Returns
    ``(total_q, nheads, headdim)``, or with ``return_attn_probs`` (out, softmax_lse
    ``(nheads, total_q)``, None). Differentiable. No dropout and no paged keys (``block_table``) here."""
    _check_not_given(alibi_slopes=alibi_slopes, block_table=block_table)
    if dropout_p:
        _unsupported("dropout_p", dropout_p, "flashlab's varlen kernels have no dropout (pass 0.0 in evaluation, "
                     "or pad the batch and use flash_attn_func).")
    from .varlen import varlen_attention
    cap = _softcap(softcap)
    out = varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=causal,
                           scale=softmax_scale, window=tuple(window_size), softcap=cap)

    def lse():
        rows = []
        bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        window = _window(causal, window_size)
        for b in range(len(bounds_q) - 1):
            qb, kb = q[None, bounds_q[b]:bounds_q[b + 1]], k[None, bounds_k[b]:bounds_k[b + 1]]
            rows.append(_lse_in_pytorch(qb, kb, softmax_scale, window, cap)[0])
        return torch.cat(rows, dim=-1) if rows else q.new_empty(q.shape[1], 0, dtype=torch.float32)

    return _with_probs(out, lse, return_attn_probs, dropout_p)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """FlashAttention's ``flash_attn_varlen_qkvpacked_func``: qkv ``(total, 3, nheads, headdim)``; otherwise
    `flash_attn_varlen_func` (on the three views of qkv)."""
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """FlashAttention's ``flash_attn_varlen_kvpacked_func``: kv ``(total_k, 2, nheads_k, headdim)``; otherwise
    `flash_attn_varlen_func` (on the two views of kv)."""
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """FlashAttention's ``flash_attn_with_kvcache`` (`flashlab.decode_attention`).

    If ``k`` and ``v`` ``(batch, seqlen_new, nheads_k, headdim)`` are given, they are written into
    ``k_cache``/``v_cache`` *in place* at positions cache_seqlens[b] … cache_seqlens[b] + seqlen_new − 1
    of each sequence (through ``block_table`` when paged), and attention runs over the grown cache;
    ``cache_seqlens`` itself is not changed (the caller advances it, as with FlashAttention). The
    write is tensor indexing, no host synchronisation: a step captures in a CUDA graph.

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``.
        k_cache, v_cache: ``(batch_cache, seqlen_cache, nheads_k, headdim)``, or paged
            ``(num_blocks, page_block_size, nheads_k, headdim)`` with ``block_table``.
        cache_seqlens: an int, or an int32 ``(batch,)`` tensor: tokens already cached per sequence.
            None: the whole cache.
        cache_batch_idx: int32 ``(batch,)``: which row of a contiguous cache each sequence uses (read
            as a one-page-per-sequence block table: no copy of the cache).
        block_table: int32 ``(batch, max_blocks)`` for a paged cache.
        softmax_scale, causal, window_size, softcap, num_splits (0: chosen), return_softmax_lse: FlashAttention's.
        rotary_cos/rotary_sin, cache_leftpad, alibi_slopes: not implemented.

    Returns:
        ``(batch, seqlen_q, nheads, headdim)``, and with ``return_softmax_lse`` the log-sum-exp
        ``(batch, nheads, seqlen_q)`` fp32. Inference only, as FlashAttention's.
    """
    from .decode import decode_attention
    _check_not_given(rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_leftpad=cache_leftpad,
                     alibi_slopes=alibi_slopes)
    if (k is None) != (v is None):
        raise ValueError(f"{'v' if k is not None else 'k'}: k and v are appended to the cache together. "
                         "Pass both new tensors, or neither.")
    if cache_batch_idx is not None and block_table is not None:
        raise ValueError("cache_batch_idx: a paged cache (block_table) cannot also take cache_batch_idx, as in "
                         "FlashAttention. Put the rows you want in block_table instead.")
    batch = q.shape[0]
    if cache_seqlens is None:
        capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
        cache_seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    if cache_batch_idx is not None:
        if not (isinstance(cache_batch_idx, torch.Tensor) and cache_batch_idx.shape == (batch,)
                and not cache_batch_idx.is_floating_point()):
            raise ValueError(f"cache_batch_idx: expected an integer tensor of shape ({batch},), got "
                             f"{getattr(cache_batch_idx, 'dtype', type(cache_batch_idx).__name__)} "
                             f"{tuple(getattr(cache_batch_idx, 'shape', ()))}. One cache row per sequence.")
        # a contiguous cache row is one page of seqlen_cache tokens: the kernels' paged path reads it
        block_table = cache_batch_idx.to(torch.int32).reshape(batch, 1)
    if k is not None:
        _append(k_cache, v_cache, k, v, cache_seqlens, block_table)
        cache_seqlens = cache_seqlens + k.shape[1]
    window = tuple(window_size)
    return decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=block_table, num_splits=num_splits,
                            scale=softmax_scale, causal=causal, window=None if window == UNBOUNDED else window,
                            softcap=_softcap(softcap),
                            return_lse=return_softmax_lse)


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table) -> None:
    """Writes the new tokens k[b, i], v[b, i] at position cache_seqlens[b] + i of sequence b: row
    (b, position) of a contiguous cache, or (block_table[b, position // page], position % page) of
    a paged one. One indexed write per tensor, computed on the device (no value read back)."""
    for name, new, cache in (("k", k, k_cache), ("v", v, v_cache)):
        if not isinstance(new, torch.Tensor) or new.dim() != 4 or new.shape[0] != cache_seqlens.shape[0] or \
                new.shape[2:] != cache.shape[2:]:
            raise ValueError(f"{name}: expected (batch={cache_seqlens.shape[0]}, seqlen_new, "
                             f"nheads_k={cache.shape[2]}, headdim={cache.shape[3]}), got "
                             f"{tuple(getattr(new, 'shape', ()))}. The new tokens of every sequence, "
                             f"laid out as the cache's rows.")
    if k.shape != v.shape:
        raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}. One row each per new token.")
    positions = cache_seqlens.to(torch.int64)[:, None] + torch.arange(k.shape[1], device=k.device)   # (B, new)
    if block_table is None:
        rows = (torch.arange(k.shape[0], device=k.device)[:, None].expand_as(positions), positions)
    else:
        page = k_cache.shape[1]
        pages = positions // page
        blocks = block_table.to(torch.int64).gather(1, pages)      # past the table: an index error, no write
        rows = (blocks, positions % page)
    k_cache.index_put_(rows, k.to(k_cache.dtype))
    v_cache.index_put_(rows, v.to(v_cache.dtype))
