"""Attention as the textbook writes it: two ``einsum`` s and a softmax.

    S = (Q · scale) Kᵀ            (…, Nq, Nk)   the score matrix
    P = softmax(S + mask)          (…, Nq, Nk)   one probability row per query
    O = P V                        (…, Nq, Dv)

Every intermediate here is a full Nq × Nk tensor in device memory. That is the cost
FlashAttention removes, and `flashlab.lessons.memory` predicts it byte for byte.
"""

from __future__ import annotations

import torch

from .checks import check_attention_inputs, check_softcap, check_window, default_scale


def causal_keep_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """Boolean (Nq, Nk) mask, True where query i may see key j.

    Aligned top-left like ``torch.nn.functional.scaled_dot_product_attention``: query i
    sees keys 0..i, whatever Nk is (``torch.ones(Nq, Nk).tril()``).
    """
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril()


def window_band(window, is_causal: bool, n_q: int, n_k: int) -> tuple[int, int] | None:
    """The band a ``window=(left, right)`` gives the kernels: query i sees key j iff
    i + band_lo ≤ j ≤ i + band_hi. None when there is no window (None or (−1, −1)).

    The window is aligned as `flashlab.varlen_attention`'s (FlashAttention's): query i sees keys
    i + Nk − Nq − left … i + Nk − Nq + right, −1 unbounded on that side. ``is_causal`` stays
    `flashlab.attention`'s (top-left, j ≤ i, as SDPA's) and applies too: band_hi ≤ 0. The two
    alignments agree when Nq = Nk. Unbounded sides become −Nq and Nk (no row reaches past
    them), which also keeps the numbers inside int32 whatever the window."""
    if window is None or tuple(window) == (-1, -1):
        return None
    left, right = window
    shift = n_k - n_q
    band_lo = max(shift - left, -n_q) if left >= 0 else -n_q
    band_hi = min(shift + right, n_k) if right >= 0 else n_k
    if is_causal:
        band_hi = min(band_hi, 0)
    return band_lo, band_hi


def window_keep_mask(n_queries: int, n_keys: int, is_causal: bool, window, device=None) -> torch.Tensor | None:
    """Boolean (Nq, Nk) mask, True where query i may see key j, for ``is_causal`` and a
    ``window`` together (`window_band`); None when neither restricts anything."""
    band = window_band(window, is_causal, n_queries, n_keys)
    if band is None:
        return causal_keep_mask(n_queries, n_keys, device) if is_causal else None
    rel = torch.arange(n_keys, device=device)[None, :] - torch.arange(n_queries, device=device)[:, None]
    return (rel >= band[0]) & (rel <= band[1])


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    dropout_p: float = 0.0,
    dropout_keep: torch.Tensor | None = None,
    window=None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention, written with ``einsum`` and ``softmax``.

    Args:
        q: queries ``(..., Nq, D)``.
        k: keys ``(..., Nk, D)``.
        v: values ``(..., Nk, Dv)``.
        attn_mask: optional mask broadcastable to ``(..., Nq, Nk)``: boolean (True = this
            key takes part) or float (added to the scores, ``-inf`` removes a key).
        is_causal: query i sees keys ``0..i`` (top-left aligned, as in PyTorch's SDPA).
        scale: softmax temperature, default ``1/sqrt(D)``.
        dropout_p: probability of dropping each weight of P; survivors are scaled by
            1/(1 − p). The mask is drawn with ``torch.nn.functional.dropout`` unless
        dropout_keep: a given boolean keep mask Z (broadcastable to ``(..., Nq, Nk)``) is
            used instead, so a kernel's own dropout can be checked exactly.
        window: ``(left, right)``: query i sees keys i + Nk − Nq − left … i + Nk − Nq + right
            (−1: unbounded), as `flashlab.attention` takes it; with ``is_causal`` both apply.
        softcap: the scores soft-capped before the mask, S ← cap·tanh(S/cap) (Gemma 2's);
            None or 0 for none.

    Returns:
        ``(..., Nq, Dv)`` in the dtype of q. A query row whose every key is masked out
        returns zeros (and zero gradients) rather than NaN.

    Raises:
        ValueError: for mismatched shapes, dtypes or devices, naming the argument.
    """
    check_attention_inputs(q, k, v, attn_mask, is_causal, scale)
    check_window(window)
    softcap = check_softcap(softcap)
    return naive_attention_unchecked(q, k, v, attn_mask, is_causal, scale, dropout_p=dropout_p,
                                     dropout_keep=dropout_keep, window=window, softcap=softcap)


def soft_cap(scores: torch.Tensor, softcap) -> torch.Tensor:
    """S ← cap·tanh(S / cap), Gemma 2's soft-capping of the logits, applied before any mask; S itself
    where ``softcap`` is None or 0. The PyTorch paths take it from here; the kernels from
    `flashlab.kernels.tile.soft_cap`."""
    return softcap * torch.tanh(scores / softcap) if softcap else scores


def naive_attention_unchecked(q, k, v, attn_mask=None, is_causal=False, scale=None, *, dropout_p=0.0,
                              dropout_keep=None, window=None, softcap=0.0):
    """`naive_attention` for callers that validated the inputs already (`flashlab.attention`).
    Here ``attn_mask`` and ``is_causal`` may come together: both apply."""
    head_dim = q.shape[-1]
    if scale is None and isinstance(head_dim, torch.Tensor):
        scale = head_dim.to(q.dtype).rsqrt()     # torch.jit.trace: 1/sqrt(D) from the traced size, not a constant
    else:
        scale = default_scale(head_dim, scale)
    n_queries, n_keys = q.shape[-2], k.shape[-2]

    # S = (Q·scale) Kᵀ. Scaling Q (N×D) instead of S (N×N) saves a whole N×N tensor.
    scores = torch.einsum("...id,...jd->...ij", q * scale, k)
    scores = soft_cap(scores, softcap)                           # S ← cap·tanh(S / cap), before the mask

    keep = window_keep_mask(n_queries, n_keys, is_causal, window, q.device)   # causal and/or the window
    if keep is not None:
        if attn_mask is None:
            attn_mask = keep
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & keep
        else:
            attn_mask = attn_mask.masked_fill(~keep, float("-inf"))
    empty_rows = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
        # A row with no key left would be softmax(-inf, …, -inf) = 0/0 = NaN. Give it
        # finite scores so softmax and its backward stay finite, then zero it below.
        # (No `if empty_rows.any()`: a data-dependent branch would break torch.compile's graph.)
        empty_rows = torch.isneginf(scores).all(dim=-1, keepdim=True)
        scores = scores.masked_fill(empty_rows, 0.0)

    # P = softmax(S): rebinding `scores` lets S be freed as soon as P exists.
    scores = torch.softmax(scores, dim=-1)
    if empty_rows is not None:
        scores = scores.masked_fill(empty_rows, 0.0)
    if dropout_keep is not None:
        scores = scores * dropout_keep / (1.0 - dropout_p)       # P ∘ Z / (1 − p)
    elif dropout_p > 0:
        scores = torch.nn.functional.dropout(scores, dropout_p)

    # O = P V
    return torch.einsum("...ij,...jd->...id", scores, v)
