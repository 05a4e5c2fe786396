"""Exercise 09b, reference answer: the one-sided paired t-test of the rollout baseline."""

import math

import torch

from flashlab.train.tsp_train import student_t_cdf


def paired_t_test_less(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """One-sided paired t-test of H1: mean(a) < mean(b); returns (t, p)."""
    d = (a - b).double()
    n = d.numel()
    sd = d.std().item()                                   # sample standard deviation, divisor n − 1
    if sd == 0:                                           # no spread: the sign of the mean decides
        return (-math.inf, 0.0) if d.mean() < 0 else (math.inf, 1.0)
    t = d.mean().item() / (sd / math.sqrt(n))             # t = d̄ / (s / √n)
    return t, student_t_cdf(t, n - 1)                     # p = P(T ≤ t), n − 1 degrees of freedom
