"""Exercise 01: attention from einsum (notebook 01_naive_attention).

Implement scaled dot-product attention the way the paper writes it:

    S = Q Kᵀ · scale,   P = softmax(S) row by row,   O = P V

Test: ``make test-ex EX=01`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex01_naive_attention.py``)
"""

import torch


def attention_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Return S = (q @ kᵀ) · scale.

    Args:
        q: ``(..., Nq, D)``; k: ``(..., Nk, D)``; scale: a positive float.
    Returns:
        ``(..., Nq, Nk)`` in q's dtype. Use ``torch.einsum``.
    """
    raise NotImplementedError


def causal_mask(n_queries: int, n_keys: int) -> torch.Tensor:
    """Return a boolean ``(n_queries, n_keys)`` tensor, True where query i may attend to
    key j. Aligned like ``torch.nn.functional.scaled_dot_product_attention``: query i
    sees keys 0..i (top-left), also when n_queries != n_keys.
    """
    raise NotImplementedError


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Return softmax(q kᵀ · scale [+ causal mask]) v.

    Args:
        q: ``(..., Nq, D)``; k: ``(..., Nk, D)``; v: ``(..., Nk, Dv)``.
        is_causal: mask out keys j > i with -inf before the softmax (use `causal_mask`).
        scale: default ``1/sqrt(D)``.
    Returns:
        ``(..., Nq, Dv)`` in q's dtype, differentiable with autograd.
    """
    raise NotImplementedError
