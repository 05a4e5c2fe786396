"""Exercise 10, reference answer: merging split-KV partial results."""

import torch


def merge_splits(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine S partial results of the same rows."""
    m = lse_parts.amax(dim=0)                                        # m = max_s L_s
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)   # all empty: subtract 0, not −inf
    w = torch.exp(lse_parts - shift)                                 # w_s = exp(L_s − m)
    total = w.sum(dim=0)
    o = (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, 1.0)[..., None]
    return o, shift + torch.log(total)                               # log 0 = −inf for empty rows
