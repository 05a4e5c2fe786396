"""Exercise 05: the flash-attention forward kernel in Triton (notebook 05_triton_forward).

Non-causal, Nq = Nk = N a multiple of the block size, contiguous inputs. Each program owns
BLOCK_M queries of one (batch, head): it loads Q_i once, streams every K_j, V_j block past
it with the online softmax of notebook 03, and writes O_i and the log-sum-exp L_i once.

Test (runs in Triton's interpreter on a CPU): ``make test-ex EX=05``
(or ``.venv/bin/python -m pytest tests/exercises/test_ex05_flash_forward.py``)
"""

import torch
import triton
import triton.language as tl

from flashlab.launch.runtime import kernel_for  # noqa: F401  (launch: kernel_for(kernel, x.device)[grid](…))

BLOCK = 32  # BLOCK_M = BLOCK_N; small, so the interpreter stays fast


@triton.jit
def flash_forward_kernel(Q, K, V, O, L, seq_len, scale, HEAD_DIM: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (query block, batch·head); grid ``(N // BLOCK_M, B·H)``.

    Q, K, V, O are contiguous ``(B·H, N, HEAD_DIM)``: element (head, n, d) sits at
    ``head·N·HEAD_DIM + n·HEAD_DIM + d``. L is ``(B·H, N)`` float32.

    - ``tl.program_id(0)`` is the query block, ``tl.program_id(1)`` the head.
    - State per query row, in fp32: running max m (start −inf), running sum l (start 0),
      accumulator acc (BLOCK_M × HEAD_DIM, start 0).
    - For each key block: S = Q Kᵀ·scale (``tl.dot(q, tl.trans(k))``); m' = max(m, rowmax S);
      P̃ = e^(S − m'); l = l·e^(m − m') + rowsum P̃; acc = acc·e^(m − m') + P̃ V
      (cast P̃ to V's dtype for ``tl.dot``); m = m'.
    - Store O = acc / l in O's dtype and L = m + log l (natural log).
    - ``tl.exp`` works as is; with ``tl.math.exp2`` (as notebook 05's kernels), exp2 needs
      S·log2(e) (e^x = 2^(x·log2 e)), and L = (m + log2 l)·ln 2 stays in natural log.
    """
    pass


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None):
    """Attention forward with `flash_forward_kernel`.

    Args:
        q, k, v: ``(B, H, N, D)``, float32 or float16, N a multiple of ``BLOCK``, D a power
            of two from 16 to 128.
        scale: default ``1/sqrt(D)``.

    Returns:
        ``(out, lse)``: out ``(B, H, N, D)`` in q's dtype; lse ``(B, H, N)`` float32, the
        natural-log log-sum-exp of each score row (the backward needs it).

    Raises:
        ValueError: starting ``"q:"`` when N is not a multiple of ``BLOCK``.
    """
    raise NotImplementedError
