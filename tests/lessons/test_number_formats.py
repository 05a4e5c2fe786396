"""Floating-point formats: ranges, rounding, and rounding a kernel's running state."""

import pytest
import torch

from flashlab.lessons.number_formats import FORMATS, format_properties, round_to
from flashlab.lessons.widgets import number_formats_report


@pytest.mark.parametrize("name,dtype", [("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_format_properties_agree_with_finfo(name, dtype):
    props, info = format_properties(name), torch.finfo(dtype)
    assert props["max"] == info.max and props["smallest normal"] == info.tiny and props["epsilon"] == info.eps


def test_rounding():
    assert round_to(1 + 2**-11, "fp16") == 1.0                        # half an ulp: ties to even
    assert round_to(70000.0, "fp16") == float("inf") and round_to(70000.0, "bf16") == 70144.0
    assert round_to(1 + 2**-11, "tf32") == 1.0 and round_to(1 + 3 * 2**-11, "tf32") == 1 + 2**-9
    assert round_to(1e-8, "fp16") == 0.0 and round_to(1e-8, "bf16") > 0  # fp16 underflows, bf16 does not
    assert "fp16" in number_formats_report(0.1) and len(number_formats_report(0.1).splitlines()) == len(FORMATS) + 1


def test_attention_state_precision():
    from flashlab import rel_error
    from flashlab.lessons.number_formats import attention_row_with_rounded_state

    torch.manual_seed(0)
    scores, values = torch.randn(1000, dtype=torch.float64) * 2, torch.randn(1000, 8, dtype=torch.float64)
    exact = torch.softmax(scores, 0) @ values
    assert rel_error(attention_row_with_rounded_state(scores, values, torch.float64), exact) < 1e-12
    fp32 = rel_error(attention_row_with_rounded_state(scores, values, torch.float32), exact)
    bf16 = rel_error(attention_row_with_rounded_state(scores, values, torch.bfloat16), exact)
    assert fp32 < 1e-6 < 1e-4 < bf16
