"""Tests for exercise 09b (one-sided paired t-test of the rollout baseline): the statistic
against float64 sums, the p-value against a numerical integral of Student's t density,
the package's `flashlab.train.tsp_train.paired_t_test_less`, and the degenerate cases."""

import math

import pytest
import torch

from flashlab.train.tsp_train import paired_t_test_less as package_test


def _t_statistic(a, b):
    d = (a - b).double()
    n = d.numel()
    mean = d.sum() / n
    s = torch.sqrt(((d - mean) ** 2).sum() / (n - 1))
    return (mean / (s / math.sqrt(n))).item()


def _t_cdf_by_integration(t, df, steps=200_000):
    """P(T ≤ t) = 1/2 + sign(t)·∫_0^|t| f(x) dx, Simpson's rule on Student's t density f."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    x = torch.linspace(0.0, abs(t), steps + 1, dtype=torch.float64)
    f = torch.exp(log_c - (df + 1) / 2 * torch.log1p(x * x / df))
    h = abs(t) / steps
    area = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return 0.5 + math.copysign(area.item(), t)


@pytest.mark.parametrize("n", [2, 5, 30, 1000])
def test_statistic_and_p_value(exercise, n):
    b = 3.8 + 0.3 * torch.rand(n, dtype=torch.float64)              # TSP20-like tour lengths
    a = b + 0.02 * torch.randn(n, dtype=torch.float64) - 0.005      # a slightly better policy, noisy
    t, p = exercise.paired_t_test_less(a, b)
    assert isinstance(t, float) and isinstance(p, float)
    assert t == pytest.approx(_t_statistic(a, b), rel=1e-12), "t = mean(d) / (s / √n), s with divisor n − 1"
    assert p == pytest.approx(_t_cdf_by_integration(t, n - 1), abs=1e-9), "p = P(T ≤ t) with n − 1 degrees of freedom"


def test_float32_inputs_are_tested_in_float64(exercise):
    b = 3.8 + 0.3 * torch.rand(5000)
    a = b + 0.01 * torch.randn(5000)
    t, _ = exercise.paired_t_test_less(a, b)
    assert t == pytest.approx(_t_statistic(a, b), rel=1e-10), "take d = (a − b).double() before the mean and s"


def test_one_sided_and_directional(exercise):
    """Clearly shorter tours give a small p, clearly longer a p near 1; swapping a and b
    negates t and turns p into 1 − p (a one-sided test, not a two-sided one)."""
    b = 4.0 + torch.rand(200, dtype=torch.float64)
    a = b - 0.05 + 0.05 * torch.randn(200, dtype=torch.float64)
    t, p = exercise.paired_t_test_less(a, b)
    assert t < 0 and p < 1e-6
    t_swapped, p_swapped = exercise.paired_t_test_less(b, a)
    assert t_swapped == pytest.approx(-t, rel=1e-12) and p_swapped == pytest.approx(1 - p, abs=1e-12)
    a_noise = b + 0.05 * torch.randn(200, dtype=torch.float64)
    t0, p0 = exercise.paired_t_test_less(a_noise, b)
    assert p0 == pytest.approx(_t_cdf_by_integration(t0, 199), abs=1e-9)


@pytest.mark.parametrize("n", [3, 40])
def test_matches_the_package(exercise, n):
    b = 5.7 + torch.rand(n)
    a = b + 0.1 * torch.randn(n)
    t, p = exercise.paired_t_test_less(a, b)
    want_t, want_p = package_test(a, b)
    assert t == pytest.approx(want_t, rel=1e-12) and p == pytest.approx(want_p, abs=1e-12)


def test_no_spread(exercise):
    """Every difference the same: the sign of the mean decides, with certainty."""
    b = torch.tensor([3.0, 4.0, 5.0, 6.0], dtype=torch.float64)
    assert exercise.paired_t_test_less(b - 0.25, b) == (-math.inf, 0.0)
    assert exercise.paired_t_test_less(b + 0.25, b) == (math.inf, 1.0)
    assert exercise.paired_t_test_less(b, b) == (math.inf, 1.0), "no difference at all is no evidence: p = 1"
