"""Exercise 01, reference answer: attention from einsum."""

import torch


def attention_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Return S = (q @ kᵀ) · scale."""
    # S_ij = scale · Σ_d q_id k_jd
    return torch.einsum("...id,...jd->...ij", q, k) * scale


def causal_mask(n_queries: int, n_keys: int) -> torch.Tensor:
    """True where query i may attend to key j (j <= i, top-left aligned)."""
    return torch.ones(n_queries, n_keys, dtype=torch.bool).tril()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Return softmax(q kᵀ · scale [+ causal mask]) v."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = attention_scores(q, k, scale)
    if is_causal:
        keep = causal_mask(q.shape[-2], k.shape[-2]).to(q.device)
        scores = scores.masked_fill(~keep, float("-inf"))
    # P_ij = exp(S_ij) / Σ_j' exp(S_ij')
    probabilities = torch.softmax(scores, dim=-1)
    # O_i = Σ_j P_ij v_j
    return torch.einsum("...ij,...jd->...id", probabilities, v)
