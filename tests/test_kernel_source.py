"""flashlab.kernel_source: what notebooks 05 and 06 use to show the kernels' features."""

import pytest

from flashlab import flash_minimal, flash_triton
from flashlab.kernel_source import feature_lines, kernel_parts, part_containing


def test_kernel_parts_follow_the_calls_of_a_kernel():
    parts = kernel_parts(flash_triton, "flash_forward_kernel")
    assert next(iter(parts)) == "flash_forward_kernel"
    assert len(parts) > 1                                           # the helpers it calls, found by name
    loop = part_containing(parts, "for start_n in range")
    assert "exp2" in parts[loop]
    assert list(kernel_parts(flash_minimal, "minimal_forward_kernel")) == ["minimal_forward_kernel"]


def test_feature_lines_show_code_lines_under_their_function():
    text = feature_lines(kernel_parts(flash_minimal, "minimal_dkdv_kernel"), "delta")
    assert text.startswith("# in minimal_dkdv_kernel:")
    assert "ds = p * (dp - delta[:, None])" in text
    assert "def " not in text and "DELTA, DK" not in text       # not the signature


def test_missing_kernel_needle_or_ambiguous_part_fail_clearly():
    with pytest.raises(ValueError, match="kernel: .* no function 'nope'"):
        kernel_parts(flash_minimal, "nope")
    parts = kernel_parts(flash_minimal, "minimal_forward_kernel")
    with pytest.raises(ValueError, match=r"needles: \['no such code'\]"):
        feature_lines(parts, "tl.dot", "no such code")
    with pytest.raises(ValueError, match="text: "):
        part_containing(parts, "no such code")
