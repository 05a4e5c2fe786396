"""Every environment switch flashlab reads, in one place.

Each is read on every call (a test, a notebook or a benchmark can set one and see it take
effect at once), and none is ever set by the package.

| variable | default | effect |
|---|---|---|
| ``FLASHLAB_CPU_KERNELS`` | 1 | 0: CPU tensors take the PyTorch paths, never the interpreted kernels |
| ``FLASHLAB_SMALL_PATH`` | 1 | 0: sequences that fit one key tile take the dense kernels too |
| ``FLASHLAB_HOPPER`` | 1 | 0: an sm_90 GPU takes the dense kernels instead of the Hopper ones |
| ``FLASHLAB_GLUON`` | see `flashlab.launch.gluon` | 1: an sm_90 GPU's forward takes the Gluon kernel where it applies |
| ``FLASHLAB_DIRECT_LAUNCH`` | 1 | 0: every launch goes through Triton's own ``JITFunction.run`` |
| ``FLASHLAB_MASK_ROW_SHARED`` | 1 | 0: a key-padding mask is loaded per query; ``all``: shared at every tile |
| ``FLASHLAB_AUTOTUNE`` | 1 | 0: every shape runs its default tiles, nothing is timed |
| ``FLASHLAB_AUTOTUNE_CACHE`` | ``~/.cache/flashlab/autotune.json`` | the tuner's cache file; empty: memory only |
| ``FLASHLAB_AUTOTUNE_SHIPPED`` | 1 | 0: ignore the decisions shipped for the course's GPUs |
| ``FLASHLAB_RESULTS_DIR`` | the clone's ``results/`` | where the recorded GPU results are read from |
| ``TRITON_INTERPRET`` | unset | Triton's own: every kernel defined after it is set runs interpreted |
"""

from __future__ import annotations

import os
from pathlib import Path


def _on(name: str, default: str = "1") -> bool:
    return os.environ.get(name, default) != "0"


def cpu_kernels() -> bool:
    return _on("FLASHLAB_CPU_KERNELS")


def small_path() -> bool:
    return _on("FLASHLAB_SMALL_PATH")


def hopper(default: bool = True) -> bool:
    return _on("FLASHLAB_HOPPER", "1" if default else "0")


def gluon(default: bool = False) -> bool:
    return _on("FLASHLAB_GLUON", "1" if default else "0")


def direct_launch() -> bool:
    return _on("FLASHLAB_DIRECT_LAUNCH")


def mask_row_shared() -> str:
    """"1" (the default rule), "0" (never) or "all" (at every tile)."""
    return os.environ.get("FLASHLAB_MASK_ROW_SHARED", "1")


def autotune() -> bool:
    return _on("FLASHLAB_AUTOTUNE")


def autotune_cache(default: str) -> str | None:
    """The tuner's cache file: ``default`` unless set; None (memory only) when set empty."""
    path = os.environ.get("FLASHLAB_AUTOTUNE_CACHE", default)
    return path or None


def autotune_shipped() -> bool:
    return _on("FLASHLAB_AUTOTUNE_SHIPPED")


def results_dir(default: Path) -> Path:
    return Path(os.environ.get("FLASHLAB_RESULTS_DIR", default))


def interpreting_everything() -> bool:
    """True if ``TRITON_INTERPRET`` is set: Triton then interprets every kernel it defines."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
