"""Exercise 05b: the forward kernel for any sequence length, causal or not
(notebook 05_triton_forward).

Start from your exercise 05. Two changes: (1) Nq and Nk need not be block multiples:
loads and stores are masked, masked keys get score −inf; (2) causal attention (query i
sees keys 0..i, top-left like PyTorch): mask inside the diagonal tile, and do not visit
key blocks that lie entirely past a query block's last query.

Test: ``make test-ex EX=05b`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex05b_causal_ragged.py``)
"""

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for  # noqa: F401  (launch: kernel_for(kernel, x.device)[grid](…))

BLOCK = 32


@triton.jit
def flash_forward_kernel(Q, K, V, O, L, n_q, n_k, scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (query block, batch·head); grid ``(cdiv(Nq, BLOCK_M), B·H)``.

    Q, O contiguous ``(B·H, Nq, HEAD_DIM)``; K, V contiguous ``(B·H, Nk, HEAD_DIM)``;
    L ``(B·H, Nq)`` float32.

    - Load with ``mask=…, other=0.0``; store only rows < Nq.
    - Scores of keys ≥ Nk (and, causal, of keys j > i) are −inf before the row max.
    - Causal: the loop over key blocks stops at ``min(Nk, (start_m + 1)·BLOCK_M)``.
    - Every row sees at least key 0, padded query rows (≥ Nq) included: Q loads as 0 there, so
      their scores are 0 and their max finite, and they are never stored. So no guard is needed
      here against a −inf max or a zero sum; a kernel where a row can see no key at all (a
      sliding window, bottom-right causal with Nq > Nk) needs one: 0 in place of a −inf max
      (−inf − (−inf) is NaN) and 1 in place of a zero sum.
    """
    pass


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                  scale: float | None = None):
    """Attention forward for any Nq ≥ 1, Nk ≥ 1.

    Args:
        q: ``(B, H, Nq, D)``; k, v: ``(B, H, Nk, D)``; float32 or float16; D a power of two
            from 16 to 128.
        is_causal: query i sees keys 0..i.
        scale: default ``1/sqrt(D)``.

    Returns:
        ``(out, lse)`` as in exercise 05: out ``(B, H, Nq, D)``, lse ``(B, H, Nq)`` float32.
    """
    raise NotImplementedError
