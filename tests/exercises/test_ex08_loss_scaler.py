"""Tests for exercise 08 (dynamic loss scaling), against torch.amp.GradScaler."""

import torch


def test_scale_and_unscale(exercise):
    w = torch.nn.Parameter(torch.randn(5))
    loss = (w * 3).sum()
    exercise.scale_loss(loss, 1024.0).backward()
    assert torch.allclose(w.grad, torch.full((5,), 3 * 1024.0)), (
        f"d(loss · 1024)/dw should be 3 · 1024 = 3072 everywhere; got {w.grad.tolist()} "
        "(scale_loss returns loss · scale)")
    found = exercise.unscale_grads_([w, torch.nn.Parameter(torch.zeros(2))], 1024.0)
    assert found is False, (f"finite gradients (and a parameter whose grad is None): unscale_grads_ should return "
                            f"False; got {found!r}")
    assert torch.allclose(w.grad, torch.full((5,), 3.0)), (
        f"after unscale_grads_(…, 1024) the gradient should be 3072 / 1024 = 3; got {w.grad.tolist()} "
        "(divide by the scale, in place)")
    for bad in ("inf", "nan"):
        w.grad[2] = float(bad)
        found = exercise.unscale_grads_([w], 2.0)
        assert found is True, (f"a gradient holding {bad} must be reported (return True, the step is skipped); got "
                               f"{found!r}" + (" (torch.isinf misses NaN: torch.isfinite catches both)"
                                               if bad == "nan" else ""))


def _changes(scales, start):
    """1-based steps at which the scale grew, and at which it shrank."""
    before = [start, *scales[:-1]]
    return ([i + 1 for i, (a, b) in enumerate(zip(before, scales)) if b > a],
            [i + 1 for i, (a, b) in enumerate(zip(before, scales)) if b < a])


def _compare_with_grad_scaler(exercise, pattern, growth_interval, replay=""):
    init = 2.0**10
    reference = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=growth_interval)
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    scale, tracker, mine, theirs = init, 0, [], []
    for overflow in pattern:
        loss = w.sum() * (float("inf") if overflow else 1.0)
        reference.scale(loss).backward()
        reference.step(opt)
        reference.update()
        opt.zero_grad()
        scale, tracker = exercise.update_scale(scale, tracker, overflow, growth_interval=growth_interval)
        mine.append(scale)
        theirs.append(reference.get_scale())
    if mine == theirs:
        return
    step = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b) + 1
    (grew, shrank), (want_grew, want_shrank) = _changes(mine, init), _changes(theirs, init)
    overflows = [i + 1 for i, o in enumerate(pattern) if o]
    hint = ""
    if grew != want_grew:
        hint = (f" After {growth_interval} clean steps in a row (growth_interval={growth_interval}, the count "
                f"restarting at 0 after every overflow and every growth) the scale should grow x2 at steps "
                f"{want_grew}; yours grew at steps {grew}.")
    if shrank != want_shrank:
        hint += (f" Every overflow should halve the scale, at steps {want_shrank}; yours shrank at steps {shrank}.")
    raise AssertionError(
        f"update_scale differs from torch.amp.GradScaler from step {step} on (steps counted from 1): expected "
        f"scale {theirs[step - 1]}, got {mine[step - 1]}.{hint}\n  overflow at steps {overflows} of "
        f"{len(pattern)}, starting from scale {init}\n  GradScaler's scales: {theirs}\n  yours:               {mine}"
        + replay)


def test_scale_sequence_matches_grad_scaler(exercise, seed):
    """The same pattern of overflowing steps gives GradScaler's scale sequence: a fixed pattern
    with growth and back-to-back overflows, then a random one with a random growth_interval."""
    _compare_with_grad_scaler(exercise, [False, False, True, False, False, False, False, True, True, False,
                                         False, False], growth_interval=3)
    growth_interval = int(torch.randint(2, 5, ()))
    _compare_with_grad_scaler(exercise, (torch.rand(20) < 0.2).tolist(), growth_interval,
                              replay=f"\n  (a random pattern: FLASHLAB_SEED={seed} make test-ex EX=08 replays it)")


