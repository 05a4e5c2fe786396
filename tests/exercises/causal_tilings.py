"""Block sizes at which the causal diagonal cuts tiles at different offsets, shared by the tests of
ex03b (tiled forward) and ex04 (tiled backward): a loop that decides what to skip from a query
block's first row, or from equal block sizes, passes square tilings and fails these."""

import torch

# (Nq, Nk, block_m, block_n), causal: where the diagonal cuts the tiles
CAUSAL_TILINGS = [
    (40, 40, 16, 8),     # block_n < block_m: the diagonal crosses two key tiles of every query block
    (40, 40, 12, 16),    # key tiles start in the middle of query blocks
    (30, 30, 8, 7),      # a key tile starts on a query block's last row (one entry on the diagonal)
    (37, 23, 12, 11),    # the same with Nq > Nk
    (23, 37, 12, 11),    # and with Nq < Nk
    (21, 30, 8, 10),     # the last query block is cut short (5 rows) and a key tile starts on its last row
    (33, 33, 16, 16),    # equal blocks: a 1-row last query block whose only visible tile is on the diagonal
]


def differing_rows(got: torch.Tensor, want: torch.Tensor) -> list[int]:
    """Row indices (dimension −2) where ``got`` is not within 1e-9 of the float64 ``want`` in any
    batch or head (NaN counts as different): what the causal-tiling messages name."""
    close = torch.isclose(got, want.to(got.dtype), rtol=1e-9, atol=1e-9 * want.abs().max().item())
    return (~close).any(-1).flatten(0, -2).any(0).nonzero().flatten().tolist()
