"""Exercise 08: dynamic loss scaling (notebook 08_mixed_precision).

fp16 gradients below about 3e-8 (half fp16's smallest subnormal, 6e-8) round to zero.
Multiplying the loss by a large scale S multiplies every gradient by S (the chain rule is
linear), lifting small gradients into fp16's range; dividing by S before the optimizer step
restores their true size. If S is too large some gradient overflows to inf: skip that step
and halve S. After ``growth_interval`` good steps in a row, try doubling S again. This is
what ``torch.amp.GradScaler`` does; the test compares your scale sequence with it.

Test: ``make test-ex EX=08`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex08_loss_scaler.py``)
"""

import torch


def scale_loss(loss: torch.Tensor, scale: float) -> torch.Tensor:
    """Return ``loss · scale`` (a tensor you can call ``.backward()`` on)."""
    raise NotImplementedError


def unscale_grads_(params, scale: float) -> bool:
    """Divide ``p.grad`` by ``scale`` in place for every parameter that has a gradient.

    Returns True if any gradient contains inf or NaN after unscaling (the step must be
    skipped), else False. Parameters whose ``grad`` is None are ignored.
    """
    raise NotImplementedError


def update_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """The next ``(scale, growth_tracker)``.

    - ``found_inf``: scale · backoff_factor, tracker reset to 0.
    - otherwise the tracker counts good steps; when it reaches ``growth_interval`` the
      scale is multiplied by ``growth_factor`` and the tracker resets to 0.
    """
    raise NotImplementedError


def scaled_step(loss: torch.Tensor, params, optimizer: torch.optim.Optimizer, state: dict) -> bool:
    """One training step with dynamic loss scaling.

    ``state`` holds ``"scale"`` and ``"growth_tracker"`` (and optionally
    ``"growth_factor"``, ``"backoff_factor"``, ``"growth_interval"``) and is updated in
    place. Backward the scaled loss, unscale, step the optimizer only if every gradient
    (and the loss) is finite, zero the gradients, update the scale. Return whether the
    optimizer stepped.
    """
    raise NotImplementedError
