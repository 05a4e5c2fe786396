"""Exercise 06: the flash-attention backward kernels in Triton (notebook 06_triton_backward).

Given Q, K, V, the forward's O and log-sum-exp L, and dO, compute dQ, dK, dV without ever
storing an N×N matrix. P is recomputed tile by tile as P = e^(S − L). L is the natural-log
log-sum-exp (not the base-2 L of notebook 06's kernels): with exp2, P = exp2((S − L)·log2(e)).

    D_i  = rowsum(dO_i ∘ O_i)                 (computed for you in PyTorch in the launcher)
    dV_j = Σ_i P_ijᵀ dO_i
    dP   = dO_i V_jᵀ,   dS = P ∘ (dP − D_i)
    dK_j = Σ_i dS_ijᵀ Q_i · scale
    dQ_i = Σ_j dS_ij K_j · scale

Two kernels, each output tile written by exactly one program (no atomics, deterministic):
`dkdv_kernel` keeps K_j, V_j on chip and streams the query blocks; `dq_kernel` keeps Q_i,
dO_i on chip and streams the key blocks.

One kernel at a time: while one of them is still ``pass``, the gradient tests check the other's
gradients alone (dK and dV, or dQ) and then report the test as not started, naming the kernel left.

Test: ``make test-ex EX=06`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex06_flash_backward.py``)
"""

import torch  # noqa: F401  (you will need it in flash_backward)
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for  # noqa: F401  (launch: kernel_for(kernel, x.device)[grid](…))

BLOCK = 32


@triton.jit
def dkdv_kernel(Q, K, V, DO, L, DELTA, DK, DV, n_q, n_k, scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (key block, batch·head); grid ``(cdiv(Nk, BLOCK_N), B·H)``.

    Q, DO contiguous ``(B·H, Nq, HEAD_DIM)``; K, V, DK, DV ``(B·H, Nk, HEAD_DIM)``;
    L (natural-log log-sum-exp) and DELTA ``(B·H, Nq)`` float32.

    - Load K_j, V_j once; accumulate dK_j, dV_j in fp32 over query blocks.
    - P = e^(S − L) with S = Q Kᵀ·scale; P = 0 where the key is ≥ Nk, the query ≥ Nq, or
      (causal) j > i.
    - Causal: start the query loop at the first block that can see key ``start_n``.
    - Store dK·scale and dV in the inputs' dtype, rows < Nk only.
    """
    pass


@triton.jit
def dq_kernel(Q, K, V, DO, L, DELTA, DQ, n_q, n_k, scale, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (query block, batch·head); grid ``(cdiv(Nq, BLOCK_M), B·H)``.

    Same layouts as `dkdv_kernel`. ``start_m = tl.program_id(0)`` is the query block's index,
    as in notebook 05's `_key_range`: its rows are ``start_m·BLOCK_M + arange(BLOCK_M)``. Load
    Q_i, dO_i, L_i, D_i once; loop over key blocks (causal: stop after the diagonal block, at
    ``min(Nk, (start_m + 1)·BLOCK_M)``) accumulating dQ_i += dS K_j in fp32; store dQ·scale in
    the inputs' dtype, rows < Nq only.
    """
    pass


def flash_backward(q, k, v, out, lse, grad_out, is_causal: bool = False, scale: float | None = None):
    """Gradients of attention with the two kernels.

    Args:
        q: ``(B, H, Nq, D)``; k, v: ``(B, H, Nk, D)``; out, grad_out: ``(B, H, Nq, D)``;
            float32 or float16, D a power of two from 16 to 128.
        lse: ``(B, H, Nq)`` float32, natural-log log-sum-exp of the forward's score rows.
        is_causal: query i sees keys 0..i.
        scale: default ``1/sqrt(D)``.

    Returns:
        ``(dq, dk, dv)`` shaped and typed like q, k, v.

    Compute ``delta = (grad_out.float() * out.float()).sum(-1)`` here, then launch
    `dkdv_kernel` and `dq_kernel`.
    """
    raise NotImplementedError
