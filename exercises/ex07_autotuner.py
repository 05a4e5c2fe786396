"""Exercise 07: the autotuner's decision (notebook 07, `flashlab.launch.autotune.decide`).

A kernel has several candidate configurations (tile sizes, warps, pipeline stages). An
autotuner runs each one once, compares its outputs with a reference, times it, and then
decides, from those measurements alone, which configuration to keep. The decision has
three safeguards:

- a configuration that failed to run (e.g. Triton's OutOfResources: too much shared
  memory) is skipped, not fatal;
- a configuration whose outputs disagree with the reference is rejected: a compiler bug
  must never win on speed (flashlab's tuner found wrong dK tiles this way);
- timings are noisy, so a challenger must beat the default clearly (by the factor
  ``margin``) to replace it.

The package's tuner (`flashlab.launch.autotune.Autotuner._tune`) measures; this function, the same
as `flashlab.launch.autotune.decide`, decides.

Test: ``make test-ex EX=07`` (or ``.venv/bin/python -m pytest tests/exercises/test_ex07_autotuner.py``)
"""


def decide(configs, trials: dict, tolerance: float, margin: float = 0.97):
    """Choose a configuration from measurements. Returns ``(chosen, log)``.

    - ``configs``: the candidates in order, the default (``configs[0]``) first; any hashable
      objects.
    - ``trials[config]`` is either a pair ``(ms, error)`` for a config that ran (its time in
      milliseconds, and the normwise relative error of its outputs against the reference),
      or a string saying why it failed to run. A config missing from ``trials`` was not run:
      treat it as failed with the reason ``"not run"``.
    - Skip failed configs. Reject a config whose ``error`` is not ≤ ``tolerance`` (so NaN is
      rejected too).
    - ``chosen``: the fastest accepted config, except that the default is kept when it was
      accepted and the fastest is not strictly faster than ``margin`` × the default's time.
    - ``log``: every config in ``configs`` → its time (the float ``ms``) if accepted, else a
      string: ``"failed: <reason>"`` for a failed config, and for a rejected one a string
      that contains ``"disagrees"`` and the error.
    - If no config is accepted, raise RuntimeError whose message names every config and its
      log entry.
    """
    raise NotImplementedError
