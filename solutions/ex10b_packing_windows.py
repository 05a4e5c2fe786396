"""Exercise 10b, reference answer: packing offsets and a sliding window's key tiles."""

import torch


def cu_seqlens(lengths: list[int]) -> torch.Tensor:
    """Offsets of a packed batch: [0, n_0, n_0 + n_1, …]."""
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32)


def window_key_tiles(first_query: int, last_query: int, q_len: int, k_len: int, left: int, right: int,
                     block_n: int) -> list[int]:
    """The key tiles a program must visit for query rows first_query..last_query."""
    shift = k_len - q_len
    lo = 0 if left < 0 else max(0, first_query + shift - left)              # first key any row sees
    hi = k_len if right < 0 else min(k_len, last_query + shift + right + 1)  # one past the last
    if hi <= lo:
        return []
    return list(range(lo // block_n * block_n, hi, block_n))
