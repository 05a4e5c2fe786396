"""Exercise 08, reference answer: dynamic loss scaling, the algorithm of torch.amp.GradScaler."""

import math

import torch


def scale_loss(loss: torch.Tensor, scale: float) -> torch.Tensor:
    """loss · scale."""
    return loss * scale


def unscale_grads_(params, scale: float) -> bool:
    """Divide every gradient by ``scale`` in place; True if any gradient holds inf or NaN."""
    found_inf = False
    inv = 1.0 / scale
    for p in params:
        if p.grad is None:
            continue
        p.grad.mul_(inv)
        found_inf = found_inf or not bool(torch.isfinite(p.grad).all())
    return found_inf


def update_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """Next (scale, growth_tracker)."""
    if found_inf:
        return scale * backoff_factor, 0
    growth_tracker += 1
    if growth_tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker


def scaled_step(loss: torch.Tensor, params, optimizer: torch.optim.Optimizer, state: dict) -> bool:
    """One optimizer step with dynamic loss scaling; returns whether the step was taken."""
    params = list(params)
    scale_loss(loss, state["scale"]).backward()
    found_inf = unscale_grads_(params, state["scale"]) or not math.isfinite(loss.item())
    if not found_inf:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    state["scale"], state["growth_tracker"] = update_scale(state["scale"], state["growth_tracker"], found_inf,
                                                           state.get("growth_factor", 2.0),
                                                           state.get("backoff_factor", 0.5),
                                                           state.get("growth_interval", 2000))
    return not found_inf
