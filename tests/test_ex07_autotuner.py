"""Tests for exercise 07 (the autotuner's decision), with fake kernels and fake timings."""

import pytest
import torch


class FakeKernel:
    """run(config) writes into one shared output buffer, as a real kernel launch does;
    ``wrong`` configs compute a wrong answer, ``broken`` ones raise."""

    def __init__(self, ms, wrong=(), broken=()):
        self.ms, self.wrong, self.broken = ms, set(wrong), set(broken)
        self.answer = torch.randn(64)
        self.out = torch.empty(64)
        self.last = None
        self.timed = []

    def run(self, config):
        if config in self.broken:
            raise RuntimeError("out of resources: shared memory")
        self.last = config
        self.out.copy_(self.answer * (1.5 if config in self.wrong else 1.0))
        return (self.out,)

    def time_ms(self, fn):
        fn()
        self.timed.append(self.last)
        return self.ms[self.last]


def test_relative_error(exercise):
    b = torch.tensor([3.0, 4.0])
    assert exercise.relative_error(b + torch.tensor([0.0, 0.5]), b) == pytest.approx(0.1)
    assert exercise.relative_error(b, b) == 0.0


def test_fastest_correct_config_wins(exercise):
    kernel = FakeKernel({"a": 3.0, "b": 1.0, "c": 2.0})
    chosen, log = exercise.choose_config(["a", "b", "c"], kernel.run, kernel.time_ms, tolerance=1e-3)
    assert chosen == "b"
    assert log == {"a": 3.0, "b": 1.0, "c": 2.0}
    assert sorted(kernel.timed) == ["a", "b", "c"], "time each config exactly once"


def test_wrong_and_broken_configs_are_rejected(exercise):
    """The outputs are compared after every run although the kernel reuses its buffer."""
    kernel = FakeKernel({"a": 3.0, "b": 1.0, "c": 2.0, "d": 0.1}, wrong={"b"}, broken={"d"})
    chosen, log = exercise.choose_config(["a", "b", "c", "d"], kernel.run, kernel.time_ms, tolerance=1e-3)
    assert chosen == "c"
    assert isinstance(log["b"], str) and isinstance(log["d"], str) and "RuntimeError" in log["d"]
    assert "b" not in kernel.timed and "d" not in kernel.timed, "rejected configs are not timed"


def test_noise_does_not_replace_the_default(exercise):
    kernel = FakeKernel({"a": 1.0, "b": 0.99})
    assert exercise.choose_config(["a", "b"], kernel.run, kernel.time_ms, tolerance=1e-3)[0] == "a"
    kernel = FakeKernel({"a": 1.0, "b": 0.9})
    assert exercise.choose_config(["a", "b"], kernel.run, kernel.time_ms, tolerance=1e-3)[0] == "b"


def test_a_broken_default_hands_the_reference_to_the_next(exercise):
    kernel = FakeKernel({"b": 2.0, "c": 1.0}, broken={"a"})
    chosen, log = exercise.choose_config(["a", "b", "c"], kernel.run, kernel.time_ms, tolerance=1e-3)
    assert chosen == "c" and isinstance(log["a"], str)


def test_nothing_runs(exercise):
    kernel = FakeKernel({}, broken={"a", "b"})
    with pytest.raises(RuntimeError) as raised:
        exercise.choose_config(["a", "b"], kernel.run, kernel.time_ms, tolerance=1e-3)
    if raised.type is NotImplementedError:       # a subclass of RuntimeError: the stub, not an answer
        raise raised.value
    assert "'a'" in str(raised.value) and "'b'" in str(raised.value)
