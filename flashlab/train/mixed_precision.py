"""The trainer's mixed-precision policy: its precision modes, under the names practitioners
know (PyTorch Lightning's):

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

The number formats themselves (ranges, rounding) are `flashlab.lessons.number_formats`.
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
