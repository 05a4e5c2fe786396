"""Exercise 09b: when to replace the rollout baseline, a one-sided paired t-test
(notebook 09_capstone; the package's version is `flashlab.train.tsp_train.paired_t_test_less`).

REINFORCE with a greedy-rollout baseline (Kool et al. 2019) keeps a frozen copy of the
policy. At the end of each epoch both tour the same evaluation instances greedily; the
copy is replaced only if the policy's tours are shorter *significantly*: a one-sided
paired t-test of H1 "mean(policy) < mean(baseline)" at level α = 0.05. Paired, because
both tour the same instances: the test looks at the per-instance differences.

Test: ``make test-ex EX=09b`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex09b_rollout_baseline.py``)
"""

import math  # noqa: F401  (you will need it)

import torch

from flashlab.train.tsp_train import student_t_cdf  # noqa: F401  student_t_cdf(t, df) = P(T ≤ t), given


def paired_t_test_less(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """One-sided paired t-test of H1: mean(a) < mean(b).

    Args:
        a, b: ``(n,)`` paired samples (e.g. tour lengths of the same n ≥ 2 instances).
    Returns:
        ``(t, p)`` as Python floats. With the differences d = (a − b) in float64
        (``(a - b).double()``), their mean d̄ and sample standard deviation s (divisor
        n − 1): t = d̄ / (s / √n), and p = P(T ≤ t) for Student's t with n − 1 degrees of
        freedom (``student_t_cdf(t, n - 1)``): small p is evidence that a is smaller.
        When s = 0 (every difference equal): ``(-inf, 0.0)`` if d̄ < 0, else ``(inf, 1.0)``.
    """
    raise NotImplementedError
