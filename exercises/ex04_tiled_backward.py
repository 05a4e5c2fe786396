"""Exercise 04: tiled attention backward with recomputation (notebook 04).

Test: ``make test-ex EX=04`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex04_tiled_backward.py``)
"""

import torch


def tiled_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, grad_out: torch.Tensor, is_causal: bool = False,
                             scale: float | None = None, block_m: int = 16,
                             block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of attention from q, k, v, the output ``out``, the
    log-sum-exp ``lse`` ``(..., Nq)`` of the forward and ``grad_out`` = dL/dout.

    Recompute P tile by tile: P_ij = exp(S_ij − lse_i) with S_ij = Q_i K_jᵀ·scale; with
    D_i = rowsum(dO_i ∘ O_i): dV_j += P_ijᵀ dO_i; dP_ij = dO_i V_jᵀ;
    dS_ij = P_ij ∘ (dP_ij − D_i); dQ_i += dS_ij K_j·scale; dK_j += dS_ijᵀ Q_i·scale.
    Causal is top-left aligned. Never create an Nq × Nk tensor. Return gradients in
    the dtypes of q, k, v.
    """
    raise NotImplementedError
