"""Tests for exercise 07 (the autotuner's decision) on made-up measurements. (That the
package's `flashlab.launch.autotune.decide` answers as the solution does: tests/launch/test_autotune.py.)"""

import math
import random
import re

import pytest

A, B, C, D = "a", "b", "c", "d"


@pytest.fixture
def decide(exercise):
    return exercise.decide


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", text)]


def test_the_fastest_accepted_config_wins(decide):
    chosen, log = decide([A, B, C], {A: (3.0, 0.0), B: (1.0, 1e-4), C: (2.0, 2e-4)}, tolerance=1e-3)
    assert chosen == B, (f"every config is accepted and b (1.0 ms) is the fastest, 3× faster than the default; "
                         f"chose {chosen!r}")
    assert log == {A: 3.0, B: 1.0, C: 2.0}, f"an accepted config's log entry is its time in ms (a float); got {log}"


def test_failed_and_disagreeing_configs_are_never_chosen(decide):
    trials = {A: (3.0, 0.0), B: (0.5, 0.2), C: (2.0, 0.0), D: "OutOfResources: shared memory"}
    chosen, log = decide([A, B, C, D], trials, tolerance=1e-3)
    assert chosen == C, (f"b is fastest but its error 0.2 > tolerance 1e-3 (rejected), d failed to run: c (2.0 ms) "
                         f"should win; chose {chosen!r}")
    assert log[A] == 3.0 and log[C] == 2.0, f"accepted configs are logged with their time in ms; got {log}"
    assert log[D].startswith("failed: ") and "OutOfResources" in log[D], (
        "a failed config is logged as 'failed: <reason>', here 'failed: OutOfResources: shared memory'; "
        f"got {log[D]!r}")
    assert "disagrees" in log[B] and any(math.isclose(x, 0.2, rel_tol=0.01) for x in _numbers(log[B])), (
        f"a rejected config's log entry contains 'disagrees' and its error (0.2 here, in any float format, e.g. "
        f"f'disagrees with the reference: relative error {{error:.2e}}'); got {log[B]!r}")


def test_the_error_bound_is_inclusive_and_nan_is_rejected(decide):
    chosen = decide([A, B], {A: (3.0, 0.0), B: (1.0, 1e-3)}, tolerance=1e-3)[0]
    assert chosen == B, (f"an error equal to the tolerance is accepted (error ≤ tolerance): b should win; "
                         f"chose {chosen!r}")
    chosen, log = decide([A, B], {A: (3.0, 0.0), B: (1.0, math.nan)}, tolerance=1e-3)
    assert chosen == A and "disagrees" in log[B], (
        f"a NaN error must be rejected (write `not error <= tolerance`: every comparison with NaN is False, so "
        f"`error > tolerance` lets NaN through); chose {chosen!r}, log {log}")


def test_noise_does_not_replace_the_default(decide):
    for ms, margin, want in ((0.98, 0.97, A), (0.97, 0.97, A), (0.96, 0.97, B), (0.8, 0.7, A)):
        chosen = decide([A, B], {A: (1.0, 0.0), B: (ms, 0.0)}, tolerance=1e-3, margin=margin)[0]
        assert chosen == want, (
            f"default a 1.0 ms, challenger b {ms} ms, margin {margin}: b replaces the default only when strictly "
            f"faster than margin × 1.0 = {margin} ms, so {want!r} should be chosen; chose {chosen!r}")


def test_the_margin_is_a_factor_not_an_amount(decide):
    """margin multiplies the default's time: the bar is margin × default, whatever the scale
    of the times (a default of 10 ms needs 0.3 ms less; one of 0.1 ms only 0.003 ms less)."""
    for default_ms, ms, want in ((10.0, 9.8, A), (10.0, 9.6, B), (0.1, 0.08, B), (0.1, 0.098, A)):
        chosen = decide([A, B], {A: (default_ms, 0.0), B: (ms, 0.0)}, tolerance=1e-3, margin=0.97)[0]
        assert chosen == want, (
            f"default a {default_ms} ms, challenger b {ms} ms, margin 0.97: b replaces the default only when "
            f"strictly faster than margin × default = 0.97 × {default_ms} = {0.97 * default_ms:.4g} ms (a factor, "
            f"not default − (1 − margin) = {default_ms - 0.03:.4g} ms), so {want!r} should be chosen; "
            f"chose {chosen!r}")


def test_without_the_default_the_fastest_wins(decide):
    """A failed or missing default: no margin to apply, the fastest accepted config wins."""
    chosen, log = decide([A, B, C], {A: "RuntimeError: boom", B: (2.0, 0.0), C: (1.99, 0.0)}, tolerance=1e-3)
    assert chosen == C and log[A] == "failed: RuntimeError: boom", (
        f"the default a failed: no margin applies, the fastest accepted config c (1.99 ms) wins; chose {chosen!r}, "
        f"log {log}")
    chosen, log = decide([A, B], {B: (2.0, 0.0)}, tolerance=1e-3)
    assert chosen == B and log == {A: "failed: not run", B: 2.0}, (
        f"a config missing from trials is logged 'failed: not run' and b wins; chose {chosen!r}, log {log}")


def test_nothing_accepted(decide):
    with pytest.raises(RuntimeError) as raised:
        decide([A, B], {A: "OutOfResources", B: (1.0, 0.5)}, tolerance=1e-3)
    if raised.type is NotImplementedError:       # a subclass of RuntimeError: the stub, not an answer
        raise raised.value
    message = str(raised.value)
    assert "a" in message and "OutOfResources" in message and "disagrees" in message, (
        f"the RuntimeError's message should name every config with its log entry; got {message!r}")


def _brute_force(configs, trials, tolerance=1e-3, margin=0.97):
    """The rule restated independently: (the configs the answer may choose, the accepted times)."""
    accepted = {c: t[0] for c, t in trials.items() if not isinstance(t, str) and t[1] <= tolerance}
    if not accepted:
        return None, accepted
    fastest = min(accepted.values())
    default = configs[0]
    if default in accepted and not fastest < margin * accepted[default]:
        return {default}, accepted
    return {c for c, ms in accepted.items() if ms == fastest}, accepted


def test_random_measurements_against_a_brute_force_rule(decide):
    """The rule restated independently: the accepted configs, the fastest of them, the default
    kept unless strictly beaten by the margin. The first case that disagrees is printed."""
    rng = random.Random(7)
    for case in range(300):
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
        allowed, accepted = _brute_force(configs, trials)
        where = f"case {case}: decide({configs}, {trials}, tolerance=1e-3)"
        if allowed is None:
            try:
                answer = decide(configs, trials, tolerance=1e-3)
            except RuntimeError as error:
                if isinstance(error, NotImplementedError):
                    raise
                continue
            raise AssertionError(f"{where}: no config is accepted, so it should raise RuntimeError; "
                                 f"returned {answer!r}")
        chosen, log = decide(configs, trials, tolerance=1e-3)
        assert chosen in allowed, (f"{where}: accepted {accepted}, default {configs[0]!r}; should choose one of "
                                   f"{sorted(allowed)}, chose {chosen!r} (log {log})")
        assert set(log) == set(configs), f"{where}: the log must have one entry per config; got {log}"
        wrong = {c: log[c] for c in configs
                 if (c in accepted and log[c] != accepted[c]) or (c not in accepted and not isinstance(log[c], str))}
        assert not wrong, (f"{where}: accepted configs log their time (a float), the others a string; wrong "
                           f"entries {wrong}")
