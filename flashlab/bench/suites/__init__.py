"""The measurement suites, by name, in the order `python -m flashlab.bench list` shows them. Each
module declares its suite (`flashlab.bench.suite.Suite`: what it measures, its shapes, its budget,
its record) beside the code that runs it; the record of each is results/<gpu>/<record>.json.

The standard benchmark and the notebooks' records first, then the checks (tests, kernel resources)."""

from __future__ import annotations

from flashlab.bench.suite import Suite
from flashlab.bench.suites import (
    attention,
    claims,
    decode_table,
    decode_varlen,
    dropin,
    gpu_tests,
    hopper_ladder,
    host_time,
    kernel_resources,
    kernel_resources_aot,
    mixed_precision_memory,
    mqar_training,
    notebooks,
    python_layers,
    rl4co_step,
    roofline,
    small_launches,
    small_table,
    softmax,
    train,
    tsp_encoder,
    tsp_inference,
    tsp_step,
)

_ALL: list[Suite] = [
    attention.SUITE, softmax.SUITE, roofline.SUITE, hopper_ladder.SUITE, claims.SUITE, small_table.SUITE,
    small_launches.SUITE, tsp_step.SUITE, host_time.SUITE, python_layers.SUITE, tsp_encoder.SUITE, rl4co_step.SUITE,
    decode_varlen.SUITE, decode_table.SUITE, tsp_inference.SUITE, *train.SUITES, mixed_precision_memory.SUITE,
    mqar_training.SUITE,
    dropin.SUITE, kernel_resources.SUITE, kernel_resources_aot.SUITE, gpu_tests.SUITE,
    notebooks.SUITE,
]
SUITES: dict[str, Suite] = {suite.name: suite for suite in _ALL}
assert len(SUITES) == len(_ALL), "two suites share a name"
assert len({s.record for s in _ALL}) == len(_ALL), "two suites share a record"
