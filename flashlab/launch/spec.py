"""`AttentionSpec`: what one attention call computes, besides its tensors.

The API builds one per call (`flashlab.attention`, `varlen_attention`, `decode_attention`), the
custom ops carry its fields as plain numbers (their schema allows nothing else) and rebuild it,
and every launcher takes it whole; it is flattened into kernel arguments only where a kernel is
launched (`kernel_args`). A new option is one field here, one line in `kernel_args`, and the
kernels' use of it (`flashlab.kernels.tile`).

It is a NamedTuple, not a dataclass: the small path keys its launch plans by it on every call,
and a tuple hashes in C.
"""

from __future__ import annotations

from typing import NamedTuple

from flashlab.kernels.constants import LOG2E
from flashlab.reference.naive import window_band


class AttentionSpec(NamedTuple):
    """One call's options.

    scale: the scores' multiplier (SDPA's ``scale``, default 1/sqrt(D) resolved by the API).
    is_causal: query i sees keys 0..i (top-left, as SDPA).
    window: ``(left, right)``, FlashAttention's sliding window aligned to the end of the keys
        (query i sees keys i + Nk − Nq − left … i + Nk − Nq + right, −1 unbounded), or None.
    softcap: the logits' soft cap, cap·tanh(x/cap) (Gemma 2's); 0 for none.
    dropout_p: the probability of dropping an attention weight.
    precision: how fp32 operands are multiplied: "ieee" (exact) or "tf32".
    """

    scale: float
    is_causal: bool = False
    window: tuple[int, int] | None = None
    softcap: float = 0.0
    dropout_p: float = 0.0
    precision: str = "ieee"

    @classmethod
    def from_op(cls, dropout_p: float, is_causal: bool, scale: float, precision: str, window_left: int = -1,
                window_right: int = -1, softcap: float = 0.0) -> AttentionSpec:
        """The spec a custom op's plain arguments describe (window (−1, −1): none)."""
        window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
        return cls(scale, is_causal, window, softcap, dropout_p, precision)

    @property
    def window_args(self) -> tuple[int, int]:
        """The window as the ops' two plain ints, (−1, −1) for none."""
        return self.window if self.window is not None else (-1, -1)

    def band(self, n_q: int, n_k: int) -> tuple[int, int] | None:
        """The band the window gives the kernels (`flashlab.reference.naive.window_band`, causality
        folded in), or None without a window."""
        return window_band(self.window, self.is_causal, n_q, n_k)

    def kernel_args(self, n_q: int, n_k: int) -> tuple[tuple, dict]:
        """The spec as kernel arguments: the scalars ``(qk_scale, softcap, band_lo, band_hi)`` (the
        scale and the cap in base 2, as the kernels' scores are) and the compile-time flags
        ``{IS_CAUSAL, HAS_WINDOW, SOFTCAP, DROPOUT, INPUT_PRECISION}``. With a window, causality is
        folded into the band, so the kernels have one rule for which keys a query sees."""
        band = self.band(n_q, n_k)
        flags = dict(IS_CAUSAL=self.is_causal and band is None, HAS_WINDOW=band is not None,
                     SOFTCAP=self.softcap > 0, DROPOUT=self.dropout_p > 0, INPUT_PRECISION=self.precision)
        return (self.scale * LOG2E, self.softcap * LOG2E, *(band or (0, 0))), flags
