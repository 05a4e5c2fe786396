"""What flashlab's attention kernels do not differentiate, raised rather than dropped.

The backward kernels (and the tiled PyTorch recomputation, `flashlab.reference.tiled`) return dQ, dK, dV
(and the mask's dS) as plain tensors, with no autograd graph of their own. In a backward with
``create_graph=True`` they would come back as constants, and whatever differentiates them again
(a gradient penalty, a Hessian-vector product) would get no contribution from attention, with
no error. The decoding kernels (`flashlab.api.decode`) have no backward at all: their output would
simply stop the gradient. `first_order_only` and `without_backward` tie such tensors to the
inputs they came from through a node whose backward raises, so those cases fail loudly."""

from __future__ import annotations

import torch

SECOND_DERIVATIVE = (
    "flashlab's attention has no second derivative: its backward (a Triton kernel, or the tiled recomputation "
    "for float64) returns gradients with no autograd graph of their own. For a gradient penalty or another "
    "double backward, compute that attention with flashlab.naive_attention (plain PyTorch) or SDPA's math backend.")


class RaisesInBackward(torch.autograd.Function):
    """Returns its first n tensors unchanged (detached), as functions of the remaining ones, with a
    backward that raises ``message``. ``forward(ctx, message, n, *tensors)``."""

    @staticmethod
    def forward(ctx, message, n, *tensors):
        ctx.message = message
        return tuple(t.detach() for t in tensors[:n])

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(ctx.message)


def _tied(tensors: tuple, inputs: tuple, message: str) -> tuple:
    present = [t for t in tensors if t is not None]
    tied = iter(RaisesInBackward.apply(message, len(present), *present, *(t for t in inputs if t is not None)))
    return tuple(None if t is None else next(tied) for t in tensors)


def first_order_only(grads: tuple, inputs: tuple) -> tuple:
    """The kernels' gradients as they are, except in a backward with ``create_graph=True`` (grad
    mode on): then tied to the ``inputs`` they were computed from, so differentiating them again
    raises `SECOND_DERIVATIVE` instead of silently treating them as constants (which would drop
    attention's part of a gradient penalty, with no error). None entries pass as None."""
    if not torch.is_grad_enabled():
        return grads
    return _tied(grads, inputs, SECOND_DERIVATIVE)


def without_backward(outputs: tuple, inputs: tuple, message: str) -> tuple:
    """Outputs of kernels that have no backward: as they are, unless grad mode is on and an input
    requires grad; then tied to the inputs, so a backward through them raises ``message`` instead
    of finding them constants."""
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in inputs):
        return outputs
    return _tied(outputs, inputs, message)
