"""An ``attn_mask`` as the kernels read it: through its strides, never expanded in memory.

A mask broadcastable to (B, H, Nq, Nk) is viewed at that shape with stride 0 along its broadcast
dimensions (`mask_args`), so a (B, 1, 1, Nk) key-padding mask costs one row per batch entry, and
a boolean mask is read as uint8 (the same bytes). A key-padding mask, stride 0 over the queries,
can further be loaded as one row per key tile that every query shares (`row_shared`) instead of
one copy per query.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import switches


class MaskArgs(NamedTuple):
    """The mask for a launch: ``tensor`` (any pointer when there is none), its four strides,
    whether there is one, and whether it is boolean (True takes part) rather than additive."""

    tensor: torch.Tensor
    strides: tuple[int, int, int, int]
    present: bool
    is_bool: bool

    @property
    def additive(self) -> bool:
        return self.present and not self.is_bool


def mask_args(attn_mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> MaskArgs:
    """``attn_mask`` expanded (stride 0, no copy) to (B, H, Nq, Nk) of (B, H, N, D) q and k."""
    if attn_mask is None:
        return MaskArgs(q, (0, 0, 0, 0), False, False)          # any pointer: HAS_MASK=False never reads it
    B, H, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    mask = attn_mask.expand(B, H, n_q, n_k)
    is_bool = attn_mask.dtype == torch.bool
    if is_bool:
        mask = mask.view(torch.uint8)        # same bytes; Triton reads uint8 more portably than i1
    return MaskArgs(mask, mask.stride(), True, is_bool)


def row_shared(mask: MaskArgs, small: bool = False, key_tile: int = 0) -> bool:
    """Whether a kernel loads the mask as one row that every query shares (`tile.mask_tile_ptrs`):
    a mask with stride 0 over the queries (key padding) instead of BLOCK_M copies of that row.
    The dense kernels do by default; the small path's kernels (``small``, one tile of ``key_tile``
    keys) when that tile holds at most 64 keys, where the shared row measured as fast or faster
    (the record of the small-path table has both). ``FLASHLAB_MASK_ROW_SHARED=all`` takes it at
    every tile, ``=0`` nowhere (the copies' load)."""
    if not (mask.present and mask.strides[2] == 0):
        return False
    switch = switches.mask_row_shared()
    if switch == "0":
        return False
    return not small or switch == "all" or key_tile <= 64
