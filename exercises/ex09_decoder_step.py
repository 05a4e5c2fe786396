"""Exercise 09: one step of the TSP Attention Model's decoder (notebook 09_capstone;
the package's versions are `flashlab.train.tsp.masked_glimpse` and `flashlab.train.tsp.pointer_log_probs`).

At each step the decoder holds one context query per instance (graph embedding, first
city, current city). It *glimpses*: multi-head attention of that single query over the
cities, the visited ones masked out. Then one more single-head score per city, clipped
with C·tanh, becomes the probability of visiting that city next.

Test: ``make test-ex EX=09`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex09_decoder_step.py``)
"""

import torch


def masked_glimpse(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   visited: torch.Tensor) -> torch.Tensor:
    """Attention of one query per (instance, head) over the unvisited cities.

    Args:
        query: ``(batch, heads, 1, d)``; keys, values: ``(batch, heads, n, d)``.
        visited: ``(batch, n)`` bool, True where the city is already in the tour; every
            instance has at least one unvisited city.
    Returns:
        ``(batch, heads, 1, d)`` in query's dtype: Σ_j softmax_j(q·k_j / √d) v_j over the
        unvisited j only (scores of visited cities are −inf before the softmax), with d the
        head dimension (``query.shape[-1]``). Write it with ``torch.einsum`` or ``@``, not
        with an attention function.
    """
    raise NotImplementedError


def pointer_log_probs(glimpse: torch.Tensor, logit_keys: torch.Tensor, visited: torch.Tensor,
                      tanh_clip: float) -> torch.Tensor:
    """log p(next city) for every city.

    Args:
        glimpse: ``(batch, D)`` (the glimpse after its output projection);
        logit_keys: ``(batch, n, D)``; visited: ``(batch, n)`` bool, at least one False per row;
        tanh_clip: C.
    Returns:
        ``(batch, n)`` float32: the log-softmax over cities of u_j = C·tanh(glimpse · k_j / √D),
        with u_j = −inf for visited cities (so their probability is exactly 0 and the
        unvisited ones sum to 1).
    """
    raise NotImplementedError
