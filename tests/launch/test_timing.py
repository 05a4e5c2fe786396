"""The measuring layer: FLOP counts, peak FLOP/s lookup, the CPU timer."""

import time

import pytest
import torch

from flashlab.launch.timing import PEAK_FLOPS, Stopwatch, attention_flops, extra_memory, peak_flops, time_ms, wall_ms


def test_flops_are_counted_as_the_papers_do():
    forward = 4 * 2 * 16 * 1024**2 * 64
    assert attention_flops(2, 16, 1024, 64, False, "fwd") == forward
    assert attention_flops(2, 16, 1024, 64, True, "fwd") == forward / 2
    assert attention_flops(2, 16, 1024, 64, False, "bwd") == 2.5 * forward
    assert attention_flops(2, 16, 1024, 64, True, "fwd+bwd") == 3.5 * forward / 2


def test_peak_flops_by_gpu_name_and_compute_dtype():
    assert peak_flops("NVIDIA H200", torch.bfloat16) == PEAK_FLOPS["H200"]["bf16"]
    assert peak_flops("NVIDIA A100-SXM4-80GB", torch.float16) == PEAK_FLOPS["A100"]["fp16"]
    assert peak_flops("a GPU nobody listed", torch.bfloat16) is None
    allowed = torch.backends.cuda.matmul.allow_tf32
    try:                                    # fp32 matmuls run at the TF32 rate only when allowed
        torch.backends.cuda.matmul.allow_tf32 = False
        assert peak_flops("NVIDIA H100 80GB HBM3", torch.float32) == PEAK_FLOPS["H100"]["fp32"]
        torch.backends.cuda.matmul.allow_tf32 = True
        assert peak_flops("NVIDIA H100 80GB HBM3", torch.float32) == PEAK_FLOPS["H100"]["tf32"]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


def test_cpu_timer_reports_the_median_in_milliseconds():
    assert time_ms(lambda: time.sleep(0.02), "cpu", cpu_runs=3) == pytest.approx(20, rel=0.5)
    assert extra_memory(lambda: None, "cpu") is None


def test_cpu_timing_honours_warmup_and_rep_ms():
    """On a CPU, time_ms runs for warmup_ms and then rep_ms (bench's --warmup-ms/--rep-ms), with
    at least cpu_runs timed calls: it used to time 5 calls after one warm-up whatever was asked,
    and a slow first call could then be the median's neighbour."""
    import time

    from flashlab.launch.timing import time_ms
    calls = []

    def quick():
        calls.append(1)
        time.sleep(0.001)

    time_ms(quick, "cpu", warmup_ms=20, rep_ms=60)
    assert len(calls) >= 20                        # ~1 ms a call over 80 ms (sleep overshoots; the old timer: 6)
    calls.clear()
    time_ms(quick, "cpu", warmup_ms=0, rep_ms=0, cpu_runs=7)
    assert len(calls) == 1 + 7                     # one warm-up call, then cpu_runs


def test_wall_clock_timer_counts_back_to_back_calls_after_the_warm_up():
    """wall_ms: each round runs ``warmup`` untimed calls, then ``calls`` timed together; the median
    round's time per call. A call that sleeps 3 ms (then 30 ms in one round of three) reads ~3 ms."""
    calls = []
    assert wall_ms(lambda: calls.append(1), calls=3, device="cpu", warmup=2, repeats=4) < 5
    assert len(calls) == (2 + 3) * 4
    naps = iter([0.003] * 5 + [0.030] * 5 + [0.003] * 5)
    ms = wall_ms(lambda: time.sleep(next(naps)), calls=5, device="cpu", repeats=3)
    assert 2.9 < ms < 15, ms                                    # the median round, not the mean
    watch = Stopwatch()
    time.sleep(0.01)
    assert 0.009 < watch.seconds() < 1
