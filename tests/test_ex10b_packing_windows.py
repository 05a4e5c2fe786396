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


def test_a_last_key_that_opens_a_tile_keeps_its_tile(exercise):
    """The last key the rows see is the first key of a tile: an exclusive end without its + 1
    stops just before that key and drops the whole tile (found only by q_len = k_len = 1 before)."""
    for _ in range(20):
        block_n = random.choice([8, 16, 32, 64])
        tile = random.randrange(1, 6) * block_n            # the tile whose first key is the last one seen
        right = random.choice([0, 1, random.randrange(0, block_n)])
        last = tile - right                                  # row `last` sees keys up to last + right = tile
        first = max(0, last - random.randrange(0, 16))
        q_len = k_len = tile + random.randrange(1, 3 * block_n)
        left = random.choice([-1, 0, random.randrange(1, 2 * block_n)])
        want = _brute_force(first, last, q_len, k_len, left, right, block_n)
        got = list(exercise.window_key_tiles(first, last, q_len, k_len, left, right, block_n))
        assert tile in want and got == want, (
            f"rows {first}..{last}, q_len = k_len = {k_len}, window=({left}, {right}), block_n={block_n}: the last key "
            f"seen is {tile}, the first of tile {tile}; got {got}, want {want}: the exclusive end is last key + 1")


def test_a_sliding_window_visits_a_constant_number_of_tiles(exercise):
    """The point of tile skipping: with a window of 256 keys the last query block of a 64k
    sequence visits a handful of tiles, not all 1024."""
    tiles = exercise.window_key_tiles(65536 - 64, 65535, 65536, 65536, 256, 0, 64)
    assert tiles == list(range(65536 - 64 - 256, 65536, 64))
