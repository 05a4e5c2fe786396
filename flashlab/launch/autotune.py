"""Choosing the kernels' block sizes: candidate configurations per GPU generation, and an
autotuner that times them on the first call of each kind of shape and keeps the fastest.

A configuration is (BLOCK_M, BLOCK_N, num_warps, num_stages):
    BLOCK_M × BLOCK_N   the score tile one program computes per step (queries × keys);
    num_warps           threads per program / 32;
    num_stages          how many K/V (or Q/dO) tiles are in flight at once: Triton's
                        software pipeline prefetches stage s+1 while stage s computes.
Bigger tiles reuse each loaded byte more (fewer trips to HBM per FLOP) but need more
registers and shared memory; the best point depends on the GPU, D, causal and N, so it
is measured, not guessed. What the tuner picks for which shapes on an H200 is recorded in
``results/h200/attention.json`` under "autotune".

    forward   one program per query block (BLOCK_M queries), streaming key blocks of BLOCK_N
    dkdv      one program per key block (BLOCK_N keys), streaming query blocks of BLOCK_M
    dq        one program per query block (BLOCK_M queries), streaming key blocks of BLOCK_N

Each list is sized for the GPU and the element size: a configuration whose tiles do not fit
in the GPU's shared memory (`shared_memory_bytes`, e.g. fp32 at D = 128 needs twice what
bf16 does) is shrunk until it does, so the default compiles with tuning off too.

Under Triton's interpreter (CPU) there is one small configuration and no tuning: timing
the interpreter says nothing about a GPU. Set FLASHLAB_AUTOTUNE=0 to use each list's first
(default) configuration on a GPU too. Where a decision comes from, first hit wins:
  1. this process's memory;
  2. ~/.cache/flashlab/autotune.json (FLASHLAB_AUTOTUNE_CACHE sets another file, "" none),
     per GPU model, Triton version and kernel source, shared by every process on the machine;
  3. the decisions shipped with the package for the course's GPUs (flashlab/tuned/), used
     when the shipped configuration is still a candidate and, checked once against the
     default's outputs, agrees with it;
  4. tuning now (10-60 s per new shape bucket on the first call; a warning says so once and
     how to tune ahead: ``python -m flashlab tune``, `flashlab.api.pretune.pretune`).
The choice itself is `decide`, a pure function of the measurements (exercise 07).
Inside a CUDA graph capture nothing is timed or tried: a decision already made (memory, the
cache file) or the default is launched (`capturing`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import warnings
from dataclasses import dataclass, replace
from typing import NamedTuple

from . import (
    autotune_cache,
    switches,  # noqa: I001
)


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # dK/dV only: whether unmasked tiles take the unchecked fast path. Compiling both paths
    # into one kernel costs registers, and at D = 128 the kernel already spills
    # (results/h200/kernel-resources.json), so the tuner tries it both ways.
    fast_path: bool = True

    def kwargs(self) -> dict:
        """As the kernels' launch takes them (FAST_PATH is added by the dK/dV launch)."""
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "num_warps": self.num_warps,
                "num_stages": self.num_stages}

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}" + ("" if self.fast_path else
                                                                                        " checked")


KERNELS = ("forward", "dkdv", "dq")
INTERPRETER = Config(32, 32, 4, 1)   # the interpreter's cost grows with programs × tile work: small tiles
# Exact fp32 products (input_precision "ieee") run tl.dot on the CUDA cores as unrolled FMAs: the
# larger the tile, the longer the compilation and the more registers spill. Compiled ahead of time
# for sm_90 on a CPU (Triton 3.9, D = 128): forward 128x64 w8 took 38 s with 8 KB of spill stack
# per thread; 32x32 w8 took 4 s and spilled 48 B; dK/dV 32x32 w8 16 s and none (D = 256: 26 s and
# 1.2 KB, against 89 s and 11 KB with 4 warps). So exact fp32 takes this one configuration, untuned.
EXACT_FP32 = Config(32, 32, 8, 1)

