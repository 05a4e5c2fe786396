"""Tests for exercise 03b (tiled forward): float64 reference, odd sizes, causal, and
no Nq × Nk tensor."""

import pytest
import torch

from flashlab import assert_close, reference_attention
from flashlab.instrument import LargestTensor

CASES = [(1, 1, 16), (17, 17, 16), (100, 37, 8), (37, 100, 8), (1000, 1000, 16)]


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", CASES)
def test_matches_reference(exercise, Nq, Nk, D, is_causal):
    q, k, v = torch.randn(2, 2, Nq, D), torch.randn(2, 2, Nk, D), torch.randn(2, 2, Nk, D)
    out, lse = exercise.tiled_attention_forward(q, k, v, is_causal=is_causal, block_m=32, block_n=64)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == q.shape[:-1]
    assert_close(out, reference_attention(q, k, v, is_causal=is_causal))
    scores = (q.double() @ k.double().transpose(-1, -2)) * D ** -0.5
    if is_causal:
        scores = scores.masked_fill(torch.ones(Nq, Nk, dtype=torch.bool).tril().logical_not(), -torch.inf)
    assert_close(lse, torch.logsumexp(scores, -1), what="lse")


def test_half_precision_inputs(exercise):
    q, k, v = (torch.randn(1, 2, 50, 16, dtype=torch.float16) for _ in range(3))
    out, _ = exercise.tiled_attention_forward(q, k, v, block_m=16, block_n=16)
    assert out.dtype == torch.float16
    assert_close(out, reference_attention(q, k, v), dtype=torch.float16)


def test_never_forms_the_score_matrix(exercise):
    q, k, v = (torch.randn(1, 2, 300, 16) for _ in range(3))
    with LargestTensor() as largest:
        exercise.tiled_attention_forward(q, k, v, block_m=32, block_n=32)
    # anything bigger than an output-sized tensor or a (B·H) × tile would be a full N×N row band
    assert largest.numel <= max(q.numel(), 2 * 32 * 32), f"found a tensor of shape {largest.shape}"
