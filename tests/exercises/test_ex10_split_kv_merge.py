"""Tests for exercise 10 (the split-KV merge): any split of the keys, merged, is the whole
row's attention; empty splits; large log-sum-exps; the inputs' dtype kept."""

import inspect
import io
import math
import tokenize

import pytest
import torch

from flashlab import assert_close
from tests.exercises.hints import require


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


def _uses_softmax(fn) -> bool:
    """Whether fn's source calls a softmax (torch.softmax, F.softmax, .softmax)."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return any(t.type == tokenize.NAME and t.string == "softmax"
               for t in tokenize.generate_tokens(io.StringIO(source).readline))


def _merge_hint(o, o_parts, lse_parts) -> str:
    """``"\\nhint: …"`` when O is the splits' O_s combined without their softmax weights, or with them but
    normalised wrongly (not divided by Σ_s w_s, divided by S) or taken from the largest split alone; else ``""``."""
    has_keys = torch.isfinite(lse_parts)[..., None]                  # an empty split's O_s is 0 and weighs nothing
    wrong = {"the plain mean of the splits' O_s": o_parts.mean(dim=0),
             "the mean of the non-empty splits' O_s": (o_parts * has_keys).sum(0) / has_keys.sum(0).clamp(min=1),
             "the sum of the splits' O_s": o_parts.sum(dim=0)}
    for name, candidate in wrong.items():
        if torch.allclose(o.double(), candidate, rtol=1e-6, atol=1e-9):
            return (f"\nhint: O is {name}. Each O_s is normalised over its own keys only, so a split weighs by the "
                    f"softmax mass its keys hold, exp(L_s): O = Σ_s w_s O_s / Σ_s w_s with w_s = exp(L_s − m), "
                    f"m = max_s L_s")
    m = lse_parts.amax(dim=0)
    w = torch.exp(lse_parts - torch.where(torch.isneginf(m), torch.zeros_like(m), m))[..., None]
    weighted = (w * o_parts).sum(dim=0)                              # Σ_s w_s O_s, right up to the division
    largest = o_parts.gather(0, lse_parts.argmax(dim=0)[None, ..., None].expand(1, *o_parts.shape[1:]))[0]
    slips = {"Σ_s w_s O_s, not divided by Σ_s w_s: the weights w_s = exp(L_s − m) do not sum to 1, so divide by "
             "their sum, O = Σ_s w_s O_s / Σ_s w_s": weighted,
             "Σ_s w_s O_s divided by the number of splits S: the weights w_s = exp(L_s − m) sum to Σ_s w_s, not S, "
             "so divide by Σ_s w_s": weighted / o_parts.shape[0],
             "the O_s of the split with the largest L_s alone: that split holds the most softmax mass, not all of "
             "it; every split counts, O = Σ_s w_s O_s / Σ_s w_s with w_s = exp(L_s − m)": largest}
    for slip, candidate in slips.items():
        if torch.allclose(o.double(), candidate, rtol=1e-6, atol=1e-9):
            return f"\nhint: O is {slip}"
    return ""


def _lse_hint(lse, lse_parts) -> str:
    """``"\\nhint: …"`` for a wrong L when O was right (the weights are right, so only L's formula is off)."""
    m = lse_parts.amax(dim=0)
    shifted = torch.logsumexp(lse_parts - m, dim=0)                  # log Σ_s w_s, w_s = exp(L_s − m)
    wrong = {"log Σ_s w_s without m added back": shifted,
             "m = max_s L_s alone, without log Σ_s w_s": m,
             "the mean of the splits' L_s": lse_parts.mean(dim=0),
             "the sum of the splits' L_s": lse_parts.sum(dim=0),
             "in base 2 (log2 where the L_s are natural logs)": (m + shifted) / math.log(2)}
    named = next((name for name, candidate in wrong.items()
                  if torch.allclose(lse.double(), candidate, rtol=1e-6, atol=1e-9)), None)
    return ("\nhint: O is right, so the weights w_s are; only L is wrong"
            + (f": it is {named}" if named else "")
            + ". L is the log-sum-exp of the whole row, the log of the softmax mass of all its keys: "
              "Σ_s exp(L_s) = exp(m) Σ_s w_s, so L = m + log Σ_s w_s (natural log, like the L_s)")


def _what_is_not_finite(o, lse, row) -> str:
    """What the test saw in one row: which of O and L hold NaN or ±inf ("" if both are finite)."""
    seen = []
    for name, t in (("O", o[row]), ("L", lse[row])):
        kinds = [k for k, bad in (("NaN", torch.isnan(t).any()), ("+inf", torch.isposinf(t).any()),
                                  ("−inf", torch.isneginf(t).any())) if bad]
        if kinds:
            seen.append(f"{name} holds {'/'.join(kinds)}")
    return " and ".join(seen)


@pytest.mark.parametrize("cuts", [[0, 50], [0, 17, 50], [0, 1, 2, 30, 49, 50], [0, 0, 20, 20, 50]])
def test_merge_of_splits_is_the_whole_row(exercise, cuts):
    scores = torch.randn(3, 4, 50, dtype=torch.float64) * 3
    v = torch.randn(50, 8, dtype=torch.float64)
    o_parts, lse_parts = _split_results(scores, v, cuts)
    o, lse = exercise.merge_splits(o_parts, lse_parts)
    assert o.shape == (3, 4, 8) and lse.shape == (3, 4)
    try:
        assert_close(o, torch.softmax(scores, -1) @ v, what="O")
    except AssertionError as error:
        raise AssertionError(f"{error}{_merge_hint(o, o_parts, lse_parts)}") from None
    try:
        assert_close(lse, torch.logsumexp(scores, -1), what="L")
    except AssertionError as error:
        raise AssertionError(f"{error}{_lse_hint(lse, lse_parts)}") from None
    shuffled = torch.randperm(len(cuts) - 1)                       # the order of the splits does not matter
    o2, _ = exercise.merge_splits(o_parts[shuffled], lse_parts[shuffled])
    assert_close(o2, o, what="O with splits reordered")


def test_large_log_sum_exps_do_not_overflow(exercise):
    scores = torch.randn(2, 40, dtype=torch.float64) * 5 + 1000.0
    v = torch.randn(40, 4, dtype=torch.float64)
    o, lse = exercise.merge_splits(*_split_results(scores, v, [0, 13, 40]))
    seen = "; ".join(f"row {r}: {s}" for r in range(2) if (s := _what_is_not_finite(o, lse, r)))
    require(not seen, (
        f"every L_s is about 1000 here and the result is not finite ({seen}). exp(L_s) overflows float64 "
        f"above L_s ≈ 709, so the weights must be exp(L_s − m) with m = max_s L_s of the row, and L = m + "
        f"log Σ_s w_s. Likely causes: exponentiating L_s before subtracting m, or not subtracting m at all"))
    assert_close(o, torch.softmax(scores, -1) @ v, what="O")


def test_each_row_takes_its_own_maximum(exercise):
    """One maximum over every row (instead of one per row) underflows the rows far below it:
    here row 1's scores sit near 0 while row 0's sit near 1000."""
    scores = torch.randn(2, 40, dtype=torch.float64)
    scores[0] += 1000.0
    v = torch.randn(40, 4, dtype=torch.float64)
    o, lse = exercise.merge_splits(*_split_results(scores, v, [0, 13, 40]))
    causes = {
        0: "row 0's L_s are near 1000 and exp(L_s) overflows float64 (above ≈ 709): subtract the row's "
           "maximum m before exponentiating, w_s = exp(L_s − m)",
        1: "row 1's L_s are near 0, about 1000 below row 0's: if m was taken over every row (1000) rather "
           "than over the splits of row 1 alone, exp(L_s − m) underflows to 0 and the row loses all its weight: "
           "take m = max over the splits (dim 0) for each row",
    }
    seen = {r: s for r in range(2) if (s := _what_is_not_finite(o, lse, r))}
    require(not seen, ("rows whose log-sum-exps differ by about 1000 give a result that is not finite: "
                       + "; ".join(f"row {r}: {s}" for r, s in seen.items()) + ". Likely: "
                       + "; ".join(causes[r] for r in seen)))
    assert_close(o, torch.softmax(scores, -1) @ v, what="O (rows of very different size)")
    assert_close(lse, torch.logsumexp(scores, -1), what="L (rows of very different size)")


def test_rows_with_no_key_give_zeros(exercise):
    o_parts = torch.zeros(3, 2, 4, dtype=torch.float64)
    lse_parts = torch.full((3, 2), -torch.inf, dtype=torch.float64)
    o_parts[1, 0], lse_parts[1, 0] = torch.arange(4.0, dtype=torch.float64), 0.7   # row 0: one split has keys
    o, lse = exercise.merge_splits(o_parts, lse_parts)
    o_nan, lse_nan = torch.isnan(o).any(-1), torch.isnan(lse)
    if (o_nan | lse_nan).any():
        if lse_nan.any():     # log of a zero sum is −inf, not NaN: a NaN in L came from the weights, L_s − m
            cause = ("L is NaN, so the weights were: with every L_s = −inf, m = max_s L_s = −inf and L_s − m = "
                     "−inf − (−inf) = NaN; subtract 0 there instead of m"
                     + (" (O inherits the NaN weights; once they are 0, O = Σ w_s O_s / Σ w_s is 0/0 there: "
                        "divide by 1 where Σ_s w_s = 0)" if o_nan.any() else ""))
        elif _uses_softmax(exercise.merge_splits):
            cause = ("O is NaN where L is not: torch.softmax over the splits returns NaN on a row whose every "
                     "L_s = −inf (it subtracts the row's max, −inf − (−inf) = NaN), and O inherits it. Guard those "
                     "rows: O = 0 where L = −inf, e.g. torch.where(torch.isneginf(L)[..., None], 0.0, O)")
        else:
            cause = ("O is NaN where L is not: the weights of that row are NaN or the sum is 0/0. With every "
                     "L_s = −inf, w_s = exp(L_s − m) with m = −inf is NaN (subtract 0 there instead of m), and "
                     "w_s = exp(−inf − 0) = 0 makes O = Σ w_s O_s / Σ w_s = 0/0 (divide by 1 where Σ_s w_s = 0); "
                     "or set O = 0 where L = −inf")
        pytest.fail(f"rows whose every split is empty (every L_s = −inf) must give O = 0 and L = −inf, without NaN; "
                    f"row 1 has no key in any split. Got NaN in O of row(s) {o_nan.nonzero().flatten().tolist()} "
                    f"and in L of row(s) {lse_nan.nonzero().flatten().tolist()}: O = {o.tolist()}, "
                    f"L = {lse.tolist()}. Likely: {cause}")
    assert (o[1] == 0).all() and lse[1] == -torch.inf, \
        f"row 1 has no key in any split: want O = 0 and L = −inf, got O = {o[1].tolist()}, L = {lse[1].item()}"
    assert_close(o[0], torch.arange(4.0, dtype=torch.float64))
    assert abs(lse[0].item() - 0.7) < 1e-12, (f"row 0's only keys are in split 1 (L = 0.7): got L = {lse[0].item()}"
                                              + (f" in {lse.dtype} (the inputs are torch.float64)"
                                                 if lse.dtype != torch.float64 else ""))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_the_inputs_dtype_is_kept(exercise, dtype):
    scores = torch.randn(5, 30, dtype=torch.float64)
    v = torch.randn(30, 16, dtype=torch.float64)
    o_parts, lse_parts = _split_results(scores, v, [0, 10, 30])
    o, lse = exercise.merge_splits(o_parts.to(dtype), lse_parts.to(dtype))
    assert o.dtype == dtype and lse.dtype == dtype, (
        f"{dtype} inputs gave O in {o.dtype} and L in {lse.dtype}: return both in the inputs' dtype ({dtype}). "
        f"A buffer made without dtype= (torch.zeros, torch.full, torch.tensor of floats) is float32, "
        f"and .float() / .double() convert")
    assert_close(o, torch.softmax(scores, -1) @ v, dtype=dtype, what="O")
    assert_close(lse, torch.logsumexp(scores, -1), dtype=dtype, what="L")