# Hopper (H100/H200, sm_90): 228 KB shared memory per SM, so 3-4 pipeline stages of
# 128-wide tiles fit. Each list starts with the configuration measured best on an H200 before
# autotuning existed (the default when tuning is off). dK/dV keeps BLOCK_M ≥ BLOCK_N when
# pipelined: BLOCK_M < BLOCK_N with 2 stages gave dK errors of 1-9% on an H200 with Triton
# 3.6 (a one-off probe, since removed). tests/api/test_attention.py checks every candidate on a GPU.
#
# D ≤ 32 (routing models: width 128 over 8 heads is D = 16): a tile row is 32-64 bytes, so
# the 128 × 128 tiles that cost too many registers at D = 128 fit easily, and with little work
# per tile fewer, larger programs amortise each program's fixed cost. The defaults stay the
# D = 64 defaults (compiled and checked at D = 16 and 32 by the GPU test of every candidate);
# the larger tiles follow. Sequences short enough for one tile take flashlab.launch.small instead.
_HOPPER = {
    "forward": {32: [Config(128, 64, 4, 3), Config(128, 128, 4, 3), Config(128, 128, 8, 3), Config(64, 64, 4, 3),
                     Config(128, 32, 4, 4)],
                64: [Config(128, 64, 4, 3), Config(128, 128, 8, 3), Config(128, 64, 4, 4), Config(128, 128, 4, 3),
                     Config(64, 64, 4, 4)],
                128: [Config(128, 64, 8, 3), Config(128, 128, 8, 3), Config(128, 64, 4, 3), Config(128, 32, 4, 3),
                      Config(64, 64, 4, 3)],
                256: [Config(64, 32, 4, 2), Config(64, 64, 4, 2), Config(128, 32, 8, 2), Config(64, 64, 8, 2)]},
    "dkdv": {32: [Config(64, 64, 4, 2), Config(128, 64, 4, 2), Config(128, 128, 8, 2), Config(64, 64, 4, 3),
                  Config(32, 32, 4, 2)],
             128: [Config(64, 64, 4, 2), Config(64, 64, 4, 2, fast_path=False), Config(64, 64, 8, 2),
                   Config(64, 64, 4, 3), Config(128, 128, 8, 2), Config(128, 128, 8, 1),
                   # no register spills at D = 128 when compiled for sm_90 (the kernel-resources-aot suite;
                   # 64x64 w4 spills 376-648 bytes a thread); not yet timed on a GPU
                   Config(32, 32, 4, 2), Config(128, 32, 8, 2), Config(64, 32, 4, 3, fast_path=False)],
             256: [Config(32, 32, 4, 1), Config(64, 64, 4, 1), Config(32, 32, 4, 2)]},
    "dq": {32: [Config(64, 64, 4, 2), Config(128, 64, 4, 2), Config(128, 128, 8, 2), Config(64, 64, 4, 3)],
           128: [Config(64, 64, 4, 2), Config(128, 64, 8, 2), Config(64, 64, 4, 3), Config(128, 128, 8, 2)],
           256: [Config(32, 32, 4, 1), Config(64, 32, 4, 1), Config(64, 64, 4, 1)]},
}
# Ampere and Ada (sm_80-89: A100 164 KB, RTX 30/40 99 KB of shared memory per SM): the
# FlashAttention-2 paper's shapes with fewer stages. Not measured here (no such GPU):
# sane defaults that the tuner narrows down on the reader's card.
_AMPERE = {
    "forward": {32: [Config(128, 64, 4, 2), Config(128, 128, 8, 2), Config(64, 64, 4, 2)],
                64: [Config(128, 64, 4, 2), Config(64, 64, 4, 2), Config(128, 32, 4, 2)],
                128: [Config(128, 32, 4, 2), Config(64, 64, 4, 2), Config(128, 64, 8, 2)],
                256: [Config(64, 32, 4, 1), Config(32, 32, 4, 1)]},
    "dkdv": {32: [Config(64, 64, 4, 1), Config(128, 64, 4, 2), Config(64, 64, 8, 2)],
             128: [Config(64, 64, 4, 1), Config(32, 32, 4, 1), Config(64, 64, 8, 2)],
             256: [Config(32, 32, 4, 1)]},
    "dq": {32: [Config(64, 64, 4, 1), Config(128, 64, 4, 2), Config(64, 64, 8, 2)],
           128: [Config(64, 64, 4, 1), Config(32, 32, 4, 1), Config(64, 64, 8, 2)],
           256: [Config(32, 32, 4, 1)]},
}


