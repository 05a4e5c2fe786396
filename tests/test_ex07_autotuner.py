"""Tests for exercise 07 (the autotuner's decision) on made-up measurements. (That the
package's `flashlab.autotune.decide` answers as the solution does: tests/test_autotune.py.)"""

import math
import random

import pytest

A, B, C, D = "a", "b", "c", "d"


@pytest.fixture
def decide(exercise):
    return exercise.decide


def test_the_fastest_accepted_config_wins(decide):
    chosen, log = decide([A, B, C], {A: (3.0, 0.0), B: (1.0, 1e-4), C: (2.0, 2e-4)}, tolerance=1e-3)
    assert chosen == B
    assert log == {A: 3.0, B: 1.0, C: 2.0}


def test_failed_and_disagreeing_configs_are_never_chosen(decide):
    trials = {A: (3.0, 0.0), B: (0.5, 0.2), C: (2.0, 0.0), D: "OutOfResources: shared memory"}
    chosen, log = decide([A, B, C, D], trials, tolerance=1e-3)
    assert chosen == C
    assert log[A] == 3.0 and log[C] == 2.0
    assert log[D].startswith("failed: ") and "OutOfResources" in log[D]
    assert "disagrees" in log[B] and "2.00e-01" in log[B]


def test_the_error_bound_is_inclusive_and_nan_is_rejected(decide):
    assert decide([A, B], {A: (3.0, 0.0), B: (1.0, 1e-3)}, tolerance=1e-3)[0] == B
    chosen, log = decide([A, B], {A: (3.0, 0.0), B: (1.0, math.nan)}, tolerance=1e-3)
    assert chosen == A and "disagrees" in log[B]


def test_noise_does_not_replace_the_default(decide):
    assert decide([A, B], {A: (1.0, 0.0), B: (0.98, 0.0)}, tolerance=1e-3)[0] == A
    assert decide([A, B], {A: (1.0, 0.0), B: (0.97, 0.0)}, tolerance=1e-3)[0] == A, "strictly faster than 0.97×"
    assert decide([A, B], {A: (1.0, 0.0), B: (0.96, 0.0)}, tolerance=1e-3)[0] == B
    assert decide([A, B], {A: (1.0, 0.0), B: (0.8, 0.0)}, tolerance=1e-3, margin=0.7)[0] == A


def test_without_the_default_the_fastest_wins(decide):
    """A failed or missing default: no margin to apply, the fastest accepted config wins."""
    chosen, log = decide([A, B, C], {A: "RuntimeError: boom", B: (2.0, 0.0), C: (1.99, 0.0)}, tolerance=1e-3)
    assert chosen == C and log[A] == "failed: RuntimeError: boom"
    chosen, log = decide([A, B], {B: (2.0, 0.0)}, tolerance=1e-3)
    assert chosen == B and log == {A: "failed: not run", B: 2.0}


def test_nothing_accepted(decide):
    with pytest.raises(RuntimeError) as raised:
        decide([A, B], {A: "OutOfResources", B: (1.0, 0.5)}, tolerance=1e-3)
    if raised.type is NotImplementedError:       # a subclass of RuntimeError: the stub, not an answer
        raise raised.value
    assert "a" in str(raised.value) and "OutOfResources" in str(raised.value) and "disagrees" in str(raised.value)


def test_random_measurements_against_a_brute_force_rule(decide):
    """The rule restated independently: the accepted configs, the fastest of them, the default
    kept unless strictly beaten by the margin."""
    rng = random.Random(7)
    for _ in range(300):
        configs = [f"c{i}" for i in range(rng.randint(1, 6))]
        trials = {}
        for c in configs:
            kind = rng.random()
            if kind < 0.15:
                trials[c] = "failed to compile"
            elif kind < 0.25:
                continue                                        # not run
            else:
                trials[c] = (rng.choice([1.0, 0.99, 0.97, 0.9, 2.0, rng.uniform(0.5, 2)]),
                             rng.choice([0.0, 1e-4, 1e-3, 2e-3, math.nan]))
        accepted = {c: t[0] for c, t in trials.items() if not isinstance(t, str) and t[1] <= 1e-3}
        if not accepted:
            with pytest.raises(RuntimeError):
                decide(configs, trials, tolerance=1e-3)
            continue
        chosen, log = decide(configs, trials, tolerance=1e-3)
        fastest = min(accepted.values())
        default = configs[0]
        if default in accepted and not fastest < 0.97 * accepted[default]:
            assert chosen == default
        else:
            assert accepted[chosen] == fastest
        assert set(log) == set(configs)
        assert all(log[c] == accepted[c] for c in accepted)
        assert all(isinstance(log[c], str) for c in configs if c not in accepted)
