"""Tests for exercise 10b: cu_seqlens offsets, and a window's key tiles against brute force."""

import random

import pytest
import torch


def test_cu_seqlens(exercise):
    got = exercise.cu_seqlens([3, 0, 5, 1])
    assert got.dtype == torch.int32
    assert got.tolist() == [0, 3, 3, 8, 9]
    assert exercise.cu_seqlens([]).tolist() == [0]
    lengths = [random.randrange(0, 50) for _ in range(20)]
    offsets = exercise.cu_seqlens(lengths).tolist()
    assert [b - a for a, b in zip(offsets[:-1], offsets[1:])] == lengths and offsets[0] == 0


def _brute_force(first, last, q_len, k_len, left, right, block_n):
    shift = k_len - q_len
    tiles = set()
    for i in range(first, last + 1):
        for j in range(k_len):
            if (left < 0 or j >= i + shift - left) and (right < 0 or j <= i + shift + right):
                tiles.add(j // block_n * block_n)
    return sorted(tiles)


@pytest.mark.parametrize("left,right", [(4, 0), (0, 0), (10, 3), (-1, 0), (3, -1), (-1, -1), (100, 0)])
@pytest.mark.parametrize("q_len,k_len", [(64, 64), (5, 40), (40, 5), (1, 1)])
def test_window_key_tiles_match_brute_force(exercise, left, right, q_len, k_len):
    for block_m, block_n in ((16, 16), (8, 32)):
        for first in range(0, q_len, block_m):
            last = min(first + block_m, q_len) - 1
            want = _brute_force(first, last, q_len, k_len, left, right, block_n)
            got = exercise.window_key_tiles(first, last, q_len, k_len, left, right, block_n)
            assert list(got) == want, (f"rows {first}..{last}, q_len={q_len}, k_len={k_len}, window=({left}, {right}), "
                                       f"block_n={block_n}: got {list(got)}, want {want}")


def test_a_sliding_window_visits_a_constant_number_of_tiles(exercise):
    """The point of tile skipping: with a window of 256 keys the last query block of a 64k
    sequence visits a handful of tiles, not all 1024."""
    tiles = exercise.window_key_tiles(65536 - 64, 65535, 65536, 65536, 256, 0, 64)
    assert tiles == list(range(65536 - 64 - 256, 65536, 64))
