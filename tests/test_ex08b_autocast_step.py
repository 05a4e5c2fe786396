"""Tests for exercise 08b (autocast-aware training step), on CPU."""

import pytest
import torch
from torch import nn


def _setup(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 5))
    inputs, targets = torch.randn(8, 16), torch.randint(0, 5, (8,))
    return model, inputs, targets, torch.optim.SGD(model.parameters(), lr=0.1)


def _matmul_dtypes(model):
    seen = []
    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    return seen


@pytest.mark.parametrize("precision,dtype", [("32-true", torch.float32), ("bf16-mixed", torch.bfloat16),
                                             ("16-mixed", torch.float16)])
def test_forward_runs_in_the_mode_and_weights_stay_fp32(exercise, precision, dtype):
    model, inputs, targets, opt = _setup()
    seen = _matmul_dtypes(model)
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    result = exercise.training_step(model, inputs, targets, opt, precision, scaler)
    assert seen and all(d == dtype for d in seen), f"matmuls ran in {seen}, expected {dtype}"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not result["skipped"] and all(p.grad is None or (p.grad == 0).all() for p in model.parameters())


def test_matches_a_plain_fp32_step_and_reports_the_true_gradient_norm(exercise):
    """16-mixed scales the loss by 65536; the reported norm and the update must not see it."""
    ref_model, inputs, targets, ref_opt = _setup()
    loss = nn.functional.cross_entropy(ref_model(inputs), targets)
    loss.backward()
    true_norm = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 1.0).item()
    ref_opt.step()
    model, _, _, opt = _setup()
    result = exercise.training_step(model, inputs, targets, opt, "16-mixed", torch.amp.GradScaler("cpu"))
    assert result["loss"] == pytest.approx(loss.item(), rel=5e-3)
    assert result["grad_norm"] == pytest.approx(true_norm, rel=2e-2)
    for a, b in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-3)


def test_clips_after_unscaling(exercise):
    model, inputs, targets, opt = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    exercise.training_step(model, inputs, targets, opt, "16-mixed", torch.amp.GradScaler("cpu"), grad_clip=1e-3)
    moved = torch.sqrt(sum(((p - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
    assert moved.item() <= 0.1 * 1e-3 * 1.01, "SGD with lr 0.1 moves by lr × clipped norm at most"


def test_skips_a_step_with_inf(exercise):
    model, inputs, targets, opt = _setup()
    inputs[0, 0] = float("inf")
    before = [p.detach().clone() for p in model.parameters()]
    result = exercise.training_step(model, inputs, targets, opt, "bf16-mixed")
    assert result["skipped"]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_clear_errors(exercise):
    model, inputs, targets, opt = _setup()
    with pytest.raises(ValueError, match="^scaler:"):
        exercise.training_step(model, inputs, targets, opt, "16-mixed")
    with pytest.raises(ValueError, match="^precision:"):
        exercise.training_step(model, inputs, targets, opt, "fp8")
