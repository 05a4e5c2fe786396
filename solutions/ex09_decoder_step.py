"""Exercise 09, reference answer: the decoder's masked glimpse and pointer (as `flashlab.train.tsp`)."""

import math

import torch


def masked_glimpse(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   visited: torch.Tensor) -> torch.Tensor:
    """Attention of one query per (instance, head) over the unvisited cities."""
    scores = torch.einsum("bhqd,bhnd->bhqn", query, keys) / math.sqrt(query.shape[-1])   # q·k_j / √d
    scores = scores.masked_fill(visited[:, None, None, :], float("-inf"))                # visited: weight 0
    return torch.einsum("bhqn,bhnd->bhqd", torch.softmax(scores, dim=-1), values)


def pointer_log_probs(glimpse: torch.Tensor, logit_keys: torch.Tensor, visited: torch.Tensor,
                      tanh_clip: float) -> torch.Tensor:
    """log p(next city): C·tanh of one more attention score, visited cities −inf."""
    logits = torch.einsum("bd,bnd->bn", glimpse, logit_keys) / math.sqrt(glimpse.shape[-1])
    logits = (tanh_clip * torch.tanh(logits)).masked_fill(visited, float("-inf"))
    return torch.log_softmax(logits.float(), dim=-1)
