"""How many tiles this process has given Triton's interpreter, and the one notice about them.

Someone who did not come to read the kernels (a model's CPU run, a client library such as RL4CO
with ``sdpa_fn=flashlab.attention``) should learn why each call takes seconds, and what to switch:
after `INTERPRETER_NOTICE_TILES` interpreted forward tiles in one process, one `InterpreterWarning`
says so. Each of the course's notebooks interprets at most 760; RL4CO's TSP20 policy, batch 64,
passes it in its fourth call.

A call is counted where its kernels run, once: `flashlab.attention` counts its eager calls, and
the custom ops of `flashlab.api.ops` count the calls that reach the kernels through them (a compiled or
exported graph's, run later). Nothing is counted while torch.compile traces: the count is state
outside the graph, and a graph that read it would be guarded on its value and recompiled at every
call (then, after eight, run eagerly, or with ``fullgraph=True`` raise).
"""

from __future__ import annotations

import math
import warnings

INTERPRETER_BLOCK = 32           # the interpreted kernels' tile (autotune.INTERPRETER's), 32 × 32
INTERPRETER_NOTICE_TILES = 2048
_interpreted_tiles = 0           # forward tiles this process has given the interpreter so far
_told_of_pytorch_path = False    # whether this process has been told a CPU call left the kernels


class InterpreterWarning(UserWarning):
    """flashlab.attention has run many tiles in Triton's interpreter on a CPU (said once a process)."""


def band_tiles(n_q: int, n_k: int, block: int, band) -> int:
    """(query block, key block) tiles a call visits per head: all of them, or with a window
    (`flashlab.reference.naive.window_band`) those its band touches, as the kernels' loops bound them."""
    n_blocks_k = math.ceil(n_k / block)
    if band is None:
        return math.ceil(n_q / block) * n_blocks_k
    band_lo, band_hi = band
    if band_lo > band_hi:
        return 0
    tiles = 0
    for first in range(0, n_q, block):
        key_first, key_end = max(0, first + band_lo), min(n_k, min(first + block, n_q) - 1 + band_hi + 1)
        tiles += max(0, math.ceil(key_end / block) - key_first // block) if key_first < key_end else 0
    return tiles


def interpreter_tiles(q, k, band) -> int:
    """32 × 32 tiles the interpreted forward visits, all heads of all batch elements of q (…, H, Nq, D)."""
    batch_heads = q.numel() // (q.shape[-2] * q.shape[-1])
    return batch_heads * band_tiles(q.shape[-2], k.shape[-2], INTERPRETER_BLOCK, band)


def count_interpreted(tiles: int, stacklevel: int = 3) -> None:
    """Add one call's forward tiles to the process's count; the call that passes
    `INTERPRETER_NOTICE_TILES` warns, at the frame ``stacklevel`` up (the caller's line)."""
    global _interpreted_tiles
    if type(tiles) is not int:          # a symbolic count (torch.export with dynamic shapes) is no call run:
        return                          # kept, it would outlive the trace and break the next one
    before, _interpreted_tiles = _interpreted_tiles, _interpreted_tiles + tiles
    if before < INTERPRETER_NOTICE_TILES <= _interpreted_tiles:
        warnings.warn(
            f"flashlab.attention has now run {_interpreted_tiles:,} tiles of its Triton kernels in Triton's "
            "interpreter on the CPU, milliseconds of Python each: hundreds of times slower than SDPA on the same "
            "CPU. That is how the course shows the kernels without a GPU; to run a model on a CPU at PyTorch's "
            "speed, set FLASHLAB_CPU_KERNELS=0 (the PyTorch path: the same results within rounding, for masks "
            "without NaN or +inf). Said once.",
            InterpreterWarning, stacklevel=stacklevel)


def note_pytorch_path(tiles: int, limit: int, stacklevel: int = 3) -> None:
    """A CPU call over the interpreter's tile limit takes the PyTorch path instead of the kernels:
    said once a process (`InterpreterWarning`), so that someone timing "the kernel" on a CPU learns
    they timed other code."""
    global _told_of_pytorch_path
    if _told_of_pytorch_path or type(tiles) is not int:
        return
    _told_of_pytorch_path = True
    warnings.warn(
        f"flashlab.attention: this CPU call has {tiles:,} tiles of 32 × 32, more than the {limit:,} the "
        "interpreted Triton kernels take on a CPU, so it ran flashlab's PyTorch path (tiled attention in plain "
        "PyTorch), not the kernels. Timings of such calls are not the kernels'; run the kernels at full size on a "
        "GPU. Said once.", InterpreterWarning, stacklevel=stacklevel)
