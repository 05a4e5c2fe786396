"""Tests for exercise 03 (online-softmax update and merge)."""

import pytest
import torch

from flashlab import assert_close


def _stream(exercise, x, block):
    m = torch.full(x.shape[:-1], -torch.inf, dtype=x.dtype)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype)  # noqa: E741
    for start in range(0, x.shape[-1], block):
        m, l = exercise.update(m, l, x[..., start:start + block])  # noqa: E741
    return m, l


@pytest.mark.parametrize("cols,block", [(1, 1), (17, 4), (1000, 64), (100, 1000)])
def test_update_streams_to_the_exact_statistics(exercise, cols, block):
    x = torch.randn(3, 5, cols, dtype=torch.float64) * 5
    m, l = _stream(exercise, x, block)  # noqa: E741
    assert_close(m, x.amax(-1), what="m")
    assert_close(m + torch.log(l), torch.logsumexp(x, -1), what="log-sum-exp")


def _state(x):
    """The exact state (m, l) of the columns x, built here in float64 (not with your
    `update`, so a correct `merge` passes even while `update` is wrong)."""
    m = x.amax(-1)
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, torch.exp(x - shift[..., None]).sum(-1)


def test_merge_of_any_split_is_the_whole(exercise):
    x = torch.randn(4, 90, dtype=torch.float64) * 3
    cut1, cut2 = sorted(torch.randint(1, 89, (2,)).tolist())
    parts = [_state(x[:, a:b]) for a, b in ((0, cut1), (cut1, cut2), (cut2, 90))]
    left_first = exercise.merge(*exercise.merge(*parts[0], *parts[1]), *parts[2])
    right_first = exercise.merge(*parts[0], *exercise.merge(*parts[1], *parts[2]))
    whole = _state(x)
    for got in (left_first, right_first):     # associativity: both groupings give the whole
        assert_close(got[0], whole[0], what="m")
        assert_close(got[1], whole[1], what="l")
    swapped = exercise.merge(*parts[1], *parts[0])   # commutativity
    direct = exercise.merge(*parts[0], *parts[1])
    assert_close(swapped[1], direct[1], what="l")


def test_merge_with_an_empty_or_masked_part(exercise):
    """Merging with the empty state changes nothing; a part whose columns are all −inf is empty."""
    x = torch.randn(3, 10, dtype=torch.float64)
    m, l = _state(x)  # noqa: E741
    empty = (torch.full((3,), -torch.inf, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    for got in (exercise.merge(m, l, *empty), exercise.merge(*empty, m, l)):
        assert_close(got[0], m, what="m")
        assert_close(got[1], l, what="l")


def test_minus_infinity_and_empty_rows(exercise):
    x = torch.randn(3, 12, dtype=torch.float64)
    x[0, :5] = -torch.inf            # the first block of row 0 is fully masked
    x[1] = -torch.inf                # row 1 is entirely masked
    m, l = _stream(exercise, x, 5)  # noqa: E741
    assert not torch.isnan(m).any() and not torch.isnan(l).any()
    assert m[1] == -torch.inf and l[1] == 0
    assert_close(m[[0, 2]] + torch.log(l[[0, 2]]), torch.logsumexp(x[[0, 2]], -1))
    empty = (torch.tensor([-torch.inf], dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
    m2, l2 = exercise.merge(*empty, *empty)
    assert m2.item() == -torch.inf and l2.item() == 0
