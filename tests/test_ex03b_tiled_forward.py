"""Tests for exercise 03b (tiled forward): float64 reference, odd sizes, causal, and
no Nq × Nk tensor."""

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from flashlab import assert_close, reference_attention
from flashlab.instrument import LargestTensor

CASES = [(1, 1, 16), (17, 17, 16), (100, 37, 8), (37, 100, 8), (260, 260, 16)]


class KeyBlockReads(TorchDispatchMode):
    """Counts, per block of ``block_n`` key rows, the operations that read part of the
    contiguous tensor ``k`` (through any view: slices, splits, transposes). Views
    themselves read nothing; an operation reading all of k at once (a cast or a scaling
    before the loops) is the same however many tiles are visited, so it is not counted."""

    def __init__(self, k: torch.Tensor, block_n: int):
        super().__init__()
        self.storage, self.block_n = k.untyped_storage().data_ptr(), block_n
        self.rows = torch.arange(k.numel()).view_as(k).div(k.shape[-1], rounding_mode="floor") % k.shape[-2]
        self.rows_flat, self.n_blocks = self.rows.flatten(), -(-k.shape[-2] // block_n)
        self.reads: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == self.storage and t.numel():
                    rows = torch.as_strided(self.rows_flat, t.shape, t.stride(), t.storage_offset())
                    blocks = set((rows // self.block_n).unique().tolist())
                    if len(blocks) < self.n_blocks:
                        self.reads.update(blocks)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,D", CASES)
def test_matches_reference(exercise, Nq, Nk, D, is_causal):
    q, k, v = torch.randn(2, 2, Nq, D), torch.randn(2, 2, Nk, D), torch.randn(2, 2, Nk, D)
    out, lse = exercise.tiled_attention_forward(q, k, v, is_causal=is_causal, block_m=32, block_n=64)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == q.shape[:-1]
    assert lse.dtype == torch.float32, "lse in float32 for float32 inputs"
    assert_close(out, reference_attention(q, k, v, is_causal=is_causal))
    scores = (q.double() @ k.double().transpose(-1, -2)) * D ** -0.5
    if is_causal:
        scores = scores.masked_fill(torch.ones(Nq, Nk, dtype=torch.bool).tril().logical_not(), -torch.inf)
    assert_close(lse, torch.logsumexp(scores, -1), what="lse")


def test_half_precision_inputs(exercise):
    q, k, v = (torch.randn(1, 2, 50, 16, dtype=torch.float16) for _ in range(3))
    out, lse = exercise.tiled_attention_forward(q, k, v, block_m=16, block_n=16)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32, "out in q's dtype, lse in float32"
    assert_close(out, reference_attention(q, k, v), dtype=torch.float16)


def test_never_forms_the_score_matrix(exercise):
    q, k, v = (torch.randn(1, 2, 300, 16) for _ in range(3))
    with LargestTensor() as largest:
        exercise.tiled_attention_forward(q, k, v, block_m=32, block_n=32)
    # anything bigger than an output-sized tensor or a (B·H) × tile would be a full N×N row band
    assert largest.numel <= max(q.numel(), 2 * 32 * 32), f"found a tensor of shape {largest.shape}"


def _key_block_reads(exercise, is_causal, n=128, block=32):
    q, k, v = (torch.randn(1, 2, n, 16) for _ in range(3))
    with KeyBlockReads(k, block) as counter:
        exercise.tiled_attention_forward(q, k, v, is_causal=is_causal, block_m=block, block_n=block)
    return [counter.reads[j] for j in range(n // block)]


def test_causal_skips_key_blocks_above_the_diagonal(exercise):
    """128 queries and keys in blocks of 32: query block i needs key blocks 0..i only, so
    key block j is visited by 4 − j query blocks: fewer and fewer as j grows. Without
    skipping every key block is visited 4 times (counted as reads of K's rows)."""
    reads = _key_block_reads(exercise, is_causal=True)
    assert all(reads), f"operations reading each key block of K: {reads}; every key block is needed by some query"
    assert all(a > b for a, b in zip(reads, reads[1:])), (
        f"operations reading key blocks 0..3 of K: {reads}, but a causal run must skip the key blocks "
        "entirely above the diagonal (key block j is needed by query blocks j..3 only)")


def test_causal_never_reads_keys_past_the_last_query(exercise):
    """40 queries, 300 keys, causal: keys ≥ 40 are masked for every query, and the key
    blocks past the last query block must never be read. Their values hold NaN: a loop
    that reads them and masks afterwards returns NaN (0 · NaN = NaN in P V)."""
    q = torch.randn(1, 2, 40, 16)
    k, v = torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16)
    v[:, :, 64:] = float("nan")                   # past the block of keys 32..63 (block_n = 32)
    out, _ = exercise.tiled_attention_forward(q, k, v, is_causal=True, block_m=16, block_n=32)
    assert torch.isfinite(out).all(), "the loop visited key blocks that lie entirely above the diagonal"
    assert_close(out, reference_attention(q, k[:, :, :40], v[:, :, :40], is_causal=True))


def test_float64_inputs_keep_float64(exercise):
    q, k, v = (torch.randn(1, 1, 45, 8, dtype=torch.float64) for _ in range(3))
    out, lse = exercise.tiled_attention_forward(q, k, v, is_causal=True, block_m=16, block_n=16)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert_close(out, reference_attention(q, k, v, is_causal=True), dtype=torch.float64)
