"""Floating-point formats and precision modes."""

import pytest
import torch

from flashlab.precision import FORMATS, PRECISIONS, format_properties, get_precision, round_to
from flashlab.widgets import number_formats_report


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


def test_precision_modes():
    assert set(PRECISIONS) == {"32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"}
    assert get_precision("16-mixed").loss_scaling and not get_precision("bf16-mixed").loss_scaling
    assert get_precision("bf16-true").param_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="^precision:"):
        get_precision("fp8")


def test_attention_state_precision():
    from flashlab import rel_error
    from flashlab.precision import attention_row_with_rounded_state

    torch.manual_seed(0)
    scores, values = torch.randn(1000, dtype=torch.float64) * 2, torch.randn(1000, 8, dtype=torch.float64)
    exact = torch.softmax(scores, 0) @ values
    assert rel_error(attention_row_with_rounded_state(scores, values, torch.float64), exact) < 1e-12
    fp32 = rel_error(attention_row_with_rounded_state(scores, values, torch.float32), exact)
    bf16 = rel_error(attention_row_with_rounded_state(scores, values, torch.bfloat16), exact)
    assert fp32 < 1e-6 < 1e-4 < bf16
