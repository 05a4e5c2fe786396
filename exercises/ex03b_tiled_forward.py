"""Exercise 03b: tiled attention forward in PyTorch (notebook 03).

Test: ``make test-ex EX=03b`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex03b_tiled_forward.py``)
"""

import torch


def tiled_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                            scale: float | None = None, block_m: int = 16,
                            block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention computed tile by tile with the online softmax.

    Args:
        q ``(..., Nq, D)``, k ``(..., Nk, D)``, v ``(..., Nk, Dv)``; causal is top-left
        aligned (query i sees keys 0..i); scale defaults to 1/sqrt(D); any Nq, Nk ≥ 1
        (the last tile may be partial).
    Returns:
        ``(out, lse)``: out ``(..., Nq, Dv)`` in q's dtype, lse = log Σ_j exp(S_ij)
        ``(..., Nq)`` in float32 (float64 for float64 inputs).

    Rules: loop over blocks of ``block_m`` queries and, inside, blocks of ``block_n``
    keys; never create a tensor with Nq × Nk elements; accumulate in float32/64;
    with is_causal, skip key blocks that lie entirely above the diagonal.
    """
    raise NotImplementedError
