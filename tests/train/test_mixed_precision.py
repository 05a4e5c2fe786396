"""The trainer's precision modes."""

import pytest
import torch

from flashlab.train.mixed_precision import PRECISIONS, get_precision


def test_precision_modes():
    assert set(PRECISIONS) == {"32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"}
    assert get_precision("16-mixed").loss_scaling and not get_precision("bf16-mixed").loss_scaling
    assert get_precision("bf16-true").param_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="^precision:"):
        get_precision("fp8")
