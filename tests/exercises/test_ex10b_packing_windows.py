"""Tests for exercise 10b: cu_seqlens offsets, and a window's key tiles against brute force."""

import random
import sys

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
        assert tile in want
        assert got == want, (
            f"rows {first}..{last}, q_len = k_len = {k_len}, window=({left}, {right}), block_n={block_n}: "
            f"got {got}, want {want}. " + _which_side_differs(got, want, first, last, k_len, left, right, block_n,
                                                              f"the last key seen is {tile}, the first of tile {tile}"))


def _which_side_differs(got, want, first, last, k_len, left, right, block_n, why_end="") -> str:
    """Where ``got`` leaves ``want`` (tile alignment, start or end of the range), with the rule for
    that side (q_len = k_len, so shift = 0)."""
    first_key = "0 (left = −1: unbounded)" if left < 0 else f"max(0, {first} − {left}) = {max(0, first - left)}"
    last_key = (f"{k_len} − 1 (right = −1: unbounded)" if right < 0
                else f"min({k_len} − 1, {last} + {right}) = {min(k_len - 1, last + right)}")
    start = (f"The start differs: the first tile is the one holding the first key any row sees, {first_key}, "
             f"rounded down to a multiple of block_n = {block_n}: {want[0] if want else None}.")
    end = (f"The end differs: the last tile is the one holding the last key any row sees, {last_key}"
           + (f" ({why_end})" if why_end else "")
           + "; as an exclusive end that is last key + 1, so a last key that opens a tile keeps its tile.")
    misaligned = [t for t in got if t % block_n]
    if misaligned:
        return (f"{misaligned} are not tile starts (multiples of block_n = {block_n}). " + start
                + " The tiles then follow every block_n keys.")
    if not got or not want:
        return f"{start} {end}"
    sides = [text for differs, text in ((got[0] != want[0], start), (got[-1] != want[-1], end)) if differs]
    return " ".join(sides) or f"Start and end agree; the tiles between them are every block_n = {block_n} keys."


def test_a_sliding_window_visits_a_constant_number_of_tiles(exercise):
    """The point of tile skipping: with a window of 256 keys the last query block of a 64k
    sequence visits a handful of tiles, not all 1024."""
    tiles = exercise.window_key_tiles(65536 - 64, 65535, 65536, 65536, 256, 0, 64)
    assert tiles == list(range(65536 - 64 - 256, 65536, 64))


class _TooMuchWork(BaseException):
    """Raised into the exercise when it has run more Python steps than an O(1) answer needs (a
    BaseException, so that an ``except Exception`` in the exercise does not swallow it)."""


def _call_with_step_budget(fn, budget):
    """``fn()``, stopped with _TooMuchWork after ``budget`` Python steps (lines, calls, returns).
    Counting steps, not seconds, fails a scan at once and the same way on any machine."""
    steps = 0

    def count(frame, event, arg):
        nonlocal steps
        steps += 1
        if steps > budget:
            raise _TooMuchWork
        return count
    previous = sys.gettrace()
    sys.settrace(count)
    try:
        return fn()
    finally:
        sys.settrace(previous)


def test_tiles_come_from_the_window_bounds_not_from_a_scan(exercise):
    """The docstring asks for O(1) arithmetic: a kernel's loop bounds cannot test every key. In a
    sequence of 2**50 tokens a scan over the keys (or the tiles) cannot finish; it is stopped after
    100,000 Python steps, which an answer from the bounds (about 10 lines) never comes near."""
    n, budget = 2**50, 100_000
    try:
        tiles = _call_with_step_budget(lambda: exercise.window_key_tiles(n - 64, n - 1, n, n, 256, 0, 64), budget)
    except _TooMuchWork:
        pytest.fail(f"window_key_tiles(rows {n - 64}..{n - 1} of q_len = k_len = 2**50, window=(256, 0), block_n=64) "
                    f"was stopped after {budget:,} Python steps: it loops over the keys or the tiles, whose number "
                    f"grows with the sequence (2**50 here), while the answer is 6 tiles. Compute the first and the "
                    f"last key the rows can see from the window's bounds (with shift = k_len − q_len), round the "
                    f"first down to a tile start, and list the tiles between: the kernel's loop bounds, notebook 10")
    except NotImplementedError:
        raise                                       # a stub: "not started", not a failure
    except (RuntimeError, MemoryError) as e:        # e.g. torch.arange(k_len): no memory for 2**50 keys
        pytest.fail(f"window_key_tiles with q_len = k_len = 2**50 raised {type(e).__name__} ({str(e)[:100]}): a "
                    f"tensor of every key cannot be allocated. Compute the tiles from the window's bounds "
                    f"in O(1) arithmetic instead of testing the keys")
    assert list(tiles) == list(range(n - 64 - 256, n, 64))
