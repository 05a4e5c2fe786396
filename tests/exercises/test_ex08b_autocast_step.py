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
    assert seen and all(d == dtype for d in seen), (
        f"{precision}: the Linear layers' outputs were {seen}, expected {dtype} (run the forward inside "
        f"torch.autocast(inputs.device.type, dtype=…) for the mixed modes, without autocast for 32-true)")
    kept = {p.dtype for p in model.parameters()}
    assert kept == {torch.float32}, (
        f"{precision}: the parameters are now {kept}; they must stay float32 (autocast casts inside the "
        "forward: do not call model.half() or model.to(dtype))")
    assert not result["skipped"], (
        f"{precision}: a batch with a finite loss and finite gradients was reported skipped; skip only when the "
        "gradient norm or the loss is inf/NaN")
    assert all(p.grad is None or (p.grad == 0).all() for p in model.parameters()), (
        f"{precision}: gradients are left over after the step; clear them (optimizer.zero_grad(set_to_none=True))")


def test_matches_a_plain_fp32_step_and_reports_the_true_gradient_norm(exercise):
    """16-mixed scales the loss by 65536; the reported norm and the update must not see it."""
    ref_model, inputs, targets, ref_opt = _setup()
    loss = nn.functional.cross_entropy(ref_model(inputs), targets)
    loss.backward()
    true_norm = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), 1.0).item()
    ref_opt.step()
    model, _, _, opt = _setup()
    result = exercise.training_step(model, inputs, targets, opt, "16-mixed", torch.amp.GradScaler("cpu"))
    assert result["loss"] == pytest.approx(loss.item(), rel=5e-3), (
        f"result['loss'] {result['loss']} should be the unscaled fp32 loss {loss.item():.6f} (report loss.item(), "
        "not the scaled loss)")
    ratio = result["grad_norm"] / true_norm
    assert result["grad_norm"] == pytest.approx(true_norm, rel=2e-2), (
        f"result['grad_norm'] {result['grad_norm']:.6g} should be the true gradient norm {true_norm:.6g}, "
        f"before clipping; yours is {ratio:.4g}× it"
        + (" (the scaled norm: call scaler.unscale_(optimizer) before clip_grad_norm_)" if ratio > 100 else "")
        + (" (the norm after clipping: report what clip_grad_norm_ returns)" if result["grad_norm"] <= 1.0001
           and true_norm > 1.0001 else ""))
    for a, b in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-3, msg=lambda m: (
            "after one step the weights should match a plain fp32 step (SGD, lr 0.1, gradients clipped to norm "
            f"1.0 after unscaling):\n{m}"))


def test_clips_after_unscaling(exercise):
    """The true gradient norm is far above 1e-3, so the clipped step moves the weights by exactly
    lr × grad_clip = 1e-4. Clipping the scaled gradients (before unscale_) and unscaling them
    afterwards moves them about 65536 times less; not clipping moves them more."""
    model, inputs, targets, opt = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    scaler = torch.amp.GradScaler("cpu")
    scale = scaler.get_scale()
    exercise.training_step(model, inputs, targets, opt, "16-mixed", scaler, grad_clip=1e-3)
    moved = torch.sqrt(sum(((p - b) ** 2).sum() for p, b in zip(model.parameters(), before))).item()
    expected = 0.1 * 1e-3
    hint = ""
    if moved < 0.5 * expected:
        hint = (f" It moved {expected / moved:.3g}× too little" if moved > 0 else " It did not move") + (
            f": clipping before unscaling clips the scaled gradients (scale {scale:.0f}) to norm 1e-3, and "
            "unscaling then divides them by the scale again. Call scaler.unscale_(optimizer) before "
            "torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip).")
    elif moved > 1.01 * expected:
        hint = (f" It moved {moved / expected:.3g}× too far: the gradients were not clipped to grad_clip "
                "(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip) after unscaling, before the step).")
    assert 0.95 * expected <= moved <= 1.01 * expected, (
        f"SGD with lr 0.1 and the gradient norm clipped to grad_clip=1e-3 moves the weights by lr × 1e-3 = "
        f"{expected:.1e} (the true norm is far larger); they moved by {moved:.3e}.{hint}")


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_skips_a_step_with_inf(exercise, precision):
    """An inf input makes the loss and the gradients inf/NaN: the step is skipped and reported
    so, without a scaler (bf16-mixed: skip optimizer.step() yourself) and with one (16-mixed:
    scaler.step skips by itself, but the result must still say skipped, and the scale backs off)."""
    row, col = torch.randint(0, 8, ()), torch.randint(0, 16, ())     # before _setup, which seeds 0
    model, inputs, targets, opt = _setup()
    inputs[row, col] = float("inf")
    before = [p.detach().clone() for p in model.parameters()]
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    scale = scaler.get_scale() if scaler else None
    result = exercise.training_step(model, inputs, targets, opt, precision, scaler)
    assert result["skipped"] is True, (
        f"{precision}: an inf in the inputs makes the loss and the gradient norm inf/NaN: result['skipped'] should "
        f"be True, got {result['skipped']!r} (check math.isfinite of the gradient norm and of the loss"
        + (", with a scaler too: scaler.step skips the update by itself, but training_step still reports it)"
           if scaler else ")"))
    changed = [i for i, (a, b) in enumerate(zip(model.parameters(), before)) if not torch.equal(a, b)]
    assert not changed, (
        f"{precision}: a skipped step changed parameters {changed}: "
        + ("with a scaler, step through scaler.step(optimizer), which skips when it found inf"
           if scaler else "without a scaler, call optimizer.step() only when the gradient norm and the loss "
                          "are finite"))
    if scaler:
        assert scaler.get_scale() == scale * 0.5, (
            f"16-mixed: after an overflow the scaler's scale should back off from {scale} to {scale * 0.5} "
            f"(call scaler.update() after scaler.step); it is {scaler.get_scale()}")


def test_clear_errors(exercise):
    model, inputs, targets, opt = _setup()
    with pytest.raises(ValueError, match="^scaler:"):
        exercise.training_step(model, inputs, targets, opt, "16-mixed")
    with pytest.raises(ValueError, match="^precision:"):
        exercise.training_step(model, inputs, targets, opt, "fp8")
