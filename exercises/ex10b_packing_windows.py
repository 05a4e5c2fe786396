"""Exercise 10b: packing offsets and a sliding window's key tiles (notebook 10_inference_packing).

A packed batch stores the tokens of all sequences back to back; ``cu_seqlens`` says where each
starts. A sliding-window kernel visits, for a block of query rows, only the key tiles that
hold a key some of those rows can see.

Window convention (FlashAttention's): in a sequence of Lq queries and Lk keys, with
shift = Lk − Lq, query i sees key j iff  i + shift − left ≤ j ≤ i + shift + right  and
0 ≤ j < Lk. ``left`` or ``right`` = −1 means unbounded on that side.

Test: ``make test-ex EX=10b``
"""

import torch


def cu_seqlens(lengths: list[int]) -> torch.Tensor:
    """Offsets of a packed batch: ``[0, n_0, n_0 + n_1, …, Σ n]``.

    Args:
        lengths: the sequence lengths (each ≥ 0; may be empty).
    Returns:
        int32 tensor of ``len(lengths) + 1`` entries (``[0]`` for no sequence).
    """
    raise NotImplementedError


def window_key_tiles(first_query: int, last_query: int, q_len: int, k_len: int, left: int, right: int,
                     block_n: int) -> list[int]:
    """The key tiles a program must visit for query rows ``first_query..last_query`` (inclusive).

    Key tile t holds keys t·block_n .. (t+1)·block_n − 1. Return the start key (t·block_n) of
    every tile that holds at least one key seen by at least one of the rows, in increasing
    order (an empty list if the rows see no key). Compute it from the window's bounds in
    O(1) arithmetic (the kernel's loop bounds), not by testing every (query, key) pair or
    every tile: a test calls it on a sequence of 2**50 tokens, where only the bounds finish.
    """
    raise NotImplementedError
