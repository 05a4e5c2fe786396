"""Tests for exercise 08 (dynamic loss scaling), against torch.amp.GradScaler."""

import torch


def test_scale_and_unscale(exercise):
    w = torch.nn.Parameter(torch.randn(5))
    loss = (w * 3).sum()
    exercise.scale_loss(loss, 1024.0).backward()
    assert torch.allclose(w.grad, torch.full((5,), 3 * 1024.0))
    assert exercise.unscale_grads_([w, torch.nn.Parameter(torch.zeros(2))], 1024.0) is False
    assert torch.allclose(w.grad, torch.full((5,), 3.0))
    w.grad[2] = float("inf")
    assert exercise.unscale_grads_([w], 2.0) is True
    w.grad[2] = float("nan")
    assert exercise.unscale_grads_([w], 2.0) is True


def test_scale_sequence_matches_grad_scaler(exercise):
    """The same pattern of overflowing steps gives GradScaler's scale sequence."""
    pattern = [False, False, True, False, False, False, False, True, True, False, False, False]
    reference = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    scale, tracker, mine, theirs = 2.0**10, 0, [], []
    for overflow in pattern:
        loss = w.sum() * (float("inf") if overflow else 1.0)
        reference.scale(loss).backward()
        reference.step(opt)
        reference.update()
        opt.zero_grad()
        scale, tracker = exercise.update_scale(scale, tracker, overflow, growth_interval=3)
        mine.append(scale)
        theirs.append(reference.get_scale())
    assert mine == theirs


def test_scaled_step_skips_on_overflow_and_keeps_small_gradients(exercise):
    """fp32 master weights, fp16 compute: the setting loss scaling is made for."""
    w = torch.nn.Parameter(torch.ones(4))
    (w.half() * 1e-8).sum().backward()
    assert torch.all(w.grad == 0), "without scaling a 1e-8 gradient flushes to zero in fp16"
    w.grad = None
    opt = torch.optim.SGD([w], lr=1e4)
    state = {"scale": 2.0**14, "growth_tracker": 0}
    stepped = exercise.scaled_step((w.half() * 1e-8).sum(), [w], opt, state)
    assert stepped and state["growth_tracker"] == 1
    torch.testing.assert_close(w.detach(), torch.full((4,), 1 - 1e-4), rtol=0, atol=1e-6)  # w − lr · 1e-8
    before = w.detach().clone()
    overflow = (w.half() * 1e4).sum()          # its gradient 1e4 · 2^14 overflows fp16's 65504
    assert exercise.scaled_step(overflow, [w], opt, state) is False
    assert torch.equal(w.detach(), before) and state["scale"] == 2.0**13 and state["growth_tracker"] == 0
    assert w.grad is None or torch.all(w.grad == 0), "gradients are cleared after a skipped step"
