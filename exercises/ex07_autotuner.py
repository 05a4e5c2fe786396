"""Exercise 07: the autotuner's decision (notebook 07, `flashlab/autotune.py`).

A kernel has several candidate configurations (tile sizes, warps, pipeline stages). An
autotuner runs each one, times it, and keeps the fastest, with three safeguards:

- a configuration that fails to run (e.g. Triton's OutOfResources: too much shared
  memory) is skipped, not fatal;
- a configuration whose outputs disagree with the default's is rejected: a compiler bug
  must never win on speed (flashlab's tuner found wrong dK tiles this way);
- timings are noisy, so a challenger must beat the default clearly (by the factor
  ``margin``) to replace it.

Test: ``pytest tests/test_ex07_autotuner.py``
"""


def relative_error(a, b) -> float:
    """Normwise relative error ‖a − b‖ / ‖b‖ of two tensors (as float64)."""
    raise NotImplementedError


def choose_config(configs, run, time_ms, tolerance: float, margin: float = 0.97):
    """Pick a configuration. Returns ``(chosen, log)``.

    - ``configs``: the candidates, the default first (any hashable objects).
    - ``run(config)``: runs the kernel once with ``config`` and returns a tuple of output
      tensors. It may raise any Exception: then skip that config.
    - ``time_ms(fn)``: the time of calling ``fn()`` in milliseconds (a benchmark function).
      Time a config as ``time_ms(lambda: run(config))``, once, and only if it was accepted.
    - The reference outputs are those of the first config that runs (normally the default).
      Reject a config if ``max(relative_error(out, ref))`` over its outputs exceeds
      ``tolerance``.
    - ``chosen``: the fastest accepted config, except that the default (``configs[0]``)
      is kept when it was accepted and the fastest is not faster than ``margin`` × the
      default's time.
    - ``log``: dict config → its time (float) if timed, or a string saying why it was rejected
      (for a config that raised, include the exception's class name).
    - If no config runs at all, raise RuntimeError naming the configs that were tried.
    """
    raise NotImplementedError
