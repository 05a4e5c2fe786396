"""Instruments for tiled runs: count HBM traffic tile by tile, record the online-softmax
state at every step, and find the largest tensor any operation created."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from flashlab.reference.tiled import TileObserver


class TrafficCounter(TileObserver):
    """Counts the bytes a tiled run loads from and stores to HBM, per tensor name."""

    def __init__(self):
        self.bytes_read: dict[str, int] = defaultdict(int)
        self.bytes_written: dict[str, int] = defaultdict(int)

    def read(self, name, tile):
        self.bytes_read[name] += tile.numel() * tile.element_size()

    def write(self, name, tile):
        self.bytes_written[name] += tile.numel() * tile.element_size()

    @property
    def total(self) -> int:
        """All bytes moved: reads plus writes."""
        return sum(self.bytes_read.values()) + sum(self.bytes_written.values())


class TileRecorder(TileObserver):
    """Keeps a copy of the state after every forward tile step, for the tile stepper:
    the block indices, the running max m, running sum l and the unnormalised output."""

    def __init__(self):
        self.steps: list[dict] = []

    def tile(self, **state):
        self.steps.append({key: value.detach().clone() if isinstance(value, torch.Tensor) else value
                           for key, value in state.items()})


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (in elements) that any PyTorch operation returned
    while the mode was active; views count as the size of their view."""

    def __init__(self):
        super().__init__()
        self.numel = 0
        self.shape: tuple[int, ...] = ()
        self.op = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        for t in outputs:
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.shape, self.op = t.numel(), tuple(t.shape), str(func)
        return result
