"""The kernels' gradients are first-order only: flashlab's backward kernels (and the tiled
PyTorch recomputation, `flashlab.tiled`) return dQ, dK, dV (and the mask's dS) as plain
tensors, with no autograd graph of their own. In a backward with
``create_graph=True`` those would come back as constants, and whatever differentiates them
again (a gradient penalty, a Hessian-vector product) would get no contribution from attention,
with no error. `first_order_only` ties them to the inputs they came from through a node whose
derivative raises, so that case fails loudly instead."""

from __future__ import annotations

import torch


class NoSecondDerivative(torch.autograd.Function):
    """Returns the kernels' gradients unchanged, as functions of the attention's inputs whose own
    derivative raises: what `first_order_only` wraps them in during a backward with
    ``create_graph=True``. ``forward(ctx, n, *tensors)``: the first n tensors are the gradients,
    the rest the inputs they depend on (q, k, v, the mask)."""

    @staticmethod
    def forward(ctx, n, *tensors):
        return tuple(g.detach() for g in tensors[:n])

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(
            "flashlab.attention has no second derivative: its backward (a Triton kernel, or the tiled "
            "recomputation for float64) returns gradients with no autograd graph of their own. For a "
            "gradient penalty or another double backward, compute that attention with "
            "flashlab.naive_attention (plain PyTorch) or SDPA's math backend.")


def first_order_only(grads: tuple, inputs: tuple) -> tuple:
    """The kernels' gradients as they are, except in a backward with ``create_graph=True`` (grad
    mode on): then through `NoSecondDerivative`, tied to the ``inputs`` they were computed from, so
    differentiating them again raises instead of silently treating them as constants (which
    would drop attention's part of a gradient penalty, with no error). None entries pass as None."""
    if not torch.is_grad_enabled():
        return grads
    present = [g for g in grads if g is not None]
    tied = iter(NoSecondDerivative.apply(len(present), *present, *(t for t in inputs if t is not None)))
    return tuple(None if g is None else next(tied) for g in grads)
