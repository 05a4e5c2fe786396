"""Precision modes under the names practitioners know (PyTorch Lightning's):

| mode         | parameters, optimizer | forward/backward compute | loss scaling |
|--------------|-----------------------|--------------------------|--------------|
| `32-true`    | fp32                  | fp32 (TF32 matmuls if allowed) | no     |
| `16-mixed`   | fp32                  | fp16 under autocast      | GradScaler   |
| `bf16-mixed` | fp32                  | bf16 under autocast      | no (bf16 has fp32's range) |
| `16-true`    | fp16                  | fp16                     | no           |
| `bf16-true`  | bf16                  | bf16                     | no           |

Mixed modes keep fp32 master weights and let autocast run matmuls (and attention) in
half precision while reductions such as softmax, layer norm and the loss stay in fp32.
"True" modes hold everything in half precision: half the memory for weights and optimizer
state, but updates smaller than the weights' rounding step are lost.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    name: str
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None     # None: no autocast
    loss_scaling: bool

    def autocast(self, device_type: str):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.autocast_dtype)

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.autocast_dtype or self.param_dtype


PRECISIONS = {
    "32-true": Precision("32-true", torch.float32, None, False),
    "16-mixed": Precision("16-mixed", torch.float32, torch.float16, True),
    "bf16-mixed": Precision("bf16-mixed", torch.float32, torch.bfloat16, False),
    "16-true": Precision("16-true", torch.float16, None, False),
    "bf16-true": Precision("bf16-true", torch.bfloat16, None, False),
}


def get_precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise ValueError(f"precision: {name!r} is not one of {list(PRECISIONS)}.")
    return PRECISIONS[name]


# Dense peak FLOP/s of GPUs the course meets, for model-FLOPs utilisation (MFU).
# Vendor datasheet numbers without sparsity; fp32 is the non-tensor-core rate.
PEAK_FLOPS = {
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
}


def peak_flops(device_name: str, precision: Precision) -> float | None:
    """The datasheet peak for this GPU and the dtype the matmuls run in, or None if unknown."""
    kind = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(precision.compute_dtype)
    if kind is None:
        kind = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    for gpu, peaks in PEAK_FLOPS.items():
        if gpu in device_name:
            return peaks[kind]
    return None


# ------------------------------------------------------------------ the formats themselves
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
                                     block: int = 64) -> torch.Tensor:
    """One query row of attention, softmax(scores) · values, computed tile by tile as a
    flash kernel does (`flashlab.online_softmax.update`), with the running sum ℓ and the
    output accumulator rounded to ``state_dtype`` after every tile and float64 otherwise:
    what keeping the kernel's state in low precision would cost."""
    from .online_softmax import SoftmaxState, initial_state, safe_shift, update

    state = initial_state((), torch.float64)
    acc = torch.zeros(values.shape[1], dtype=torch.float64)
    for start in range(0, scores.numel(), block):
        s, v = scores[start:start + block].double(), values[start:start + block].double()
        new = update(state, s)                                         # m' and ℓ' = ℓ·e^(m−m') + Σ e^(s−m')
        shift = safe_shift(new.m)
        acc = (acc * torch.exp(state.m - shift) + torch.exp(s - shift) @ v).to(state_dtype).double()
        state = SoftmaxState(new.m, new.l.to(state_dtype).double())
    return acc / state.l
