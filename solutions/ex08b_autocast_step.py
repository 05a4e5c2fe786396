"""Exercise 08b, reference answer: one autocast-aware training step."""

import contextlib
import math

import torch
import torch.nn.functional as F

AUTOCAST_DTYPES = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def training_step(model, inputs, targets, optimizer, precision: str, scaler=None, grad_clip: float = 1.0) -> dict:
    """Forward under autocast, backward (scaled for 16-mixed), unscale, clip, step."""
    if precision not in AUTOCAST_DTYPES:
        raise ValueError(f"precision: {precision!r} is not one of {list(AUTOCAST_DTYPES)}.")
    if precision == "16-mixed" and scaler is None:
        raise ValueError("scaler: 16-mixed needs a torch.amp.GradScaler to keep small gradients from underflowing.")
    dtype = AUTOCAST_DTYPES[precision]
    autocast = torch.autocast(inputs.device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    with autocast:
        logits = model(inputs)
    loss = F.cross_entropy(logits.float(), targets)                 # the loss in fp32, outside autocast
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)                                  # before clipping: clip true gradients
    else:
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip).item()
    skipped = not (math.isfinite(norm) and math.isfinite(loss.item()))
    if scaler is not None:
        scaler.step(optimizer)                                      # skips by itself when it found inf
        scaler.update()
    elif not skipped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss.item(), "grad_norm": norm, "skipped": skipped}