def generation(capability: tuple[int, int] | None) -> str:
    """'interpreter' (no GPU), 'hopper' or 'ampere' (the rest: Ampere, Ada, consumer Blackwell).
    Data-centre Blackwell (sm_100) gets the Hopper list: the same 228 KB of shared memory per SM
    (unmeasured: the course's GPU is an H200)."""
    if capability is None:
        return "interpreter"
    return "hopper" if capability[0] in (9, 10) else "ampere"


def candidates(kernel: str, head_dim: int, capability: tuple[int, int] | None,
               element_size: int | None = None, shared_memory: int | None = None) -> list[Config]:
    """The configurations the tuner tries for ``kernel`` at this head dimension, default first.
    ``capability`` is torch.cuda.get_device_capability(), or None under the interpreter.
    With ``element_size`` (bytes per q/k/v element: 2 for bf16/fp16, 4 for fp32) the list is
    sized to fit ``shared_memory`` bytes per block (default: the capability's, from
    SHARED_MEMORY_PER_BLOCK); without it, as listed (sized for 2-byte elements). The tuner
    sizes every list itself, from the call's dtype and device."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    if generation(capability) == "interpreter":
        return [INTERPRETER]
    table = (_HOPPER if generation(capability) == "hopper" else _AMPERE)[kernel]
    bound = next(d for d in sorted(table) if head_dim <= d or d == max(table))
    configs = list(table[bound])
    if element_size is None:
        return configs
    limit = shared_memory if shared_memory is not None else shared_memory_for(capability)
    return fit_shared_memory(kernel, configs, head_dim, element_size, limit)


# -- shared memory: what a configuration needs, what the GPU has ------------------------------

# Shared memory one block may use (bytes, the opt-in maximum) per compute capability, for a
# torch without cudaDevAttrMaxSharedMemoryPerBlockOptin in its device properties.
SHARED_MEMORY_PER_BLOCK = {(7, 0): 98304, (7, 5): 65536, (8, 0): 166912, (8, 6): 101376, (8, 7): 166912,
                           (8, 9): 101376, (9, 0): 232448, (10, 0): 232448, (12, 0): 101376}


def shared_memory_for(capability: tuple[int, int]) -> int:
    """The table's limit for ``capability``; an unknown one gets the smallest of its major
    version (or of all), so sizing errs toward configurations that fit."""
    if capability in SHARED_MEMORY_PER_BLOCK:
        return SHARED_MEMORY_PER_BLOCK[capability]
    same_major = [v for (major, _), v in SHARED_MEMORY_PER_BLOCK.items() if major == capability[0]]
    return min(same_major or SHARED_MEMORY_PER_BLOCK.values())


@functools.cache
def shared_memory_limit(device) -> int:
    """Shared memory per block on this CUDA device, as Triton checks it ("Hardware limit")."""
    import torch
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", None) or shared_memory_for((props.major, props.minor))


def _padded_head_dim(head_dim: int) -> int:
    """BLOCK_D as the launcher computes it: D padded to a power of two ≥ 16."""
    return max(16, 1 << (int(head_dim) - 1).bit_length())


def shared_memory_bytes(kernel: str, config: Config, head_dim: int, element_size: int) -> int:
    """Shared memory a kernel compiled with ``config`` needs, in bytes. Triton stages in shared
    memory every tile that feeds a tl.dot; a tile loaded inside the loop gets one buffer per
    pipeline stage (num_stages), a tile loaded once gets one. With e bytes per element and
    d = BLOCK_D:
        forward  Q once, K and V per stage:              e·d·(BLOCK_M + 2·S·BLOCK_N)
        dq       Q and dO once, K and V per stage:       e·d·(2·BLOCK_M + 2·S·BLOCK_N)
        dkdv     K and V once, S + 1 tiles of Q/dO, the Pᵀ/dSᵀ operand, and 1 KiB for the
                 pipelined L and Δ rows when S > 1:      e·(d·(2·BLOCK_N + (S+1)·BLOCK_M) + BLOCK_M·BLOCK_N)
    Fitted to the compiled kernels' own figures: all 48 forward/dkdv/dq rows of
    results/h200/kernel-resources.json (bf16, D = 64 and 128, Triton 3.6) exactly, and the
    fp32 failure "Required: 262144" (forward 128x64 s3 at D = 128). Float masks' tiles are not
    counted (the tuner skips a candidate that still fails to compile)."""
    e, m, n, s, d = element_size, config.block_m, config.block_n, config.num_stages, _padded_head_dim(head_dim)
    if kernel == "forward":
        return e * d * (m + 2 * s * n)
    if kernel == "dq":
        return e * d * (2 * m + 2 * s * n)
    if kernel == "dkdv":
        return e * (d * (2 * n + (s + 1) * m) + m * n) + (1024 if s > 1 else 0)
    raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")


def fit_shared_memory(kernel: str, configs: list[Config], head_dim: int, element_size: int,
                      limit: int) -> list[Config]:
    """``configs`` with each one that needs more than ``limit`` bytes shrunk until it fits:
    fewer pipeline stages first (the cheapest loss), then the larger tile side halved (down
    to 16). Order kept, duplicates dropped, so the default stays first. Halving only once
    unpipelined keeps dK/dV's rule (BLOCK_M ≥ BLOCK_N when pipelined)."""
    fitted = []
    for config in configs:
        while shared_memory_bytes(kernel, config, head_dim, element_size) > limit:
            if config.num_stages > 1:
                config = replace(config, num_stages=config.num_stages - 1)
            elif max(config.block_m, config.block_n) > 16:
                if config.block_m > config.block_n:
                    config = replace(config, block_m=config.block_m // 2)
                else:
                    config = replace(config, block_n=config.block_n // 2)
            else:
                break                   # the smallest tile: let the compiler say what it needs
        fitted.append(config)
    return list(dict.fromkeys(fitted))


_forced: dict[str, Config] = {}


@contextlib.contextmanager
def overriding(store: dict, kernels, configs: dict):
    """Put ``configs`` (kernel name → configuration) into ``store`` for the ``with`` block, then
    restore it; names outside ``kernels`` are refused. The mechanism behind `force` and
    `flashlab.launch.small.force`."""
    unknown = set(configs) - set(kernels)
    if unknown:
        raise ValueError(f"force: unknown kernels {sorted(unknown)}; expected some of {tuple(kernels)}")
    saved = dict(store)
    store.update(configs)
    try:
        yield
    finally:
        store.clear()
        store.update(saved)


def force(**configs: Config):
    """Run the kernels with these configurations, e.g. ``force(forward=Config(16, 32, 4, 1))``
    (tests of unusual tile shapes, and the GPU test of every candidate). While any is forced,
    calls take these (the general) kernels, not the Hopper path, which has tiles of its own, nor
    the small path (`flashlab.launch.small`), which would otherwise take every N ≤ 128."""
    return overriding(_forced, KERNELS, configs)


def forcing() -> bool:
    """Whether a `force` block is active."""
    return bool(_forced)


def enabled() -> bool:
    return switches.autotune()


def _bucket(n: int) -> int:
    """Shapes share a tuning result within a power of two (as Triton's own autotuner keys do)."""
    return 1 << max(0, int(n) - 1).bit_length()


def shape_key(kernel, q, k, is_causal, has_mask, dropout, window=False) -> tuple:
    """What a tuning result is remembered under: everything that changes the compiled kernel or
    the amount of work per program (dtype, D, masks, a sliding window, GQA group) and N, Nk,
    B·H bucketed. Built on every call, so kept cheap (no string formatting: small shapes are
    launch-bound). A window adds a last entry, "window", so keys without one (and the shipped
    decisions, stored under them) stay as they were."""
    B, H, n_q, head_dim = q.shape
    key = (kernel, q.device, q.dtype, head_dim, bool(is_causal), bool(has_mask), bool(dropout),
           H // k.shape[1], _bucket(n_q), _bucket(k.shape[2]), _bucket(B * H))
    return (*key, "window") if window else key


# -- the decision ------------------------------------------------------------------------------

class Trial(NamedTuple):
    """What running one candidate measured: its time, and the normwise relative error of its
    outputs against the reference outputs (those of the first candidate that ran)."""
    ms: float
    error: float


def decide(configs, trials: dict, tolerance: float, margin: float = 0.97):
    """The autotuner's choice, from measurements alone. Returns ``(chosen, log)``.

    ``configs``: the candidates, the default first. ``trials[config]`` is a `Trial` (or any
    ``(ms, error)`` pair) for a config that ran, or a string saying why it failed to run
    (e.g. "OutOfResources: shared memory"); a config missing from ``trials`` was not run.
      - a config that failed or was not run is skipped;
      - a config whose error exceeds ``tolerance`` (NaN included) is rejected: a compiler
        bug must never win on speed;
      - of the rest, the fastest wins, except that the default is kept unless the fastest
        takes less than ``margin`` × the default's time (timings are noisy).
    ``log`` maps every config to its time (accepted) or to the reason it was not (a string).
    Raises RuntimeError, naming every config and its reason, when none is accepted."""
    log, times = {}, {}
    for config in configs:
        trial = trials.get(config, "not run")
        if isinstance(trial, str):
            log[config] = f"failed: {trial}"
            continue
        ms, error = trial
        if not error <= tolerance:
            log[config] = f"disagrees with the reference: relative error {error:.2e} > {tolerance:.0e}"
            continue
        times[config] = log[config] = ms
    if not times:
        raise RuntimeError("no configuration ran correctly: "
                           + "; ".join(f"{config}: {reason}" for config, reason in log.items()))
    best = min(times, key=times.get)
    default = configs[0]
    if default in times and not times[best] < margin * times[default]:
        best = default
    return best, log


class Autotuner:
    """Times every candidate once per shape key and remembers the fastest (the default unless
    another is at least 3% faster); see `decide`.

    ``launch(config)`` runs the kernel with that configuration and returns its outputs; each
    candidate's outputs must agree with the reference (the first candidate's) within
    ``tolerance`` (normwise relative error, by output dtype) or it is rejected, so a
    configuration the compiler gets wrong is never chosen. Two correct bf16 configurations
    differ by at most the sum of their errors (each ≤ 2.4e-3 vs float64 on an H200); the
    wrong dK tiles above were 1-9% off."""

    TOLERANCE = {"torch.bfloat16": 6e-3, "torch.float16": 3e-3, "torch.float32": 3e-3}   # fp32: TF32 products

    # A candidate must beat the default by this factor to replace it: candidates often differ
    # by 1-3%, about the run-to-run noise of a timing on a busy GPU (measured on an H200: a
    # choice made on a 1% lead was 12% slower than the default in the benchmark that followed).
    MARGIN = 0.97

    def __init__(self, bench=None, cache_path: str | None = None, shipped: bool | None = None):
        """``cache_path``: a JSON file that keeps decisions across processes (a new process
        would otherwise re-time every shape on first use). None: FLASHLAB_AUTOTUNE_CACHE, else
        ~/.cache/flashlab/autotune.json; "" keeps decisions in memory only. ``shipped``: use
        the package's decisions for the course's GPUs (flashlab/tuned/); None: unless
        FLASHLAB_AUTOTUNE_SHIPPED=0."""
        self.bench = bench or _do_bench
        self.best: dict[tuple, Config] = {}
        self.untuned: dict[tuple, Config] = {}         # FLASHLAB_AUTOTUNE=0: the default that fits
        self.log: list[dict] = []
        if cache_path is None:
            cache_path = switches.autotune_cache(os.path.join(os.path.expanduser("~"), ".cache", "flashlab",
                                                              "autotune.json"))
        self.cache_path = cache_path
        self.shipped = shipped if shipped is not None else switches.autotune_shipped()
        self._disk: dict[str, str] | None = None      # read on first need
        self._announced = False

    def choose(self, key: tuple, configs: list[Config], launch, tune: bool = True) -> Config:
        """The configuration for ``key``. ``tune=False`` takes the first candidate that compiles,
        as with tuning off (for kernels whose every compilation is slow, e.g. exact fp32)."""
        kernel = key[0]
        if kernel in _forced:
            return _forced[kernel]
        if not enabled() or not tune:
            if key not in self.untuned:
                if capturing(key[1]):                 # no trial launches inside a CUDA graph
                    return _sized(key, configs)[0]
                self.untuned[key] = _first_that_compiles(_sized(key, configs), launch)
            return self.untuned[key]
        if key in self.best:
            return self.best[key]
        configs = _sized(key, configs)
        if len(configs) == 1:
            return configs[0]
        if capturing(key[1]):
            # Inside a CUDA graph capture every launch is recorded, not run, and timing or
            # comparing outputs would synchronise: take a decision stored on disk, else the
            # default, and remember neither (an eager call of this shape tunes as usual).
            return self._stored(key, configs) or configs[0]
        chosen = self._stored(key, configs)
        if chosen is not None:
            self.log.append({"key": _printable(key), "chosen": str(chosen), "from_cache": self.cache_path})
        else:
            chosen = self._shipped(key, configs, launch)
            if chosen is None:
                chosen = self._tune(key, configs, launch)
            self._store(key, chosen)
        self.best[key] = chosen
        return chosen

    def _tune(self, key, configs, launch) -> Config:
        """Runs every candidate, times the ones that run, and lets `decide` choose."""
        self._announce(key)
        reference, trials = None, {}
        for config in configs:
            try:
                outputs = [t.clone() for t in launch(config)]   # clone: the next launch reuses the buffers
            except Exception as exc:              # e.g. triton OutOfResources: too much shared memory
                trials[config] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
                continue
            if reference is None:
                reference = outputs
            error = max(_rel_error(a, b) for a, b in zip(outputs, reference))
            trials[config] = Trial(self.bench(lambda config=config: launch(config)), error)
        try:
            chosen, log = decide(configs, trials, self._tolerance(key), self.MARGIN)
        except RuntimeError as exc:
            raise RuntimeError(f"the {key[0]} kernel for {_printable(key)}: {exc}") from None
        self.log.append({"key": _printable(key), "chosen": str(chosen),
                         "ms": {str(c): v for c, v in log.items() if not isinstance(v, str)},
                         "rejected": {str(c): v for c, v in log.items() if isinstance(v, str)}})
        return chosen

    def _tolerance(self, key) -> float:
        return self.TOLERANCE.get(str(key[2]), 3e-3)

    def _announce(self, key) -> None:
        """Once per tuner: say that tuning is happening, what it costs, and how to avoid it."""
        if self._announced:
            return
        self._announced = True
        warnings.warn(
            f"flashlab: tuning the attention kernels for a new shape ({_printable(key)}) on "
            f"{_gpu_label(key[1])}, which has no stored decision for it: the first call of each new "
            "shape bucket (powers of two of N, Nk, B·H; dtype, D, causal, mask) takes 10-60 s while "
            "every candidate compiles and is timed; decisions are kept in "
            f"{self.cache_path or 'memory only'}. To tune ahead of training: "
            "`python -m flashlab tune --shape B,H,N,D --dtype bf16 [--causal]` or "
            "flashlab.api.pretune.pretune([...]); FLASHLAB_AUTOTUNE=0 skips tuning (default configurations).",
            RuntimeWarning, stacklevel=4)

    # -- decisions kept on disk ----------------------------------------------------------------
    # An entry of the user's cache is valid only for the same GPU model, Triton version and
    # kernel source: any of them changes what is fast, and a kernel edit could make a stored
    # choice wrong. Shipped decisions carry no source hash (every edit of the kernels would
    # void them): they are used only while still among the candidates, and checked once.

    def _disk_key(self, key: tuple) -> str:
        return " | ".join([_gpu_label(key[1]), f"triton {_triton_version()}", f"kernels {_kernel_source_hash()}",
                           shipped_key(key)])

    def _stored(self, key: tuple, configs: list[Config]) -> Config | None:
        if not self.cache_path:
            return None
        if self._disk is None:
            self._disk = autotune_cache.read_decisions(self.cache_path)
        name = self._disk.get(self._disk_key(key))
        return next((c for c in configs if str(c) == name), None)   # a dropped candidate is re-tuned

    def _store(self, key: tuple, config: Config) -> None:
        if not self.cache_path:
            return
        entry = {self._disk_key(key): str(config)}
        try:
            self._disk = autotune_cache.merge_decisions(self.cache_path, entry)
        except OSError:                               # a read-only home: keep the decision in memory
            self._disk = {**(self._disk or {}), **entry}

    def _shipped(self, key: tuple, configs: list[Config], launch) -> Config | None:
        """The package's decision for this GPU model and shape, if it is still a candidate and
        its outputs agree with the reference's (the first other candidate that runs)."""
        device = key[1]
        if not self.shipped or getattr(device, "type", None) != "cuda":
            return None
        name = autotune_cache.read_shipped(_gpu_name(device)).get(shipped_key(key))
        config = next((c for c in configs if str(c) == name), None)
        if config is None:
            return None
        try:
            outputs = [t.clone() for t in launch(config)]
        except Exception as exc:
            warnings.warn(f"flashlab: the shipped configuration {config} for {_printable(key)} failed "
                          f"({type(exc).__name__}): tuning instead", RuntimeWarning, stacklevel=4)
            return None
        checked_against = None
        for other in configs:
            if other == config:
                continue
            try:
                reference = launch(other)
            except Exception:
                continue
            error = max(_rel_error(a, b) for a, b in zip(outputs, reference))
            if not error <= self._tolerance(key):
                warnings.warn(f"flashlab: the shipped configuration {config} for {_printable(key)} disagrees "
                              f"with {other} (relative error {error:.1e}): tuning instead", RuntimeWarning,
                              stacklevel=4)
                return None
            checked_against = str(other)
            break
        self.log.append({"key": _printable(key), "chosen": str(config), "from_cache": "shipped",
                         "checked_against": checked_against})
        return config

    def report(self) -> list[dict]:
        """Every tuning decision so far: the key, the chosen config, and each candidate's time
        (or, for a decision read from the cache file or the shipped decisions, where from)."""
        return list(self.log)


def capturing(device) -> bool:
    """True while the current CUDA stream of ``device`` is being captured into a CUDA graph
    (torch.cuda.graph, make_graphed_callables): then nothing may be timed or synchronised."""
    if getattr(device, "type", None) != "cuda":
        return False
    import torch
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def shipped_key(key: tuple) -> str:
    """A shape key as text without the device: "kernel | dtype | D | causal | mask | dropout |
    group | N bucket | Nk bucket | B·H bucket" (the GPU names the file it is kept in)."""
    return " | ".join(map(str, (key[0], *key[2:])))


def _sized(key: tuple, configs: list[Config]) -> list[Config]:
    """``configs`` fitted to the shared memory of the key's GPU at the key's element size."""
    device, dtype, head_dim = key[1], key[2], key[3]
    if getattr(device, "type", None) != "cuda":
        return configs
    return fit_shared_memory(key[0], configs, head_dim, dtype.itemsize, shared_memory_limit(device))


def _first_that_compiles(configs: list[Config], launch) -> Config:
    """With tuning off: the default, or the first candidate after it that fits where the
    shared-memory estimate fell short (run once per shape key, then remembered)."""
    for config in configs[:-1]:
        try:
            launch(config)
            return config
        except Exception as exc:
            if type(exc).__name__ != "OutOfResources":
                raise
    return configs[-1]


def _printable(key: tuple) -> list:
    return [part if isinstance(part, (int, bool)) else str(part) for part in key]


def _gpu_label(device) -> str:
    return _gpu_name(device) if getattr(device, "type", None) == "cuda" else str(device)


@functools.cache
def _gpu_name(device) -> str:
    import torch
    return torch.cuda.get_device_name(device)


@functools.cache
def _triton_version() -> str:
    import triton
    return triton.__version__


@functools.cache
def _kernel_source_hash() -> str:
    """The tiled kernels' source (their module and the tile rules they share), hashed: a cached
    decision belongs to the code that was timed."""
    digest = hashlib.sha256()
    kernels = os.path.join(os.path.dirname(os.path.dirname(__file__)), "kernels")
    for name in ("tile.py", "dense.py"):
        path = os.path.join(kernels, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:12]


def _rel_error(a, b) -> float:
    """‖a − b‖ / ‖b‖ over the finite entries, on the outputs' device. (flashlab.rel_error copies
    to the CPU in float64, too slow for the outputs of every candidate, and gives NaN for the
    +inf log-sum-exp of rows with no key, which two correct configurations share.)"""
    a, b = a.float(), b.float()
    finite = a.isfinite() & b.isfinite()
    if not bool(((a == b) | finite).all()):      # inf where the default has inf is fine (empty rows' L)
        return math.inf
    a, b = a[finite], b[finite]
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _do_bench(fn) -> float:
    from .timing import time_ms  # the benchmarks' own timer: do_bench medians on a GPU
    return time_ms(fn, "cuda", warmup_ms=10, rep_ms=50)

tuner = Autotuner()
