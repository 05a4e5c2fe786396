"""Tests for exercise 10 (the split-KV merge): any split of the keys, merged, is the whole
row's attention; empty splits; large log-sum-exps."""

import pytest
import torch

from flashlab import assert_close


def _split_results(scores, v, cuts):
    """Per-split normalised outputs and natural-log log-sum-exps, in float64."""
    o_parts, lse_parts = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        s = scores[..., a:b]
        lse = torch.logsumexp(s, -1) if b > a else torch.full(s.shape[:-1], -torch.inf, dtype=s.dtype)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0) if b > a else s
        o_parts.append(p @ v[a:b])
        lse_parts.append(lse)
    return torch.stack(o_parts), torch.stack(lse_parts)


@pytest.mark.parametrize("cuts", [[0, 50], [0, 17, 50], [0, 1, 2, 30, 49, 50], [0, 0, 20, 20, 50]])
def test_merge_of_splits_is_the_whole_row(exercise, cuts):
    scores = torch.randn(3, 4, 50, dtype=torch.float64) * 3
    v = torch.randn(50, 8, dtype=torch.float64)
    o_parts, lse_parts = _split_results(scores, v, cuts)
    o, lse = exercise.merge_splits(o_parts, lse_parts)
    assert o.shape == (3, 4, 8) and lse.shape == (3, 4)
    assert_close(o, torch.softmax(scores, -1) @ v, what="O")
    assert_close(lse, torch.logsumexp(scores, -1), what="L")
    shuffled = torch.randperm(len(cuts) - 1)                       # the order of the splits does not matter
    o2, _ = exercise.merge_splits(o_parts[shuffled], lse_parts[shuffled])
    assert_close(o2, o, what="O with splits reordered")


def test_large_log_sum_exps_do_not_overflow(exercise):
    scores = torch.randn(2, 40, dtype=torch.float64) * 5 + 1000.0
    v = torch.randn(40, 4, dtype=torch.float64)
    o, lse = exercise.merge_splits(*_split_results(scores, v, [0, 13, 40]))
    assert torch.isfinite(o).all() and torch.isfinite(lse).all(), \
        "O or L is not finite: subtract m = max over the splits of L_s (per row) before exponentiating"
    assert_close(o, torch.softmax(scores, -1) @ v, what="O")


def test_each_row_takes_its_own_maximum(exercise):
    """One maximum over every row (instead of one per row) underflows the rows far below it:
    here row 1's scores sit near 0 while row 0's sit near 1000."""
    scores = torch.randn(2, 40, dtype=torch.float64)
    scores[0] += 1000.0
    v = torch.randn(40, 4, dtype=torch.float64)
    o, lse = exercise.merge_splits(*_split_results(scores, v, [0, 13, 40]))
    assert torch.isfinite(lse).all(), "a row lost all its weight: take m = max over the splits per row, not overall"
    assert_close(o, torch.softmax(scores, -1) @ v, what="O (rows of very different size)")
    assert_close(lse, torch.logsumexp(scores, -1), what="L (rows of very different size)")


def test_rows_with_no_key_give_zeros(exercise):
    o_parts = torch.zeros(3, 2, 4, dtype=torch.float64)
    lse_parts = torch.full((3, 2), -torch.inf, dtype=torch.float64)
    o_parts[1, 0], lse_parts[1, 0] = torch.arange(4.0, dtype=torch.float64), 0.7   # row 0: one split has keys
    o, lse = exercise.merge_splits(o_parts, lse_parts)
    nan_rows = (torch.isnan(o).any(-1) | torch.isnan(lse)).nonzero().flatten().tolist()
    assert not nan_rows, (f"rows whose every split is empty must give O = 0 and L = −inf (got NaN in row(s) "
                          f"{nan_rows}: O = {o.tolist()}, L = {lse.tolist()}); row 1 has no key in any split, so "
                          f"m = max_s L_s = −inf and L_s − m = −inf − (−inf) = NaN: subtract 0 there instead of m, "
                          f"and divide by 1 where the weights sum to 0")
    assert (o[1] == 0).all() and lse[1] == -torch.inf, \
        f"row 1 has no key in any split: want O = 0 and L = −inf, got O = {o[1].tolist()}, L = {lse[1].item()}"
    assert_close(o[0], torch.arange(4.0, dtype=torch.float64))
    assert abs(lse[0].item() - 0.7) < 1e-12, f"row 0's only keys are in split 1 (L = 0.7): got L = {lse[0].item()}"
    assert o.dtype == torch.float64


def test_float32_inputs_keep_their_dtype(exercise):
    scores = torch.randn(5, 30)
    v = torch.randn(30, 16)
    o_parts, lse_parts = _split_results(scores, v, [0, 10, 30])
    o, lse = exercise.merge_splits(o_parts, lse_parts)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    assert_close(o, torch.softmax(scores.double(), -1) @ v.double(), dtype=torch.float32)
