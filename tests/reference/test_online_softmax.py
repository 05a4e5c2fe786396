"""flashlab.reference.online_softmax: streaming statistics, merge, −inf handling."""

import pytest
import torch

from flashlab import assert_close
from flashlab.reference.online_softmax import initial_state, merge, online_softmax, softmax_statistics


@pytest.mark.parametrize("cols,block", [(1, 1), (17, 5), (1000, 128), (64, 64)])
def test_online_softmax_equals_softmax(cols, block):
    x = torch.randn(4, cols, dtype=torch.float64) * 10
    assert_close(online_softmax(x, block), torch.softmax(x, -1))
    assert_close(softmax_statistics(x, block).logsumexp, torch.logsumexp(x, -1))


def test_merge_is_associative_and_has_an_identity():
    x = torch.randn(3, 60, dtype=torch.float64) * 4
    a, b, c = (softmax_statistics(x[:, s:s + 20], 7) for s in (0, 20, 40))
    left, right = merge(merge(a, b), c), merge(a, merge(b, c))
    whole = softmax_statistics(x, 60)
    for got in (left, right):
        assert_close(got.m, whole.m)
        assert_close(got.l, whole.l)
    same = merge(a, initial_state(a.m.shape, torch.float64))
    assert torch.equal(same.m, a.m) and torch.equal(same.l, a.l)


def test_fully_masked_rows_give_zeros():
    x = torch.randn(3, 10, dtype=torch.float64)
    x[1] = -torch.inf
    x[2, :6] = -torch.inf
    y = online_softmax(x, 4)
    assert torch.isfinite(y).all() and torch.all(y[1] == 0)
    assert_close(y[[0, 2]], torch.softmax(x[[0, 2]], -1))


def test_bad_block_size():
    with pytest.raises(ValueError, match="^block_size:"):
        softmax_statistics(torch.randn(3, 4), 0)
