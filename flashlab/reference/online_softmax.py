"""Online softmax: the softmax of a row computed in one streaming pass over its blocks.

The softmax of a row x needs its maximum (for stability) and the sum of exponentials:

    softmax(x)_j = exp(x_j − m) / l,    m = max_j x_j,    l = Σ_j exp(x_j − m).

Reading x block by block, keep a *state* (m, l) for the part seen so far. A new block b
updates it with

    m' = max(m, max(b))
    l' = l · exp(m − m') + Σ_j exp(b_j − m')

The factor exp(m − m') rescales the old sum to the new maximum. Two states of disjoint
parts combine with the *merge*

    m = max(m_a, m_b),    l = l_a · exp(m_a − m) + l_b · exp(m_b − m),

which is associative and commutative: any split of a row into parts, merged in any
grouping, gives the same (m, l). That is what lets FlashAttention tile the keys, and
split-KV kernels process parts of a row on different processors.

−inf entries (masked scores) are allowed, also rows with nothing but −inf: their state
stays (m, l) = (−inf, 0) and their softmax is defined as all zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SoftmaxState:
    """Streaming statistics of the rows seen so far: running max ``m`` and running sum
    ``l = Σ exp(x − m)``, each with one entry per row (shape ``x.shape[:-1]``)."""

    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 - the paper's name

    @property
    def logsumexp(self) -> torch.Tensor:
        """log Σ exp(x) = m + log l (−inf for rows that saw only −inf)."""
        return self.m + torch.log(self.l)


def safe_shift(m: torch.Tensor) -> torch.Tensor:
    """m with −inf replaced by 0: the shift to subtract before exp."""
    # exp(x − m) with m = −inf would be exp(−inf − (−inf)) = exp(NaN). Where the max is
    # still −inf every x is −inf too, so subtracting 0 instead gives the right exp(−inf) = 0.
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def initial_state(row_shape, dtype=torch.float32, device=None) -> SoftmaxState:
    """The state of an empty row: m = −inf, l = 0."""
    return SoftmaxState(torch.full(row_shape, float("-inf"), dtype=dtype, device=device),
                        torch.zeros(row_shape, dtype=dtype, device=device))


def update(state: SoftmaxState, block: torch.Tensor) -> SoftmaxState:
    """Fold a block of columns ``(..., n)`` into the state."""
    m_new = torch.maximum(state.m, block.amax(dim=-1))                       # m' = max(m, max b)
    shift = safe_shift(m_new)
    l_new = (state.l * torch.exp(state.m - shift)                            # l · exp(m − m')
             + torch.exp(block - shift[..., None]).sum(dim=-1))              # + Σ exp(b − m')
    return SoftmaxState(m_new, l_new)


def merge(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """Combine the states of two disjoint parts of the same rows."""
    m = torch.maximum(a.m, b.m)                                              # m = max(m_a, m_b)
    shift = safe_shift(m)
    return SoftmaxState(m, a.l * torch.exp(a.m - shift) + b.l * torch.exp(b.m - shift))


def softmax_statistics(x: torch.Tensor, block_size: int) -> SoftmaxState:
    """(m, l) of every row of ``x``, reading ``block_size`` columns at a time."""
    if not (isinstance(block_size, int) and block_size >= 1):
        raise ValueError(f"block_size: expected a positive integer, got {block_size!r}.")
    state = initial_state(x.shape[:-1], x.dtype, x.device)
    for start in range(0, x.shape[-1], block_size):
        state = update(state, x[..., start:start + block_size])
    return state


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """softmax(x) along the last dimension from streamed statistics: one pass to get
    (m, l) block by block, then exp(x − m) / l. Rows of only −inf give zeros."""
    state = softmax_statistics(x, block_size)
    probabilities = torch.exp(x - safe_shift(state.m)[..., None]) / state.l[..., None]
    return torch.nan_to_num(probabilities, nan=0.0)  # 0/0 only in all −inf rows
