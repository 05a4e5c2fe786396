"""The fused Triton softmax (compiled on a GPU, interpreted on a CPU)."""

import pytest
import torch

from flashlab import assert_close
from flashlab.lessons.fused_softmax import fused_softmax

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (17, 1000), (2, 3, 17), (64, 257)])
def test_matches_float64(dtype, shape):
    x = (torch.randn(shape, device=DEVICE) * 5).to(dtype)
    y = fused_softmax(x)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, torch.softmax(x.double(), -1), dtype=dtype)


def test_minus_infinity_rows():
    x = torch.randn(3, 40, device=DEVICE)
    x[1] = -torch.inf
    x[2, 5:] = -torch.inf
    y = fused_softmax(x)
    assert torch.isfinite(y).all() and torch.all(y[1] == 0)
    assert_close(y[2], torch.softmax(x[2].double(), -1))


def test_non_contiguous_input():
    x = torch.randn(40, 30, device=DEVICE).t()      # rows are strided
    assert_close(fused_softmax(x), torch.softmax(x.double(), -1))


@pytest.mark.parametrize("x,match", [
    (torch.randn(3, 4, dtype=torch.float64), "^x: dtype"),
    (torch.randn(3, 0), "^x: needs"),
    (torch.randn(1, 70000), "^x: rows of"),
])
def test_bad_inputs(x, match):
    with pytest.raises(ValueError, match=match):
        fused_softmax(x.to(DEVICE))
