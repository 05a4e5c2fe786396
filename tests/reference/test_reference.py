"""The error metrics every other test relies on must themselves be right."""

import math

import pytest
import torch

from flashlab import assert_close, max_abs_error, rel_error


def test_rel_error_is_the_relative_frobenius_norm():
    ref = torch.randn(5, 7, dtype=torch.float64)
    noise = torch.randn(5, 7, dtype=torch.float64)
    out = ref + 1e-3 * noise
    assert rel_error(out, ref) == pytest.approx(1e-3 * noise.norm().item() / ref.norm().item())
    assert max_abs_error(out, ref) == pytest.approx(1e-3 * noise.abs().max().item())
    assert rel_error(ref, ref) == 0.0


def test_nan_and_inf_never_pass():
    ref = torch.ones(4)
    for bad in (float("nan"), float("inf")):
        out = ref.clone()
        out[2] = bad
        assert math.isnan(rel_error(out, ref))
        with pytest.raises(AssertionError):
            assert_close(out, ref, tol=1.0)


def test_assert_close_uses_dtype_tolerance():
    ref = torch.randn(100, dtype=torch.float64)
    assert_close((ref * (1 + 1e-3)).half(), ref)  # fp16 tolerance 3e-3
    with pytest.raises(AssertionError, match="relative error"):
        assert_close((ref * (1 + 1e-3)).float(), ref)  # fp32 tolerance 1e-5


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="^out:"):
        rel_error(torch.ones(3), torch.ones(4))
