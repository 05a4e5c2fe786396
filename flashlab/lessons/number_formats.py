"""Floating-point number formats as the course teaches them (notebook 08): fp32, TF32, fp16
and bf16 by their bit counts; their ranges and rounding; and what rounding a flash kernel's
running state to a narrow format would cost. The trainer's precision modes, which pick among
these formats, are `flashlab.train.mixed_precision`."""

from __future__ import annotations

import torch

FORMATS = {  # name: (dtype to round through, exponent bits, mantissa bits)
    "fp32": (torch.float32, 8, 23),
    "tf32": (None, 8, 10),          # a tensor-core input format: fp32's range, fp16's precision
    "fp16": (torch.float16, 5, 10),
    "bf16": (torch.bfloat16, 8, 7),
}


def format_properties(name: str) -> dict:
    """Largest finite value, smallest normal and subnormal, machine epsilon of a format,
    from its bit counts (IEEE-754 style, as torch.finfo reports them)."""
    _, e_bits, m_bits = FORMATS[name]
    bias = 2 ** (e_bits - 1) - 1
    return {"format": name, "exponent bits": e_bits, "mantissa bits": m_bits,
            "max": (2 - 2.0**-m_bits) * 2.0**bias, "smallest normal": 2.0 ** (1 - bias),
            "smallest subnormal": 2.0 ** (1 - bias - m_bits), "epsilon": 2.0**-m_bits}


def round_to(x: float, name: str) -> float:
    """``x`` rounded to the nearest value of format ``name`` (round-to-nearest-even; TF32
    by dropping fp32's low 13 mantissa bits with rounding)."""
    dtype = FORMATS[name][0]
    if dtype is not None:
        return torch.tensor(x, dtype=torch.float64).to(dtype).item()
    bits = torch.tensor([x], dtype=torch.float32).view(torch.int32)
    half, low = 1 << 12, (1 << 13) - 1
    rounded = (bits + half - 1 + ((bits >> 13) & 1)) & ~low      # nearest, ties to even
    return rounded.view(torch.float32).item()


def attention_row_with_rounded_state(scores: torch.Tensor, values: torch.Tensor, state_dtype: torch.dtype,
                                     block: int = 64, rounded: tuple[str, ...] = ("l", "acc")) -> torch.Tensor:
    """One query row of attention, softmax(scores) · values, computed tile by tile as a
    flash kernel does (`flashlab.reference.online_softmax.update`), with the running sum ℓ and the
    output accumulator rounded to ``state_dtype`` after every tile and float64 otherwise:
    what keeping the kernel's state in low precision would cost. ``rounded`` names which of
    the two are rounded (``"l"``, ``"acc"``; both by default), to tell their costs apart."""
    if not set(rounded) <= {"l", "acc"}:
        raise ValueError(f"rounded: expected a subset of ('l', 'acc'), got {rounded!r}")
    acc_dtype = state_dtype if "acc" in rounded else torch.float64
    l_dtype = state_dtype if "l" in rounded else torch.float64
    from flashlab.reference.online_softmax import SoftmaxState, initial_state, safe_shift, update

    state = initial_state((), torch.float64)
    acc = torch.zeros(values.shape[1], dtype=torch.float64)
    for start in range(0, scores.numel(), block):
        s, v = scores[start:start + block].double(), values[start:start + block].double()
        new = update(state, s)                                         # m' and ℓ' = ℓ·e^(m−m') + Σ e^(s−m')
        shift = safe_shift(new.m)
        acc = (acc * torch.exp(state.m - shift) + torch.exp(s - shift) @ v).to(acc_dtype).double()
        state = SoftmaxState(new.m, new.l.to(l_dtype).double())
    return acc / state.l
