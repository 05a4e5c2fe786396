"""Exercise 03: the online-softmax state update and merge (notebook 03).

The state of a set of rows is a pair of tensors (m, l), one entry per row:
m = running max, l = Σ exp(x − m) over the columns seen so far. The empty state is
m = −inf, l = 0.

Test: ``make test-ex EX=03`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex03_online_softmax.py``)
"""

import torch


def update(m: torch.Tensor, l: torch.Tensor, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: E741
    """Fold a block of columns ``block (..., n)`` into the state ``(m, l)`` (each ``(...)``).

    m' = max(m, max_j block_j);  l' = l·exp(m − m') + Σ_j exp(block_j − m').
    Must stay finite (no NaN) when m' is −inf (every value seen so far is −inf).
    """
    raise NotImplementedError


def merge(m_a: torch.Tensor, l_a: torch.Tensor, m_b: torch.Tensor,
          l_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine the states of two disjoint sets of columns of the same rows.

    m = max(m_a, m_b);  l = l_a·exp(m_a − m) + l_b·exp(m_b − m). No NaN when both are empty.
    """
    raise NotImplementedError
