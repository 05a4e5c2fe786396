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


def _rescale_hint(exercise) -> str:
    """What `update` does to the old sum, from the state of one column 0 (m = 0, l = 1) and a block
    [1]: m' = 1 and l' = l·e^(m − m') + e^(1 − m') = e⁻¹ + 1; the usual mistakes give other values."""
    one = torch.ones(1, dtype=torch.float64)
    try:
        got, e = exercise.update(one * 0, one, one[:, None])[1].item(), torch.e
    except Exception:  # a hint only: the failure it accompanies is what matters
        return ""
    for wrong, what in ((1 + e, "multiplied by e^(m' − m) = e¹, the factor inverted"), (2.0, "not rescaled")):
        if abs(got - wrong) < 1e-9:
            return (f"\nhint: update(m=0, l=1, block=[1]) gives l = {got:.4f}: the old sum was {what}. "
                    f"Rescale it by exp(m − m'), old max minus new max, ≤ 1: l = 1·e⁻¹ + e⁰ = {1 / e + 1:.4f}")
    try:      # a block below the running max: m' = m = 1, l' = 1 + e^(0 − 1)
        got = exercise.update(one, one, one[:, None] * 0)[1].item()
    except Exception:
        return ""
    if abs(got - 2.0) < 1e-9:
        return (f"\nhint: update(m=1, l=1, block=[0]) gives l = {got:.4f}: the block was summed against its own "
                f"max, exp(0 − 0) = 1. Sum exp(block − m') against the new running max m' = max(m, max(block)) = 1: "
                f"l = 1·e⁰ + e⁻¹ = {1 + 1 / e:.4f}")
    return ""


def _merge_hint(exercise) -> str:
    """What `merge` does to each side's sum, from two one-column states m = 0 and m = 1 (l = 1 each), merged
    in both orders: l = 1 + e⁻¹ either way; the usual mistakes give 2 (a side not rescaled) or 1 + e."""
    zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    a_smaller, b_smaller = "merge(m_a=0, l_a=1, m_b=1, l_b=1)", "merge(m_a=1, l_a=1, m_b=0, l_b=1)"
    try:
        merged = {order: exercise.merge(*states) for order, states in
                  ((a_smaller, (zero, one, one, one)), (b_smaller, (one, one, zero, one)))}
        got = {order: state[1].item() for order, state in merged.items()}
        maxima = {order: state[0].item() for order, state in merged.items()}
    except Exception:
        return ""
    if any(m != 1.0 for m in maxima.values()):     # the max itself is wrong: the factors follow from it
        said = "; ".join(f"{order} gives m = {m:g}" for order, m in maxima.items())
        return (f"\nhint: {said}, where both should give m = max(m_a, m_b) = 1: the merged max must be the larger "
                "of the two, whichever side holds it (torch.maximum(m_a, m_b)); each side is then rescaled by "
                "exp(its own max − m) ≤ 1: l = l_a·exp(m_a − m) + l_b·exp(m_b − m)")
    want, e = 1 + 1 / torch.e, torch.e
    wrong = {order: l for order, l in got.items() if abs(l - want) > 1e-9}
    if not wrong:
        return ""
    said = "; ".join(f"{order} gives l = {l:.4f}" for order, l in got.items())
    if all(abs(l - (1 + e)) < 1e-9 for l in wrong.values()):
        why = "the factor inverted: exp(m − m_b) instead of exp(m_b − m)"
    elif all(abs(l - 2.0) < 1e-9 for l in wrong.values()):
        # only the side with the smaller max needs a factor (e⁻¹ here): the order that goes wrong names it
        if len(wrong) == 2:
            why = "neither l_a nor l_b rescaled"
        else:
            side = "l_a" if a_smaller in wrong else "l_b"
            why = f"{side} added as it is, not rescaled (it needs the factor when its max is the smaller one)"
    else:
        return ""
    return (f"\nhint: {said}, where both should give 1·e⁰ + 1·e⁻¹ = {want:.4f}: {why}. Rescale each side by "
            "exp(its own max − m), m = max(m_a, m_b): l = l_a·exp(m_a − m) + l_b·exp(m_b − m)")


@pytest.mark.parametrize("cols,block", [(1, 1), (17, 4), (1000, 64), (100, 1000)])
def test_update_streams_to_the_exact_statistics(exercise, cols, block):
    x = torch.randn(3, 5, cols, dtype=torch.float64) * 5
    m, l = _stream(exercise, x, block)  # noqa: E741
    assert_close(m, x.amax(-1), what="m")
    try:
        assert_close(m + torch.log(l), torch.logsumexp(x, -1), what="log-sum-exp")
    except AssertionError as err:
        raise AssertionError(f"{err}{_rescale_hint(exercise)}") from None


def _state(x):
    """The exact state (m, l) of the columns x, built here in float64 (not with your
    `update`, so a correct `merge` passes even while `update` is wrong). No columns: the empty state."""
    if x.shape[-1] == 0:
        return torch.full(x.shape[:-1], -torch.inf, dtype=x.dtype), torch.zeros(x.shape[:-1], dtype=x.dtype)
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
    try:
        for got in (left_first, right_first):     # associativity: both groupings give the whole
            assert_close(got[0], whole[0], what="m")
            assert_close(got[1], whole[1], what="l")
        swapped = exercise.merge(*parts[1], *parts[0])   # commutativity
        direct = exercise.merge(*parts[0], *parts[1])
        assert_close(swapped[1], direct[1], what="l")
    except AssertionError as err:
        raise AssertionError(f"{err}{_merge_hint(exercise)}") from None