def test_scaled_step_skips_on_overflow_and_keeps_small_gradients(exercise):
    """fp32 master weights, fp16 compute: the setting loss scaling is made for."""
    w = torch.nn.Parameter(torch.ones(4))
    (w.half() * 1e-8).sum().backward()
    assert torch.all(w.grad == 0), "without scaling a 1e-8 gradient flushes to zero in fp16"
    w.grad = None
    opt = torch.optim.SGD([w], lr=1e4)
    state = {"scale": 2.0**14, "growth_tracker": 0}
    stepped = exercise.scaled_step((w.half() * 1e-8).sum(), [w], opt, state)
    assert stepped is True, (
        f"step 1's gradients are finite (1e-8 · 2^14 ≈ 1.6e-4 in fp16): scaled_step should step the optimizer and "
        f"return True; it returned {stepped!r}")
    assert state["growth_tracker"] == 1, (
        f"after one clean step growth_tracker should be 1 (state updated in place); got {state['growth_tracker']}")
    torch.testing.assert_close(w.detach(), torch.full((4,), 1 - 1e-4), rtol=0, atol=1e-6,
                               msg=lambda m: "step 1 should move w by lr · 1e-8 = 1e-4 (gradients unscaled "
                                             f"before the step, not flushed to zero):\n{m}")
    before = w.detach().clone()
    overflow = (w.half() * 1e4).sum()          # its gradient 1e4 · 2^14 overflows fp16's 65504
    stepped = exercise.scaled_step(overflow, [w], opt, state)
    moved = not torch.equal(w.detach(), before)
    assert stepped is False and not moved, (
        "step 2 had an inf gradient (1e4 · scale 2^14 overflows fp16's 65504): the optimizer must not step "
        "(when unscale_grads_ finds inf/NaN, skip optimizer.step() and return False); "
        f"yours returned {stepped!r}" + (f" and changed w from {before.tolist()} to {w.detach().tolist()}"
                                          if moved else " (w unchanged)"))
    assert state["scale"] == 2.0**13 and state["growth_tracker"] == 0, (
        f"after the skipped step 2 the scale should halve to 2^13 = {2.0**13} and growth_tracker restart at 0; "
        f"got scale {state['scale']}, growth_tracker {state['growth_tracker']}")
    assert w.grad is None or torch.all(w.grad == 0), (
        f"gradients are cleared after a skipped step (zero_grad); w.grad is {w.grad.tolist()}")


def test_scaled_step_skips_on_a_non_finite_loss(exercise):
    """The loss itself overflows fp16 (a sum of four values of about 3·10⁴ each is past 65504:
    inf) while every gradient stays finite (3·10⁴ · scale 1): the gradients alone do not show
    it, so scaled_step must check the loss as well and skip the step."""
    w = torch.nn.Parameter(1 + torch.rand(4))
    before = w.detach().clone()
    opt = torch.optim.SGD([w], lr=0.1)
    state = {"scale": 1.0, "growth_tracker": 3}
    loss = (w.half() * 3e4).sum()
    assert not torch.isfinite(loss), "test inputs: the fp16 loss should overflow to inf"
    stepped = exercise.scaled_step(loss, [w], opt, state)
    moved = not torch.equal(w.detach(), before)
    assert stepped is False and not moved, (
        f"the loss is {loss.item()} (its fp16 sum overflowed) but every gradient is finite (3e4 · scale 1): "
        "scaled_step must not step and must return False when the loss is inf/NaN, not only when a "
        "gradient is (e.g. found_inf = unscale_grads_(…) or not math.isfinite(loss.item())); yours returned "
        f"{stepped!r}" + (f" and changed w from {before.tolist()} to {w.detach().tolist()}" if moved
                          else " (w unchanged)"))
    assert state["scale"] == 0.5 and state["growth_tracker"] == 0, (
        f"a skipped step counts as an overflow: the scale should halve from 1.0 to 0.5 and growth_tracker restart "
        f"at 0; got scale {state['scale']}, growth_tracker {state['growth_tracker']}")
    assert w.grad is None or torch.all(w.grad == 0), (
        f"gradients are cleared after a skipped step (zero_grad); w.grad is {w.grad.tolist()}")


def test_scaled_step_reads_the_optional_state_keys(exercise):
    """``state`` may carry its own growth_factor, growth_interval and backoff_factor; scaled_step
    must use them (passing them on to update_scale) rather than update_scale's defaults."""
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.0)
    state = {"scale": 8.0, "growth_tracker": 0, "growth_factor": 4.0, "growth_interval": 2, "backoff_factor": 0.25}
    for step in (1, 2):
        assert exercise.scaled_step(w.half().sum(), [w], opt, state) is True, (
            f"step {step} has finite gradients (1 · scale 8): scaled_step should step and return True")
    if state["scale"] != 32.0:
        hint = {16.0: " (that is growth_factor 2, the default: use state['growth_factor'] when it is there)",
                8.0: " (no growth yet: use state['growth_interval'] when it is there, not the default 2000)"}
        raise AssertionError(
            f"state {{'growth_interval': 2, 'growth_factor': 4.0}}: after 2 clean steps from scale 8 the scale should "
            f"grow to 8 · 4 = 32 with growth_tracker 0; got scale {state['scale']}, growth_tracker "
            f"{state['growth_tracker']}{hint.get(state['scale'], '')}. Pass state.get('growth_factor', 2.0), "
            "state.get('backoff_factor', 0.5) and state.get('growth_interval', 2000) on to update_scale.")
    assert state["growth_tracker"] == 0, (
        f"the scale grew at step 2, so growth_tracker should restart at 0; got {state['growth_tracker']}")
    overflow = (w.half() * 1e4).sum()                # gradient 1e4 · 32 overflows fp16's 65504
    assert exercise.scaled_step(overflow, [w], opt, state) is False, (
        "step 3's gradient 1e4 · scale 32 overflows fp16: scaled_step should skip the step and return False")
    assert state["scale"] == 8.0 and state["growth_tracker"] == 0, (
        f"state {{'backoff_factor': 0.25}}: an overflow at scale 32 should shrink it to 32 · 0.25 = 8 (tracker 0); got "
        f"scale {state['scale']}, growth_tracker {state['growth_tracker']}"
        + (" (that is backoff_factor 0.5, the default: use state['backoff_factor'] when it is there)"
           if state["scale"] == 16.0 else ""))
