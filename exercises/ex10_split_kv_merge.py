"""Exercise 10: merging split-KV partial results (notebook 10_inference_packing).

Decoding splits the keys of each query row into S ranges, processed in parallel. Split s
returns its *normalised* output O_s = softmax(scores over its keys) · V and its log-sum-exp
L_s = log Σ_{j in split s} exp(score_j) (natural log; −inf for a split with no key).
The whole row's result follows from these alone (notebook 03's merge):

    m = max_s L_s,   w_s = exp(L_s − m),   O = Σ_s w_s O_s / Σ_s w_s,   L = m + log Σ_s w_s

Test: ``make test-ex EX=10``
"""

import torch


def merge_splits(o_parts: torch.Tensor, lse_parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine S partial results of the same rows.

    Args:
        o_parts: ``(S, ..., D)``: split s's normalised output for every row (zeros where the
            split saw no key).
        lse_parts: ``(S, ...)``: split s's natural-log log-sum-exp per row; −inf where it saw no key.

    Returns:
        ``(O, L)`` of shapes ``(..., D)`` and ``(...)``, in the inputs' dtype: the output and
        log-sum-exp of the whole row. Rows where every split is empty give O = 0 and L = −inf
        (no NaN). Must not overflow for large log-sum-exps (e.g. 1000).
    """
    raise NotImplementedError