def _nan_rows(*tensors):
    """Indices of the rows where any of the tensors holds NaN."""
    return torch.stack([t.isnan() for t in tensors]).any(0).nonzero().flatten().tolist()


def test_merge_with_an_empty_or_masked_part(exercise):
    """Merging with the empty state changes nothing; a part whose columns are all −inf (a key
    block fully masked for those rows) is empty too: merging it gives the other part, and a row
    masked in both parts stays empty (m = −inf, l = 0), with no NaN."""
    x = torch.randn(3, 10, dtype=torch.float64)
    m, l = _state(x)  # noqa: E741
    empty = (torch.full((3,), -torch.inf, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    for order, got in (("merge(a, empty)", exercise.merge(m, l, *empty)),
                       ("merge(empty, a)", exercise.merge(*empty, m, l))):
        try:
            assert_close(got[0], m, what=f"{order}: m")
            assert_close(got[1], l, what=f"{order}: l")
        except AssertionError as err:
            raise AssertionError(f"{err}{_merge_hint(exercise)}") from None
    x[2] = -torch.inf                        # row 2 masked in the first part as well
    m, l = _state(x)  # noqa: E741
    block = torch.randn(3, 6, dtype=torch.float64)
    block[[0, 2]] = -torch.inf               # rows 0 and 2 of this block fully masked, row 1 not
    masked = _state(block)
    whole_m, whole_l = _state(torch.cat([x, block], -1))
    for order, got in (("merge(a, masked)", exercise.merge(m, l, *masked)),
                       ("merge(masked, a)", exercise.merge(*masked, m, l))):
        bad = _nan_rows(*got)
        assert not bad, (
            f"{order}: NaN in rows {bad} (m = {got[0].tolist()}, l = {got[1].tolist()}); row 2 is −inf in "
            "both parts, so m = max(m_a, m_b) = −inf and exp(m_a − m) = exp(−inf − (−inf)) = NaN. Where m "
            "is −inf, subtract 0 instead of m (exp(−inf − 0) = 0): a row masked in both stays m = −inf, l = 0")
        try:
            assert_close(got[0][:2], whole_m[:2], what=f"{order}: m of rows 0-1")
            assert_close(got[1][:2], whole_l[:2], what=f"{order}: l of rows 0-1")
            assert_close(got[1][0], l[0], what=f"{order}: l of row 0 (the masked part adds nothing)")
        except AssertionError as err:
            raise AssertionError(f"{err}{_merge_hint(exercise)}") from None
        assert got[0][2] == -torch.inf and got[1][2] == 0, (
            f"{order}: a row masked in both parts should stay empty (m = −inf, l = 0); "
            f"got m = {got[0][2].item()}, l = {got[1][2].item()}")


def test_minus_infinity_and_empty_rows(exercise):
    x = torch.randn(3, 12, dtype=torch.float64)
    x[0, :5] = -torch.inf            # the first block of row 0 is fully masked
    x[1] = -torch.inf                # row 1 is entirely masked
    m, l = _stream(exercise, x, 5)  # noqa: E741
    bad = _nan_rows(m, l)
    finite = [r for r in bad if not torch.isinf(x[r]).any()]
    assert not finite, (
        f"update gave NaN in rows {finite} (m = {m.tolist()}, l = {l.tolist()}), whose values are all finite, so "
        "the NaN does not come from −inf values: check the rescale factor of the old sum, exp(m − m') (old max minus "
        "new max, ≤ 1). From the empty starting state m = −inf, l = 0 it is exp(−inf − m') = 0 and l stays 0 · 0 = 0; "
        "the inverted factor exp(m' − m) = inf gives 0 · inf = NaN"
        + _rescale_hint(exercise))
    assert not bad, (
        f"update gave NaN in rows {bad} (m = {m.tolist()}, l = {l.tolist()}), streaming blocks of 5 columns "
        "where row 0's first block and all of row 1 are −inf. While every value seen so far is −inf, "
        "m' = −inf and exp(block − m') = exp(−inf − (−inf)) = NaN (l·exp(m − m') too). Where m' is −inf, "
        "subtract 0 instead of m' (exp(−inf − 0) = 0), so those rows stay m = −inf, l = 0")
    assert m[1] == -torch.inf and l[1] == 0, (
        f"row 1 is all −inf: expected the empty state m = −inf, l = 0; got m = {m[1].item()}, l = {l[1].item()}")
    try:
        assert_close(m[[0, 2]] + torch.log(l[[0, 2]]), torch.logsumexp(x[[0, 2]], -1), what="log-sum-exp of rows 0, 2")
    except AssertionError as err:
        raise AssertionError(f"{err}{_rescale_hint(exercise)}") from None
    empty = (torch.tensor([-torch.inf], dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
    m2, l2 = exercise.merge(*empty, *empty)
    assert m2.item() == -torch.inf and l2.item() == 0, (
        f"merging two empty states should give the empty state m = −inf, l = 0; got m = {m2.item()}, "
        f"l = {l2.item()}. With m = max(m_a, m_b) = −inf, exp(m_a − m) is NaN: where m is −inf, subtract 0")
