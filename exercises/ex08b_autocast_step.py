"""Exercise 08b: one autocast-aware training step (notebook 08_mixed_precision).

The core of a mixed-precision trainer in one function: run the forward under
``torch.autocast`` (matmuls in half precision, reductions in fp32), compute the loss in
fp32, backward (through a ``GradScaler`` for fp16), unscale *before* clipping so the clip
sees the true gradient norm, and skip the step when anything is inf or NaN.

Test: ``make test-ex EX=08b`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex08b_autocast_step.py``)
"""

import torch  # noqa: F401  (you will need it)


def training_step(model, inputs, targets, optimizer, precision: str, scaler=None, grad_clip: float = 1.0) -> dict:
    """One optimizer step of ``model`` on a classification batch.

    Args:
        model: maps ``inputs`` to logits ``(batch, classes)``; its parameters stay fp32.
        inputs, targets: a batch; ``targets`` are class indices.
        optimizer: over ``model.parameters()``.
        precision: ``"32-true"`` (no autocast), ``"bf16-mixed"`` (autocast to bfloat16) or
            ``"16-mixed"`` (autocast to float16, with ``scaler``), on ``inputs.device.type``.
        scaler: a ``torch.amp.GradScaler``; required for ``"16-mixed"``, else None.
        grad_clip: clip the global gradient norm to this after unscaling.

    Returns:
        ``{"loss": float, "grad_norm": float (true, unscaled, before clipping), "skipped": bool}``;
        a skipped step leaves the parameters unchanged. Gradients are cleared either way.

    Raises:
        ValueError: ``"precision: …"`` for an unknown mode; ``"scaler: …"`` when 16-mixed has none.
    """
    raise NotImplementedError
