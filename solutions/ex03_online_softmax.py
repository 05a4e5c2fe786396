"""Exercise 03, reference answer: online-softmax update and merge."""

import torch


def _shift(m):
    # where the max is −inf, subtract 0 so that exp(−inf − 0) = 0 instead of exp(NaN)
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def update(m: torch.Tensor, l: torch.Tensor, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: E741
    """Fold a block of columns into the state (m, l)."""
    m_new = torch.maximum(m, block.amax(dim=-1))
    s = _shift(m_new)
    return m_new, l * torch.exp(m - s) + torch.exp(block - s[..., None]).sum(dim=-1)


def merge(m_a: torch.Tensor, l_a: torch.Tensor, m_b: torch.Tensor,
          l_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine the states of two disjoint sets of columns."""
    m = torch.maximum(m_a, m_b)
    s = _shift(m)
    return m, l_a * torch.exp(m_a - s) + l_b * torch.exp(m_b - s)
